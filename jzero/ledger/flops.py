"""The matmul FLOPs a compiled program executes, read from its HLO: what the step-time model
divides by the GPU's peak, remat's recomputation included. XLA's ``cost_analysis()`` is None for a
GPU target compiled deviceless, so jzero counts them itself.

Every ``dot`` counts 2 x its result's elements x its contracted size, wherever it sits (a GEMM
fusion's body, a loop's body times its trip count, the largest branch of a conditional), and so
does every cuBLAS GEMM custom call (``__cublas$gemm``, ``__cublas$lt$matmul`` and its fp8 form:
what XLA emits when Triton GEMMs are off, or for f32), its contracted size read from its backend
config's ``dot_dimension_numbers``. A loop without XLA's ``known_trip_count`` gets its trip count
from its condition's compare of the counter against a constant; where that fails it counts once
and is named in ``unknown_loops``, never silently. cuDNN's
fused attention counts its matmuls from its operands' shapes (``[B, T, N, H]``): two in the
forward, five in the backward (the scores are recomputed), over the keys each query sees: half of
them when the mask is causal (the kernel skips the masked blocks), ``W`` at most with a sliding
window of ``W`` (its backend config's ``sliding_window_length``). Elementwise work is not counted:
its time is the HBM term's.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

from jzero.ledger.gathered import _operands
from jzero.ledger.hlo_text import _BRANCHES, _callees, _ComputationSum, _Instruction, _leaves, trip_count
from jzero.records import record

__all__ = ["MatmulFlops", "float8_operands", "flops_between", "fused_attention_windows", "matmul_flops", "program_flops"]


@record
class ModelFlops:
    """The FLOPs one step needs by the model's formula.

    Attributes:
      per_token: the model's FLOPs per token.
      per_step: the global batch's.
      per_device_per_step: one device's share.
      peak_flops: the device's dense bf16 peak, FLOP/s; None where unknown.
      peak_floor_s: the step's seconds at that peak, a floor no real step reaches.
    """

    per_token: float
    per_step: float
    per_device_per_step: float
    peak_flops: float | None
    peak_floor_s: float | None


_CONTRACTING = re.compile(r"lhs_contracting_dims=\{(?P<dims>[\d,]*)\}")
_TARGET = re.compile(r'custom_call_target="(?P<target>[^"]+)"')
_GEMM_CONTRACTING = re.compile(r'"lhs_contracting_dimensions"\s*:\s*\[(?P<dims>[^\]]*)\]')
# A custom call by one of these names that jzero does not count may be a matmul it misses.
_MATMUL_LIKE = re.compile(r"gemm|matmul|cublas|conv|dot", re.IGNORECASE)
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
    return int(matmuls * 2 * b * n * h * _keys_seen(t, s, "CAUSAL" in ins.line.upper(), _window(ins.line)))


_WINDOW = re.compile(r'"sliding_window_length"\s*:\s*"?(?P<w>\d+)')


def _window(line: str) -> int:
    """A cuDNN attention call's sliding window (0: none)."""
    match = _WINDOW.search(line)
    return int(match["w"]) if match else 0


def _keys_seen(queries: int, keys: int, causal: bool, window: int) -> float:
    """The query-key pairs attention computes: all, half when causal, and under a window of ``w``
    about ``w`` per query (``t w - w^2 / 2``: the first ``w`` queries see fewer)."""
    if window and window < keys:
        return queries * window - window * window / 2
    return queries * keys * (0.5 if causal else 1.0)


def fused_attention_windows(hlo_text: str) -> dict[str, int]:
    """cuDNN's fused attention calls in a compiled program (forward and backward), counted by their
    sliding window's length as text (``"0"``: none, every earlier position); empty where the
    program has none (XLA's attention, a CPU program)."""
    found: dict[str, int] = {}
    for line in hlo_text.splitlines():
        target = _TARGET.search(line)
        if target and target["target"] in _ATTENTION_MATMULS:
            key = str(_window(line))
            found[key] = found.get(key, 0) + 1
    return found


def _gemm(ins: _Instruction, types: dict[str, tuple[str, tuple[int, ...]]]) -> int:
    """A cuBLAS GEMM custom call: its result is the first array of its type (a workspace follows)."""
    _, dims = _leaves(ins.type)[0]
    lhs = types.get(_operands(ins)[0])
    match = _GEMM_CONTRACTING.search(ins.line)
    if lhs is None or match is None:
        return 0
    contracted = math.prod(lhs[1][int(d.strip(' "'))] for d in match["dims"].split(",") if d.strip(' "'))
    return 2 * math.prod(dims) * contracted


def float8_operands(ins: _Instruction, types: dict[str, tuple[str, tuple[int, ...]]]) -> bool:
    """Whether a GEMM (a ``dot`` or a cuBLAS call) reads float8 operands: a float8 GEMM."""
    target = _TARGET.search(ins.line)
    if target and target["target"].endswith("$f8"):
        return True
    return any(types.get(o, ("",))[0].startswith("f8") for o in _operands(ins)[:2])


