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

from jzero.ledger.collectives import COLLECTIVES
from jzero.ledger.gathered import _operands
from jzero.ledger.hlo_text import (
    _ARRAY,
    _OP_NAME,
    Computations,
    _array_bytes,
    _callees,
    _computations,
    _dims,
    _Instruction,
    _loop_op_names,
    trip_count,
)
from jzero.records import omit_if_none, record

__all__ = [
    "Activations",
    "SavedKind",
    "forward_loop",
    "forward_loop_writes",
    "saved_activations",
    "saved_by_kind",
    "saved_by_unit",
    "saved_unrolled",
]


_OPERANDS = re.compile(r"\btuple\((?P<args>[^)]*)\)")


_GTE_INDEX = re.compile(r"get-tuple-element\(%?(?P<of>[\w.\-]+)\),\s*index=(?P<index>\d+)")


def forward_loop(ins: _Instruction, computations: Computations) -> tuple[str, int] | None:
    """``(body, trip count)`` of a differentiated scan's forward loop, else None.

    The forward is named ``jvp(...)`` and the backward ``transpose(jvp(...))``, on the ``while`` or,
    where XLA made the loop anew (its collective pipeliner peels an iteration), on its body's ops. A
    pipelined loop runs fewer iterations than its stacks have rows: a stack has at least as many.
    """
    if ins.op != "while":
        return None
    body = dict(_callees(ins.line)).get("body")
    if body not in computations:
        return None
    names = _loop_op_names(ins, computations)
    if not any("jvp(" in n for n in names) or any("transpose(" in n for n in names):
        return None
    trip = trip_count(ins, computations)
    return (body, trip) if trip else None


def forward_loop_writes(hlo_text: str) -> list[list[tuple[str, tuple[int, ...], bool, bool]]]:
    """The stacks each forward layer loop writes for the backward, from compiled HLO.

    A differentiated scan is two while loops: the forward (``jvp(...)`` in its op name) writes
    each iteration's residuals into stacked buffers, the backward (``transpose(jvp(...))``) reads
    them. These are the forward loop's outputs that the loop writes (not carried through
    unchanged) and that have one row per iteration.

    Returns:
      Per forward loop, ``(dtype, dims, in_host_memory, like_a_read_only_input)`` for each such
      stack; the last says a state the loop only reads has the same type (a parameter stack).
    """
    computations, _ = _computations(hlo_text)
    loops = []
    for ins in (ins for body in computations.values() for ins in body):
        found = forward_loop(ins, computations)
        if found is not None:
            loops.append(_loop_stacks(ins, computations, *found))
    return loops


def _loop_stacks(ins: _Instruction, computations: Computations, body: str, rows: int) -> list:
    """:func:`forward_loop_writes`' stacks of one forward loop."""
    state_type = ins.line.split("=", 1)[1].split(" while(")[0]
    items = list(_ARRAY.finditer(state_type))
    written = _written_elements(computations[body])
    read_only = {item.group("dtype", "dims") for i, item in enumerate(items) if i not in written}
    stacks = []
    for index, item in enumerate(items):
        dims = _dims(item)
        if index in written and len(dims) > 1 and dims[0] >= rows:
            host = "S(5)" in (item.group("layout") or "")
            stacks.append((item.group("dtype"), dims, host, item.group("dtype", "dims") in read_only))
    return stacks


def saved_activations(hlo_text: str, batch_rows: int | None = None) -> dict[str, int]:
    """What the forward layer loops save for the backward, per device, from compiled HLO, at the
    most that is live at once: the stacks of :func:`forward_loop_writes` that hold activations, a
    batch of examples, or without ``batch_rows``, a shape unlike any parameter stack the loop reads
    (JAX also saves the slices of parameters it used). A buffer in host memory (layout ``S(5)``)
    counts as host bytes.

    A forward loop's stacks are live until a backward loop reads them (the last forward's, in
    program order), so the microbatches of a step (a loop XLA peeled into the step's first and
    last microbatch and the microbatch loop's own) count once, and two forward loops before their
    backwards count both.

    Args:
      hlo_text: ``compiled.as_text()`` of an SPMD program.
      batch_rows: the batch rows each device computes at once; when given, a saved stack must have
        them as its second dimension.

    Returns:
      ``{"device", "host", "loops"}``: bytes per device at the peak, and how many forward layer
      loops save.
    """
    computations, entry = _computations(hlo_text)
    live = _LiveSaved(computations, batch_rows)
    device, host = live.peak(entry) if entry else (0, 0)
    return {"device": device, "host": host, "loops": live.loops}


