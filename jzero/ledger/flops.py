"""The matmul FLOPs a compiled program executes, read from its HLO: what the step-time model
divides by the GPU's peak, remat's recomputation included. XLA's ``cost_analysis()`` is None for a
GPU target compiled deviceless, so jzero counts them itself.

Every ``dot`` counts 2 x its result's elements x its contracted size, wherever it sits (a GEMM
fusion's body, a loop's body times its trip count, the largest branch of a conditional). cuDNN's
fused attention counts its matmuls from its operands' shapes (``[B, T, N, H]``): two in the
forward, five in the backward (the scores are recomputed), half of each when the mask is causal
(the kernel skips the masked blocks). Elementwise work is not counted: its time is the HBM term's.
"""

from __future__ import annotations

import math
import re

from jzero.ledger.gathered import _operands
from jzero.ledger.hlo import _TRIP_COUNT, _callees, _computations, _Instruction

__all__ = ["flops_between", "matmul_flops", "program_flops"]

_CONTRACTING = re.compile(r"lhs_contracting_dims=\{(?P<dims>[\d,]*)\}")
_TARGET = re.compile(r'custom_call_target="(?P<target>[^"]+)"')
_BRANCHES = ("branch_computations", "true_computation", "false_computation")
# cuDNN's attention custom calls and their matmuls of 2 B N T S H FLOPs each.
_ATTENTION_MATMULS = {"__cudnn$fmhaSoftmax": 2, "__cudnn$fmhaSoftmaxBackward": 5}


def _types(body: list[_Instruction]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each array-valued instruction's (dtype, dims), by name."""
    return {ins.name: ins.type for ins in body if isinstance(ins.type, tuple)}


def _dot(ins: _Instruction, types: dict[str, tuple[str, tuple[int, ...]]]) -> int:
    _, dims = ins.type
    lhs = types.get(_operands(ins)[0])
    match = _CONTRACTING.search(ins.line)
    if lhs is None or match is None:
        return 0
    contracted = math.prod(lhs[1][int(d)] for d in match["dims"].split(",") if d)
    return 2 * math.prod(dims) * contracted


def _attention(ins: _Instruction, types: dict[str, tuple[str, tuple[int, ...]]]) -> int:
    target = _TARGET.search(ins.line)
    matmuls = _ATTENTION_MATMULS.get(target["target"]) if target else None
    operands = [types.get(o) for o in _operands(ins)[:2]]
    if matmuls is None or None in operands or len(operands[0][1]) != 4:
        return 0
    (b, t, n, h), s = operands[0][1], operands[1][1][1]
    causal = 0.5 if "CAUSAL" in ins.line.upper() else 1.0
    return int(matmuls * 2 * b * n * t * s * h * causal)


class _Counter:
    """FLOPs of one run of each computation, memoised."""

    def __init__(self, hlo_text: str):
        self.computations, self.entry = _computations(hlo_text)
        self.types = {name: _types(body) for name, body in self.computations.items()}
        self.memo: dict[str, int] = {}

    def computation(self, name: str) -> int:
        if name not in self.memo:
            self.memo[name] = 0  # guards a malformed, cyclic module
            self.memo[name] = sum(self.instruction(ins, name) for ins in self.computations.get(name, ()))
        return self.memo[name]

    def instruction(self, ins: _Instruction, where: str) -> int:
        if ins.op == "dot":
            return _dot(ins, self.types[where])
        if ins.op == "custom-call":
            return _attention(ins, self.types[where])
        callees = _callees(ins.line)
        branches = [c for attr, c in callees if attr in _BRANCHES]
        trip = _TRIP_COUNT.search(ins.line)
        flops = max(map(self.computation, branches), default=0)
        for attr, callee in callees:
            if attr == "body":
                flops += self.computation(callee) * (int(trip.group(1)) if trip else 1)
            elif attr not in (*_BRANCHES, "condition", "to_apply"):  # a reduction's to_apply is per element
                flops += self.computation(callee)
        return flops


def program_flops(hlo_text: str) -> int:
    """The matmul FLOPs one run of the compiled program's entry executes, per device.

    Args:
      hlo_text: ``compiled.as_text()`` of an SPMD program.
    """
    return matmul_flops(hlo_text)[0]


def flops_between(hlo_text: str) -> dict[str, int]:
    """For each async collective (by its ``-start``'s name), the matmul FLOPs scheduled between its
    start and its done: the compute that can hide it. One run of its computation; a collective whose
    done is not in the same computation is left out."""
    return matmul_flops(hlo_text)[1]


def matmul_flops(hlo_text: str) -> tuple[int, dict[str, int]]:
    """:func:`program_flops` and :func:`flops_between` from one reading of the program."""
    counter = _Counter(hlo_text)
    return (counter.computation(counter.entry) if counter.entry else 0), _between(counter)


def _between(counter: _Counter) -> dict[str, int]:
    out = {}
    for name, body in counter.computations.items():
        for i, ins in enumerate(body):
            if not ins.op.endswith("-start") or ins.op.startswith("copy"):
                continue
            ref = re.compile(r"[(,\s]%?" + re.escape(ins.name) + r"[),\s]")
            total = 0
            for later in body[i + 1 :]:
                if later.op.endswith("-done") and ref.search(later.line.split("=", 1)[1]):
                    out[ins.name] = total
                    break
                total += counter.instruction(later, name)
    return out

