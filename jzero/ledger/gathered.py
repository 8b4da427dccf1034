"""What is gathered at once: the peak bytes of all-gather results alive at the same moment in a
compiled program's schedule.

ZeRO-3 keeps its memory promise only if a device holds a layer or two of whole parameters at a
time. The bytes at rest cannot show that, and neither can the sum of all-gather bytes: the answer
is in the schedule. A scheduled module (``compiled.as_text()``) lists each computation's
instructions in the order they run; an all-gather's result lives from the op (an async op's start)
to the last instruction that reads it or a value that aliases it (``bitcast``, ``copy``, tuples,
``get-tuple-element``, ``opt-barrier``, the async ``-done``). A loop or call adds its own peak at
the instruction that runs it; a conditional adds its largest branch.
"""

from __future__ import annotations

import re
from typing import Any

from jzero.ledger.hlo_text import Computations, _array_bytes, _callees, _computations, _Instruction, _results
from jzero.ledger.tensors import TensorEntry, tensor_entry
from jzero.memory.precision import FP32, Precision
from jzero.records import record
from jzero.sharding.partition import shard_bytes
from jzero.sharding.plan import Plan

__all__ = ["Gathered", "gathered_at_once", "gathered_peak", "gathered_total"]


@record
class Gathered:
    """What the step holds gathered at once (:func:`jzero.ledger.gathered.gathered_at_once`).

    Attributes:
      peak_bytes: the most gathered bytes live at once, per device.
      share_of_params: that over the whole parameters in the compute dtype.
      layer_bytes: one layer's gathered bytes; None without units or a scanned stack.
      layers: the peak in layers' worth.
      units: how many gathering units are in effect.
      merged: a line per group of units the loss could not split.
      prefetch: how many units ahead are gathered.
      unit_tensors: each gathering unit by name, with its tensors' paths.
      persistent: the parameters resting whole below ``zero.persist_below_bytes``.
    """

    peak_bytes: int
    share_of_params: float | None
    layer_bytes: int | None
    layers: float | None
    units: int
    merged: list[str]
    prefetch: int
    unit_tensors: dict[str, list[str]]
    persistent: list[TensorEntry]


# Ops whose result is (part of) their operand's buffer, or a tuple holding it.
_ALIASING = {"bitcast", "copy", "tuple", "get-tuple-element", "opt-barrier", "all-gather-done", "copy-start", "copy-done"}
_NAME = re.compile(r"%([\w.\-]+)")
_GATHERS = ("all-gather", "all-gather-start")


def _operands(ins: _Instruction) -> list[str]:
    """The names an instruction reads: those inside its opcode's parentheses."""
    text = ins.line.split("=", 1)[1]
    start = text.find(ins.op + "(") + len(ins.op) + 1
    depth, end = 1, start
    while end < len(text) and depth:
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        end += 1
    return _NAME.findall(text[start : end - 1])


def _gather_bytes(ins: _Instruction) -> int:
    return sum(_array_bytes(*leaf) for leaf in _results(ins, "all-gather"))


Carry = frozenset | tuple  # the gathers a value holds: a set for an array, one per element for a tuple
_GTE = re.compile(r"index=(\d+)")


def _flat(carry: Carry | None) -> frozenset:
    if carry is None:
        return frozenset()
    return carry if isinstance(carry, frozenset) else frozenset().union(*map(_flat, carry))


def _carry(ins: _Instruction, operands: list[str], carries: dict[str, Carry], index: int) -> Carry | None:
    """What an instruction's result holds of earlier gathers (None: nothing, or a new buffer)."""
    held = [carries.get(o) for o in operands]
    if ins.op == "all-gather":
        return frozenset({index})
    if ins.op == "all-gather-start":  # only its done holds the results; its other parts are the operands
        return ("start", index)
    if ins.op == "all-gather-done" and held and _is_start(held[0]):
        return frozenset({held[0][1]})
    if ins.op == "tuple":
        return tuple(_flat(h) for h in held)
    if ins.op == "get-tuple-element":
        whole = held[0] if held else None
        if whole is None or _is_start(whole):
            return None
        match = _GTE.search(ins.line.split(ins.op, 1)[1])
        if isinstance(whole, tuple) and match and int(match.group(1)) < len(whole):
            return whole[int(match.group(1))]
        return _flat(whole)
    if ins.op in _ALIASING and held:
        return held[0] if len(held) == 1 else tuple(_flat(h) for h in held)
    return None


