"""What a layer loop saves for the backward, by kind: each stacked residual of the forward loop
named by the operation that produced it, read from compiled HLO.

A differentiated scan's forward loop writes one slice per iteration into each residual stack
(:func:`jzero.ledger.hlo.forward_loop_writes`). The slice written is some operation's result: a
matmul (its op name ends ``query/dot_general``), cuDNN's attention kernel, or the layer's own input
(the loop's carry). That operation names the row.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from jzero.ledger.gathered import _operands
from jzero.ledger.hlo import (
    _OP_NAME,
    COLLECTIVES,
    _array_bytes,
    _callees,
    _computations,
    _Instruction,
    _per_example,
    _written_elements,
    forward_loop,
)

__all__ = ["SavedKind", "saved_by_kind", "saved_by_unit", "saved_unrolled"]

SavedKind = dict  # {"kind", "dtype", "shape", "layers", "bytes_per_layer"}: one residual stack

# Ops that move a value without computing a new one (a collective splits or sums what a matmul
# made): followed to the op that made it.
_PASS_THROUGH = {"bitcast", "copy", "reshape", "transpose", "convert", "dynamic-slice", *COLLECTIVES}
_CALL_WRAPPERS = re.compile(r"^(?:closed_call|checkpoint|remat\w*|jvp\(.*\)|jit\(.*\)|pjit|while|body|[\w\-]+\(.*\))$")


def saved_by_kind(hlo_text: str, batch_rows: int) -> list[SavedKind]:
    """Each residual stack the forward layer loops write, with the kind of value it holds.

    Args:
      hlo_text: ``compiled.as_text()`` of an SPMD program.
      batch_rows: the batch rows each device computes at once; a stack of activations has them as its
        second dimension (parameter slices the loop saves are left out, as in
        :func:`jzero.ledger.hlo.saved_activations`).

    Returns:
      One entry per stack: ``kind`` (``input`` for the layer's own input, else the producing op's
      name within the layer, e.g. ``mlp_in/dot_general``), ``dtype``, ``shape`` (one layer's, per
      device), ``layers`` (the loop's trip count) and ``bytes_per_layer``.
    """
    computations, _ = _computations(hlo_text)
    loops: list[list[SavedKind]] = []
    for ins in (ins for body in computations.values() for ins in body):
        found = forward_loop(ins, computations)
        if found is not None and (stacks := _stacks(computations, *found, batch_rows)) not in loops:
            loops.append(stacks)  # a copy XLA peeled for a step's first or last microbatch is the same loop
    return [row for stacks in loops for row in stacks]


def saved_unrolled(hlo_text: str, batch_rows: int) -> list[dict]:
    """What an unrolled step's forward hands its backward (a model without a layer loop, such as one
    gathered by units): each value of the entry computation that a forward op made and a backward op
    reads, holding the batch's examples (a parameter the backward reads is left out).

    Args:
      hlo_text: ``compiled.as_text()`` of an SPMD program.
      batch_rows: the batch rows each device computes at once: a saved value's first dimension.

    Returns:
      One entry per value: ``path`` (the op that made it, within the model: ``layers_2/q_proj/dot_general``),
      ``dtype``, ``shape`` (per device) and ``bytes``.
    """
    computations, entry = _computations(hlo_text)
    by_name = {i.name: i for i in computations.get(entry, [])}
    found: dict[tuple, dict] = {}
    for ins in by_name.values():
        if _phase(_named_source(ins, by_name)) != "backward":
            continue
        for value in filter(None, map(by_name.get, _operands(ins))):
            source = _named_source(value, by_name)
            if _phase(source) != "forward" or not isinstance(value.type, tuple):
                continue
            dtype, dims = value.type
            if _per_example((1, *dims), batch_rows):
                entry_ = {"path": _path(source), "dtype": dtype, "shape": list(dims), "bytes": _array_bytes(dtype, dims)}
                found[(source.name, dtype, dims)] = entry_
    return list(found.values())


def saved_by_unit(values: list[dict], units: Mapping[str, int]) -> list[SavedKind]:
    """:func:`saved_unrolled`'s values by kind within their gathering unit, as :func:`saved_by_kind`
    gives a loop's: a unit's scope is its parameters' common path (``layers_2``), a value's kind its
    path within the scope (``q_proj/dot_general``), ``layers`` the units that save that kind, and
    ``in_units`` False for what no unit made (the loss's own values).

    Args:
      values: :func:`saved_unrolled`'s.
      units: the plan's parameter path -> unit (the ``units`` of a :class:`jzero.sharding.plan.Plan`).
    """
    scopes = _unit_scopes(units)
    out: dict[tuple, SavedKind] = {}
    for v in values:
        scope = max((s for s in scopes if v["path"].startswith(s + "/")), key=len, default="")
        kind = v["path"][len(scope) + 1 :] if scope else v["path"]
        first = {"kind": kind, "dtype": v["dtype"], "shape": v["shape"], "layers": 0, "bytes_per_layer": v["bytes"]}
        row = out.setdefault((kind, v["dtype"], tuple(v["shape"]), bool(scope)), {**first, "in_units": bool(scope)})
        row["layers"] += 1
    return list(out.values())


def _unit_scopes(units: Mapping[str, int]) -> set[str]:
    """Each unit's parameters' common path: ``layers_2`` for ``layers_2/q_proj/kernel``, ...; a unit
    of one tensor, its module's (``lm_head`` for ``lm_head/kernel``)."""
    modules: dict[int, list[list[str]]] = {}
    for path, unit in units.items():
        modules.setdefault(unit, []).append(path.split("/")[:-1])
    return {"/".join(common) for parts in modules.values() if (common := os.path.commonprefix(parts))}


_ALIASES = {"bitcast", "copy", "get-tuple-element", "reshape"}


def _named_source(ins: _Instruction, by_name: dict) -> _Instruction:
    """The instruction itself, or the one it aliases when it carries no op name of its own."""
    for _ in range(16):
        if _OP_NAME.search(ins.line) or ins.op not in _ALIASES:
            return ins
        operands = _operands(ins)
        if not operands or operands[0] not in by_name:
            return ins
        ins = by_name[operands[0]]
    return ins


def _phase(ins: _Instruction) -> str:
    """``forward``, ``backward`` (JAX's transpose of the forward) or ``other``, by its op name."""
    name = _OP_NAME.search(ins.line)
    if not name:
        return "other"
    return "backward" if "transpose(" in name.group(1) else "forward" if "jvp(" in name.group(1) else "other"


def _path(ins: _Instruction) -> str:
    """``jit(step)/jvp(Llama)/layers_2/q_proj/dot_general`` -> ``layers_2/q_proj/dot_general``."""
    name = _OP_NAME.search(ins.line)
    parts = [p for p in name.group(1).split("/") if not _CALL_WRAPPERS.match(p)] if name else []
    return "/".join(parts) or ins.op


def _stacks(computations: dict, body_name: str, trip: int, batch_rows: int) -> list[SavedKind]:
    body = computations[body_name]
    by_name = {i.name: i for i in body}
    origin = _Origin(computations, by_name)
    root = next(i for i in body if i.line.lstrip().startswith("ROOT"))
    operands = _operands(root)
    out = []
    for index in sorted(_written_elements(body)):
        ins = by_name.get(operands[index]) if index < len(operands) else None
        if ins is None or not isinstance(ins.type, tuple):
            continue
        dtype, dims = ins.type
        if len(dims) < 2 or dims[0] < trip or not _per_example(dims, batch_rows):
            continue
        out.append({
            "kind": origin.kind(ins),
            "dtype": dtype,
            "shape": list(dims[1:]),
            "layers": dims[0],
            "bytes_per_layer": _array_bytes(dtype, dims[1:]),
        })  # fmt: skip
    return out


_PARAMETER = re.compile(r"\bparameter\((\d+)\)")
_INDEX = re.compile(r"index=(\d+)")


class _Origin:
    """Follows a written stack back to the op that made the slice it writes: through moves
    (bitcasts, copies, converts), the write itself, and into fusions and back out of them."""

    def __init__(self, computations: dict, body: dict):
        self.computations, self.body = computations, body

    def kind(self, ins: _Instruction) -> str:
        scope, outer = self.body, []  # outer: the (fusion, its scope) entered, innermost last
        for _ in range(64):
            if ins is None:
                return "unknown"
            if ins.op == "custom-call" and "fmha" in ins.line:
                return "attention/cudnn"
            if ins.op == "parameter" and not outer:
                return "input"  # the loop's own state: the layer's input, carried
            args = [scope.get(name) for name in _operands(ins)]
            if ins.op == "parameter":  # a fusion's parameter: back out to the operand it was given
                fusion, scope = outer.pop()
                ins = scope.get(_operands(fusion)[int(_PARAMETER.search(ins.line).group(1))])
            elif ins.op == "get-tuple-element" and (inside := self._element(ins, args[0])):
                outer.append((args[0], scope))
                scope, ins = inside
            elif ins.op in _PASS_THROUGH or ins.op.endswith(("-start", "-done")) or ins.op == "get-tuple-element":
                ins = args[0]
            elif ins.op == "dynamic-update-slice":
                ins = args[1]
            elif ins.op == "fusion" and (inside := self._root(ins)) and (_writes(inside[1]) or not _OP_NAME.search(ins.line)):
                outer.append((ins, scope))
                scope, ins = inside
            else:
                return _short(ins)
        return "unknown"

    def _element(self, gte: _Instruction, source: _Instruction | None) -> tuple[dict, _Instruction] | None:
        """The op behind one element of a multi-output fusion, with the fusion's scope."""
        inside = self._root(source) if source is not None and source.op == "fusion" else None
        if inside is None or inside[1].op != "tuple":
            return None
        scope, root = inside
        return scope, scope.get(_operands(root)[int(_INDEX.search(gte.line).group(1))])

    def _root(self, fusion: _Instruction) -> tuple[dict, _Instruction] | None:
        body = self.computations.get(dict(_callees(fusion.line)).get("calls"))
        if not body:
            return None
        root = next(i for i in body if i.line.lstrip().startswith("ROOT"))
        return {i.name: i for i in body}, root


def _writes(ins: _Instruction) -> bool:
    return ins.op == "dynamic-update-slice"


def _short(ins: _Instruction) -> str:
    """``.../while/body/closed_call/blocks/mlp_in/dot_general`` -> ``mlp_in/dot_general``."""
    name = _OP_NAME.search(ins.line)
    if not name:
        return ins.op
    parts = [p for p in name.group(1).split("/body/")[-1].split("/") if not _CALL_WRAPPERS.match(p)]
    return "/".join(parts[-2:]) if parts else ins.op
