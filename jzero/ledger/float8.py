"""Float8 in the compiled program: which GEMMs read float8 operands, against the layers'
projections that asked for them (``precision.fp8``), and the matmuls left in 16 bits, with why.

A switch that the compiler silently ignores looks like one that worked (torchtitan #3123), so the
proof is read from the program: every ``dot`` (in a GEMM fusion or not) and cuBLAS call, its
operands' types (:func:`jzero.ledger.flops.float8_operands`), and the projection it computes from
its ``op_name`` (Flax's module path). A projection is covered when each of its GEMMs, the forward,
its recomputation and the backward's two, reads float8.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from jax.sharding import NamedSharding

from jzero.dtypes import FP8_RECIPES, hlo_bytes
from jzero.ledger.collectives import Collective
from jzero.ledger.flops import _types, float8_operands
from jzero.ledger.hlo_text import _OP_NAME, _computations, _Instruction
from jzero.memory.float8 import kept_reason
from jzero.records import record

__all__ = ["Float8", "Float8Gathers", "KeptMatmul", "float8_gathers", "float8_report", "parameter_gather_bytes"]

HEAD = "the output layer: float8 covers the layers' projections (torchtitan's default too)"
CPU = "the CPU backend widens float8 operands for its dots (their values, and so the numerics, are float8's)"
NOT_PROJECTION = "not a layer projection (attention's own matmuls): in the compute dtype"
# Segments of an op_name that say how JAX reached an op, not which module computes it.
_TRACE = re.compile(
    r"^(jit\(.*\)|jvp\(.*\)|transpose\(.*\)|while|body|closed_call|checkpoint|rematted_computation|cond|branch_\d+_fun)$"
)


@record
class KeptMatmul:
    """A matmul the program computes in another type than float8.

    Attributes:
      name: the module it belongs to (its path in the program's ``op_name``).
      why: why it is not float8.
    """

    name: str
    why: str


@record
class Float8:
    """``fp8`` in ``jzero plan --json``: float8 GEMMs in the compiled program against the projections
    that asked for them.

    Attributes:
      recipe: ``precision.fp8``.
      gemms: float8 GEMMs in the compiled program (its instructions, not their runs).
      other_gemms: GEMMs in it that read no float8 operand.
      requested: the layers' projections that asked for float8.
      covered: those whose every GEMM in the program reads float8 (forward and backward).
      kept_bf16: the matmuls in another type, one entry a module, with why.
    """

    recipe: str
    gemms: int
    other_gemms: int
    requested: int
    covered: int
    kept_bf16: list[KeptMatmul]


def float8_report(hlo_text: str, recipe: str, projections: Mapping[str, Sequence[int]], backend: str) -> Float8 | None:
    """The program's float8 GEMMs against the projections that asked (None when ``recipe`` is ``none``).

    Args:
      hlo_text: the compiled step's HLO.
      recipe: ``precision.fp8``.
      projections: each layer projection's module path (its kernel's path without ``/kernel``)
        and its kernel's shape in one layer ``[in, out]``.
      backend: the devices' platform (``cpu``, ``gpu``).
    """
    if recipe == FP8_RECIPES[0]:
        return None
    by_name = {path.rsplit("/", 1)[-1]: path for path in projections}
    float8, other = {}, {}
    for ins, types in _gemms(hlo_text):
        module = _module(ins)
        name = next((by_name[n] for n in module.split("/") if n in by_name), module)
        counts = float8 if float8_operands(ins, types) else other
        counts[name] = counts.get(name, 0) + 1
    kept = [KeptMatmul(name=name, why=_why(name, projections, backend)) for name in sorted(other)]
    covered = sum(1 for p in projections if p in float8 and p not in other)
    return Float8(
        recipe=recipe, gemms=sum(float8.values()), other_gemms=sum(other.values()), requested=len(projections),
        covered=covered, kept_bf16=kept,
    )  # fmt: skip


def _gemms(hlo_text: str) -> list[tuple[_Instruction, dict]]:
    """Every GEMM of the program (a ``dot``, a cuBLAS call) with its computation's types."""
    computations, _ = _computations(hlo_text)
    out = []
    for body in computations.values():
        types = _types(list(body))
        out += [(ins, types) for ins in body if ins.op == "dot" or (ins.op == "custom-call" and "__cublas$" in ins.line)]
    return out


def _module(ins: _Instruction) -> str:
    """The module path in an instruction's ``op_name``: how JAX reached it and the op itself left out."""
    match = _OP_NAME.search(ins.line)
    parts = (match.group(1) if match else ins.name).split("/")[:-1]
    return "/".join(p for p in parts if not _TRACE.match(p)) or ins.name


def _why(name: str, projections: Mapping[str, Sequence[int]], backend: str) -> str:
    if name in projections:
        return kept_reason(projections[name]) or (CPU if backend == "cpu" else "XLA compiled its GEMM without float8 operands")
    return HEAD if "head" in name else NOT_PROJECTION


@record
class Float8Gathers:
    """``fp8_gather`` in ``jzero plan --json``: stage 3's parameter all-gathers in the compiled program
    (arrays the size of a gathered parameter), by element type, per device per step.

    Attributes:
      float8_bytes: those sent as float8 (``f8e4m3fn``).
      other_bytes: those sent in other types, by HLO type (norms and biases, the output layer).
      compute_dtype_bytes: what the same gathers send in the compute dtype.
      ratio: all of them over ``compute_dtype_bytes``.
    """

    float8_bytes: int
    other_bytes: dict[str, int]
    compute_dtype_bytes: int
    ratio: float | None


def parameter_gather_bytes(ops: Iterable[Collective], plan: Any) -> dict[str, tuple[int, int]]:
    """The all-gathers of stage 3's parameters (arrays of a gathered parameter's size per device), by
    HLO element type: ``(bytes, elements)`` per step, loops times their trip counts."""
    sizes = set()
    for t in plan.tensors:
        if (gathered := plan.parameter_gather(t)) is not None:
            shape, _, target = gathered
            sizes.add(math.prod(NamedSharding(plan.mesh, target).shard_shape(shape)))
    out: dict[str, tuple[int, int]] = {}
    for op in ops:
        for dtype, dims in op.arrays if op.kind == "all-gather" else ():
            if (elements := math.prod(dims)) in sizes:
                nbytes, count = out.get(dtype, (0, 0))
                out[dtype] = (nbytes + int(elements * hlo_bytes(dtype)) * op.executions, count + elements * op.executions)
    return out


def float8_gathers(ops: Iterable[Collective], plan: Any, compute_dtype: Any) -> Float8Gathers | None:
    """``zero.fp8_gather``'s part of the report (:class:`Float8Gathers`); None when it is off."""
    if not plan.zero.fp8_gather:
        return None
    found = parameter_gather_bytes(ops, plan)
    wide = sum(count for _, count in found.values()) * np.dtype(compute_dtype).itemsize
    float8 = found.pop("f8e4m3fn", (0, 0))[0]
    others = {dtype: nbytes for dtype, (nbytes, _) in found.items()}
    sent = float8 + sum(others.values())
    return Float8Gathers(float8_bytes=float8, other_bytes=others, compute_dtype_bytes=wide, ratio=sent / wide if wide else None)
