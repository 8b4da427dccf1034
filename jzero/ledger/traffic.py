"""The HBM bytes a compiled program's non-matmul work moves: what the step-time model's memory term
divides by HBM bandwidth (:func:`jzero.ledger.timing.predict`).

Each kernel outside the matmuls (a fusion, a copy, a transpose, a reduce, the optimizer's update)
reads its operands from HBM and writes its results once, wherever it sits (a loop's body times its
trip count, the largest branch of a conditional). Two readings keep that honest inside XLA's layer
loop: an operand a fusion reads only through slices counts the slices (a layer out of the stacked
weights), and a fusion that updates a buffer in place writes only its update. What is left out: the
matmuls themselves (GEMMs, GEMM fusions, cuDNN's attention: their time is the compute term's),
collectives (the communication term's), and ops that move nothing (parameters, tuples, bitcasts).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence

from jzero.ledger.collectives import COLLECTIVES
from jzero.ledger.gathered import _operands
from jzero.ledger.hlo_text import (
    _BRANCHES,
    _array_bytes,
    _callees,
    _ComputationSum,
    _Instruction,
    _leaves,
    trip_count,
)

__all__ = ["hbm_bytes"]

_NOTHING_MOVED = {
    "parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all", "partition-id", "replica-id",
    "add-dependency", "opt-barrier", "copy-start", "copy-done", "send", "recv", "send-done", "recv-done",
    "async-start", "async-update", "async-done", "dot", "convolution",
}  # fmt: skip
_MATMUL_CALL = re.compile(r'custom_call_target="[^"]*(gemm|matmul|cublas|fmha|cudnn)', re.IGNORECASE)
_SLICES = ("dynamic-slice", "slice", "gather")
_PARAMETER = re.compile(r"parameter\((\d+)\)")


def _bytes(hlo_type) -> int:
    return sum(_array_bytes(*leaf) for leaf in _leaves(hlo_type)) if hlo_type is not None else 0


def _is_collective(op: str) -> bool:
    return any(op.startswith(kind) for kind in COLLECTIVES)


class _Traffic(_ComputationSum):
    """Bytes of one run of each computation, memoised."""

    def __init__(self, hlo_text: str):
        super().__init__(hlo_text)
        self.types = {name: {ins.name: ins.type for ins in body} for name, body in self.computations.items()}

    def instruction(self, ins: _Instruction, where: str) -> int:
        callees = _callees(ins.line)
        if ins.op == "while":
            body = next(c for attr, c in callees if attr == "body")
            return self.computation(body) * (trip_count(ins, self.computations) or 1)
        if ins.op in ("conditional", "call"):
            branches = [self.computation(c) for attr, c in callees if attr in _BRANCHES]
            return max(branches, default=0) + sum(self.computation(c) for attr, c in callees if attr in ("to_apply", "calls"))
        if ins.op in _NOTHING_MOVED or _is_collective(ins.op) or _MATMUL_CALL.search(ins.line):
            return 0
        operands = [self.types[where].get(name) for name in _operands(ins)]
        if ins.op == "fusion":
            return self.fusion(ins, next((c for attr, c in callees if attr == "calls"), ""), operands)
        return sum(map(_bytes, operands)) + _bytes(ins.type)

    def fusion(self, ins: _Instruction, body_name: str, operands: Sequence) -> int:
        """A fusion's reads and writes: none for a GEMM fusion (the compute term's); slices of an
        operand read only through slices; only the update of a buffer updated in place."""
        body = self.computations.get(body_name, ())
        if any(i.op in ("dot", "convolution") or _MATMUL_CALL.search(i.line) for i in body):
            return 0
        users: dict[str, list[_Instruction]] = defaultdict(list)
        for inner in body:
            for name in _operands(inner):
                users[name].append(inner)
        reads = 0
        for inner in body:
            if inner.op != "parameter":
                continue
            index = int(_PARAMETER.search(inner.line).group(1))
            uses = users[inner.name]
            if uses and all(u.op in _SLICES and _operands(u)[0] == inner.name for u in uses):
                reads += sum(_bytes(u.type) for u in uses)
            elif not uses or not all(u.op == "dynamic-update-slice" and _operands(u)[0] == inner.name for u in uses):
                reads += _bytes(operands[index]) if index < len(operands) else 0
        return reads + self.written(ins, body)

    def written(self, ins: _Instruction, body: Sequence[_Instruction]) -> int:
        root = next((i for i in body if i.line.lstrip().startswith("ROOT")), None)
        if root is not None and root.op == "dynamic-update-slice":
            types = {i.name: i.type for i in body}
            return _bytes(types.get(_operands(root)[1]))
        return _bytes(ins.type)


def hbm_bytes(hlo_text: str) -> int:
    """The bytes one run of the compiled program's non-matmul work reads and writes in HBM, per device.

    Args:
      hlo_text: ``compiled.as_text()`` of an SPMD program.
    """
    return _Traffic(hlo_text).program()
