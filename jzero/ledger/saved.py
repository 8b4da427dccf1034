"""What a layer loop saves for the backward, by kind: each stacked residual of the forward loop
named by the operation that produced it, read from compiled HLO.

A differentiated scan's forward loop writes one slice per iteration into each residual stack
(:func:`jzero.ledger.hlo.forward_loop_writes`). The slice written is some operation's result: a
matmul (its op name ends ``query/dot_general``), cuDNN's attention kernel, or the layer's own input
(the loop's carry). That operation names the row.
"""

from __future__ import annotations

import re

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

__all__ = ["SavedKind", "saved_by_kind"]

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
    rows = []
    for ins in (ins for body in computations.values() for ins in body):
        found = forward_loop(ins, computations)
        if found is not None:
            rows += _stacks(computations, *found, batch_rows)
    return rows


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