def _peak(name: str, computations: Computations, memo: dict[str, int]) -> int:
    """The peak of one computation: its own live gathers at each instruction, plus what the
    computations that instruction runs hold at their own peak."""
    if name in memo:
        return memo[name]
    memo[name] = 0  # guards a malformed (cyclic) module
    body = computations.get(name, [])
    carries: dict[str, Carry] = {}
    sizes: dict[int, int] = {}
    last_use: dict[int, int] = {}
    for i, ins in enumerate(body):
        operands = _operands(ins)
        if ins.op in _GATHERS:
            sizes[i] = _gather_bytes(ins)
            last_use[i] = i
        if ins.op not in _ALIASING:  # a real reader: what it reads is alive up to here
            for g in frozenset().union(*(_flat(carries.get(o)) for o in operands if not _is_start(carries.get(o)))):
                last_use[g] = i
        carry = _carry(ins, operands, carries, i)
        if carry is not None:
            carries[ins.name] = carry
    if body and body[-1].line.lstrip().startswith("ROOT"):
        for g in _flat(carries.get(body[-1].name)) if not _is_start(carries.get(body[-1].name)) else ():
            last_use[g] = len(body)  # returned: alive to the end
    peak = 0
    for i, ins in enumerate(body):
        live = sum(sizes[g] for g in sizes if g <= i <= last_use[g])
        peak = max(peak, live + _nested(ins, computations, memo))
    memo[name] = peak
    return peak


def _is_start(carry: Carry | None) -> bool:
    return isinstance(carry, tuple) and carry[:1] == ("start",)


def _nested(ins: _Instruction, computations: Computations, memo: dict[str, int]) -> int:
    """What the computations an instruction runs hold at their peak: a conditional's largest
    branch, else the largest of the others (a while's body and condition do not overlap)."""
    called = [c for _, c in _callees(ins.line) if c in computations]
    return max((_peak(c, computations, memo) for c in called), default=0)


def gathered_peak(hlo_text: str) -> int:
    """The most bytes of all-gather results one device holds at any moment of the step.

    Args:
      hlo_text: ``compiled.as_text()`` of a scheduled SPMD program (CPU or GPU).

    Returns:
      Bytes per device; 0 when the program gathers nothing.
    """
    computations, entry = _computations(hlo_text)
    return _peak(entry, computations, {}) if entry else 0


def gathered_total(hlo_text: str) -> int:
    """The result bytes of every all-gather op in the program text, each counted once (a loop
    body's once): the sum the peak is a part of, equal to the ledger's all-gather ``bytes``."""
    computations, _ = _computations(hlo_text)
    return sum(_gather_bytes(ins) for body in computations.values() for ins in body if ins.op in _GATHERS)


def gathered_at_once(compiled: Any, plan: Plan, precision: Precision = FP32) -> Gathered:
    """What a compiled step holds gathered at once, against the whole parameters and one layer:
    the figures of ``jzero plan``'s "gathered at once" line, for your own loop.

    Example::

      compiled = train_step.lower(state, batch).compile()
      g = jzero.ledger.gathered_at_once(compiled, plan)
      g.peak_bytes, g.share_of_params, g.layers

    Args:
      compiled: the compiled step (``jax.jit(...).lower(...).compile()``), or its ``as_text()``.
      plan: the plan it was made for (:func:`jzero.sharding.plan.make_plan`).
      precision: the step's; the loss reads parameters in its compute dtype.

    Returns:
      A :class:`Gathered`: ``peak_bytes`` (:func:`gathered_peak`, per device); ``share_of_params``,
      that over the whole parameters in the compute dtype (model axes still split); ``layer_bytes``,
      one layer's (:meth:`jzero.sharding.plan.Plan.layer_bytes`, None without units or a scanned
      stack); ``layers``, the peak in layers' worth (None likewise); ``units``, how many gathering
      units (those in effect); ``merged``, a line per group of units the loss could not split;
      ``prefetch``; the units' tensors by name and the parameters left whole at rest for their size.
    """
    text = compiled if isinstance(compiled, str) else compiled.as_text()
    dtype = precision.compute_dtype
    peak = gathered_peak(text)
    whole = sum(shard_bytes(t.shape, dtype or t.dtype, t.replicated_spec, plan.mesh) for t in plan.tensors)
    layer = plan.layer_bytes(dtype)
    return Gathered(
        peak_bytes=peak,
        share_of_params=peak / whole if whole else None,
        layer_bytes=layer or None,
        layers=peak / layer if layer else None,
        units=len(set(plan.units.values())),
        merged=list(plan.merged_units),
        prefetch=plan.zero.prefetch,
        unit_tensors=plan.unit_tensors,
        persistent=[tensor_entry(t) for t in plan.persistent],
    )