class _LiveSaved:
    """The saved stacks live at once, computation by computation, in program order."""

    def __init__(self, computations: Computations, batch_rows: int | None):
        self.computations, self.rows, self.loops = computations, batch_rows, 0
        self.memo: dict[str, tuple[int, int]] = {}

    def peak(self, name: str) -> tuple[int, int]:
        """``(device, host)`` at the most live in one run of ``name``."""
        if name in self.memo:
            return self.memo[name]
        self.memo[name] = (0, 0)  # guards a malformed, cyclic module
        live, pending, best = (0, 0), [], (0, 0)
        for ins in self.computations.get(name, ()):
            if (found := forward_loop(ins, self.computations)) is not None:
                saved = self.saved(_loop_stacks(ins, self.computations, *found))
                pending.append(saved)
                live = (live[0] + saved[0], live[1] + saved[1])
            elif _is_backward_loop(ins, self.computations) and pending:
                done = pending.pop()
                live = (live[0] - done[0], live[1] - done[1])
            else:
                inner = max((self.peak(c) for _, c in _callees(ins.line) if c in self.computations), key=sum, default=(0, 0))
                live_inner = (live[0] + inner[0], live[1] + inner[1])
                best = max(best, live_inner, key=sum)
            best = max(best, live, key=sum)
        self.memo[name] = best
        return best

    def saved(self, stacks: list) -> tuple[int, int]:
        device = host = 0
        for dtype, dims, in_host, like_input in stacks:
            if _per_example(dims, self.rows) if self.rows else not like_input:
                nbytes = _array_bytes(dtype, dims)
                host, device = (host + nbytes, device) if in_host else (host, device + nbytes)
        self.loops += int(device + host > 0)
        return device, host


def _is_backward_loop(ins: _Instruction, computations: Computations) -> bool:
    """A differentiated scan's backward loop: ``transpose(jvp(...))`` on the ``while`` or its body's ops."""
    return ins.op == "while" and any("transpose(" in n for n in _loop_op_names(ins, computations))


def _per_example(dims: tuple[int, ...], rows: int) -> bool:
    """A stack of a batch's activations: ``[iterations, rows, ...]``, or ``[iterations, 1, rows, ...]``
    where the step maps over batch groups (``vmap``) and each device has one. An activation has a
    position axis too: a parameter slice ``[iterations, n]`` with ``n == rows`` is not one."""
    return len(dims) > 2 and (dims[1] == rows or (len(dims) > 3 and dims[1] == 1 and dims[2] == rows))


def _written_elements(body: list[_Instruction]) -> set[int]:
    """Indices of a while body's state that the body changes (not ``get-tuple-element(param), index=i``
    handed back at position i)."""
    params = {ins.name for ins in body if ins.op == "parameter"}
    reads = {}
    for ins in body:
        match = _GTE_INDEX.search(ins.line)
        if match and match.group("of") in params:
            reads[ins.name] = int(match.group("index"))
    root = next((ins for ins in body if ins.line.lstrip().startswith("ROOT")), None)
    match = _OPERANDS.search(root.line) if root else None
    if not match:
        return set()
    operands = [a.strip().lstrip("%") for a in match.group("args").split(",")]
    return {i for i, name in enumerate(operands) if reads.get(name) != i}


@record
class SavedKind:
    """One kind of value saved for the backward: a layer loop's residual stack, or an unrolled model's.

    Attributes:
      kind: what the value is (the op that makes it, or the model's input).
      dtype: its HLO element type.
      shape: one layer's shape.
      layers: how many layers (or gathering units) save it.
      bytes_per_layer: one layer's bytes.
      role: the GPT formula's kind it counts toward; only beside a formula.
      in_units: whether it is saved within a gathering unit; only for an unrolled model.
    """

    kind: str
    dtype: str
    shape: list[int]
    layers: int
    bytes_per_layer: int
    role: str | None = omit_if_none()
    in_units: bool | None = omit_if_none()


@record
class Activations:
    """What the step saves for the backward, per device, and against the GPT's formula where it applies.

    Attributes:
      device: bytes saved in device memory.
      host: bytes saved in host memory.
      remat: the remat policy in effect.
      partitioned: whether the saved inputs are split over ``model``.
      host_from: where the host bytes come from: ``compiled`` (the layout) or ``policy`` (the traced program).
      saved_by: ``layer loops`` or ``gathering units``.
      by_kind: the saved values by kind.
      formula: the GPT formula's bytes for all layers; GPT layer loops only.
      formula_by_kind: the formula's bytes per layer, by role.
      over_formula: the roles saved above the formula.
      korthikanti_none: Korthikanti et al.'s 34 s b h per layer, 16-bit, without recomputation.
    """

    device: int
    host: int
    remat: str
    partitioned: bool
    host_from: str
    saved_by: str
    by_kind: list[SavedKind]
    formula: int | None = omit_if_none()
    formula_by_kind: dict[str, int] | None = omit_if_none()
    over_formula: list[str] | None = omit_if_none()
    korthikanti_none: int | None = omit_if_none()



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
      One record per stack: ``kind`` (``input`` for the layer's own input, else the producing op's
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
    count: dict[tuple, int] = {}
    for v in values:
        scope = max((s for s in scopes if v["path"].startswith(s + "/")), key=len, default="")
        kind = v["path"][len(scope) + 1 :] if scope else v["path"]
        key = (kind, v["dtype"], tuple(v["shape"]), v["bytes"], bool(scope))
        count[key] = count.get(key, 0) + 1
    return [
        SavedKind(kind=kind, dtype=dtype, shape=list(shape), layers=n, bytes_per_layer=nbytes, in_units=in_units)
        for (kind, dtype, shape, nbytes, in_units), n in count.items()
    ]


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
        layer = dims[1:]
        nbytes = _array_bytes(dtype, layer)
        out.append(SavedKind(kind=origin.kind(ins), dtype=dtype, shape=list(layer), layers=dims[0], bytes_per_layer=nbytes))
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