class _Counter(_ComputationSum):
    """FLOPs of one run of each computation, memoised, with what it could not count; with
    ``float8``, only the float8 GEMMs' (:func:`float8_operands`)."""

    def __init__(self, hlo_text: str, float8: bool = False):
        super().__init__(hlo_text)
        self.float8 = float8
        self.types = {name: _types(body) for name, body in self.computations.items()}
        self.unknown_loops: list[str] = []
        self.uncounted: set[str] = set()

    def instruction(self, ins: _Instruction, where: str) -> int:
        if ins.op == "dot":
            return _dot(ins, self.types[where]) if not self.float8 or float8_operands(ins, self.types[where]) else 0
        if ins.op == "custom-call":
            return self.custom_call(ins, where)
        callees = _callees(ins.line)
        branches = [c for attr, c in callees if attr in _BRANCHES]
        flops = max(map(self.computation, branches), default=0)
        for attr, callee in callees:
            if attr == "body":
                flops += self.loop(ins, callee)
            elif attr not in (*_BRANCHES, "condition", "to_apply"):  # a reduction's to_apply is per element
                flops += self.computation(callee)
        return flops

    def custom_call(self, ins: _Instruction, where: str) -> int:
        target = _TARGET.search(ins.line)
        name = target["target"] if target else ""
        if name == "__cublas$gemm" or name.startswith("__cublas$lt$matmul"):  # $f8 too
            return _gemm(ins, self.types[where]) if not self.float8 or float8_operands(ins, self.types[where]) else 0
        if self.float8:
            return 0
        if name in _ATTENTION_MATMULS:
            return _attention(ins, self.types[where])
        if _MATMUL_LIKE.search(name):
            self.uncounted.add(name)
        return 0

    def loop(self, ins: _Instruction, body: str) -> int:
        once = self.computation(body)
        trip = trip_count(ins, self.computations)
        if trip is None and once and ins.name not in self.unknown_loops:
            self.unknown_loops.append(ins.name)  # counted once: a floor, and said
        return once * (1 if trip is None else trip)


class MatmulFlops(NamedTuple):
    """What :func:`matmul_flops` reads from a program.

    Attributes:
      executed: :func:`program_flops`.
      float8: the part of ``executed`` that float8 GEMMs run (:func:`float8_operands`).
      between: :func:`flops_between`.
      windows: for each async collective, ``(window, FLOPs)``: collectives whose start-done spans
        overlap share one window, the compute from the first start to the last done, once.
      unknown_loops: loops with matmuls whose trip count neither XLA nor the condition gives
        (counted once).
      uncounted: custom-call targets that look like matmuls and that jzero does not count.
    """

    executed: int
    float8: int
    between: dict[str, int]
    windows: dict[str, tuple[str, int]]
    unknown_loops: tuple[str, ...]
    uncounted: tuple[str, ...]


def program_flops(hlo_text: str) -> int:
    """The matmul FLOPs one run of the compiled program's entry executes, per device.

    Args:
      hlo_text: ``compiled.as_text()`` of an SPMD program.
    """
    return matmul_flops(hlo_text).executed


def flops_between(hlo_text: str) -> dict[str, int]:
    """For each async collective (by its ``-start``'s name), the matmul FLOPs scheduled between its
    start and its done: the compute that can hide it. One run of its computation; a collective whose
    done is not in the same computation is left out."""
    return matmul_flops(hlo_text).between


def matmul_flops(hlo_text: str) -> MatmulFlops:
    """:func:`program_flops`, :func:`flops_between` and the windows of overlapping collectives from
    one reading of the program (:class:`MatmulFlops`)."""
    counter = _Counter(hlo_text)
    executed = counter.program()
    between, windows = _between(counter)
    float8 = _Counter(hlo_text, float8=True).program() if "f8e" in hlo_text else 0  # a second reading only with float8
    return MatmulFlops(executed, float8, between, windows, tuple(counter.unknown_loops), tuple(sorted(counter.uncounted)))


def _spans(body: list[_Instruction]) -> dict[str, tuple[int, int]]:
    """Each async collective's (start, done) positions in one computation."""
    spans = {}
    for i, ins in enumerate(body):
        if not ins.op.endswith("-start") or ins.op.startswith("copy"):
            continue
        ref = re.compile(r"[(,\s]%?" + re.escape(ins.name) + r"[),\s]")
        for j in range(i + 1, len(body)):
            if body[j].op.endswith("-done") and ref.search(body[j].line.split("=", 1)[1]):
                spans[ins.name] = (i, j)
                break
    return spans


def _overlapping(spans: dict[str, tuple[int, int]]) -> list[tuple[list[str], int, int]]:
    """The spans merged where they overlap: ``(collectives, first start, last done)``."""
    groups: list[tuple[list[str], int, int]] = []
    for op, (start, done) in sorted(spans.items(), key=lambda kv: kv[1]):
        if groups and start < groups[-1][2]:
            ops, first, last = groups.pop()
            groups.append(([*ops, op], first, max(last, done)))
        else:
            groups.append(([op], start, done))
    return groups


def _between(counter: _Counter) -> tuple[dict[str, int], dict[str, tuple[str, int]]]:
    between, windows = {}, {}
    for name, body in counter.computations.items():
        spans = _spans(body)
        if not spans:
            continue
        flops = [counter.instruction(ins, name) for ins in body]
        between.update({op: sum(flops[start + 1 : done]) for op, (start, done) in spans.items()})
        # One communication stream runs overlapping collectives in turn, under their compute once.
        for ops, first, last in _overlapping(spans):
            windows.update(dict.fromkeys(ops, (f"{name}/{ops[0]}", sum(flops[first + 1 : last]))))
    return between, windows
