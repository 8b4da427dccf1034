"""ZeRO++'s parts of the report: qwZ's quantized gathers, qgZ's quantized gradient reductions and
hpZ's secondary copy, each against what the compiled program really sends or saves."""

from __future__ import annotations

import math

import numpy as np
from jax.sharding import NamedSharding

from jzero.communication.quantize import Layout
from jzero.dtypes import by_hlo
from jzero.ledger.collectives import Collective
from jzero.ledger.element_types import GradientReductions, ParameterGathers, gradient_reductions, parameter_gathers
from jzero.ledger.saved import forward_loop_writes
from jzero.ledger.tensors import ExcludedTensor, excluded
from jzero.memory.precision import Precision
from jzero.records import record
from jzero.sharding.axes import LAYERS, model_ways
from jzero.sharding.plan import Plan

__all__ = ["GradientQuantization", "Hierarchical", "Quantization", "gradient_quantization", "hierarchical", "quantization"]

# HLO element types by their NumPy names, where the two differ.


@record
class Quantization:
    """qwZ: what is quantized, what is gathered at full precision and why, and what the gathers send.

    Attributes:
      weights: the quantization asked for (``int8``).
      block: elements per scale.
      quantized: how many parameters are gathered quantized.
      quantized_bytes: their whole bytes.
      not_quantized: those gathered at full precision.
      gathers: what the compiled gathers send.
    """

    weights: str
    block: int
    quantized: int
    quantized_bytes: int
    not_quantized: list[ExcludedTensor]
    gathers: ParameterGathers


@record
class GradientQuantization:
    """qgZ: the gradients reduced by quantized all-to-alls, those left whole, and what the reductions send.

    Attributes:
      gradients: the quantization asked for (``int8`` or ``int4``).
      quantized: how many gradients are reduced quantized.
      quantized_bytes: their whole bytes.
      smallest_block: the smallest quantization block among them.
      not_quantized: those all-reduced at full precision.
      reductions: what the compiled reductions send.
    """

    gradients: str
    quantized: int
    quantized_bytes: int
    smallest_block: int
    not_quantized: list[ExcludedTensor]
    reductions: GradientReductions


@record
class Hierarchical:
    """hpZ: the secondary copy per device against the paper's formula, and what the layer loops save of it.

    Attributes:
      not_over_replica: the gathered tensors partitioned over ``data`` alone.
      secondary_bytes: the plan's secondary copy per device.
      formula_bytes: the formula's: parameters in the compute dtype over a host's devices and N_m.
      scanned_bytes: the scanned layers' share of the copy.
      saved_by_loops_bytes: what the compiled layer loops save of it.
    """

    not_over_replica: list[ExcludedTensor]
    secondary_bytes: int
    formula_bytes: float
    scanned_bytes: int
    saved_by_loops_bytes: int


def gradient_quantization(plan: Plan, ops: list[Collective]) -> GradientQuantization | None:
    """qgZ's part of the report: the gradients reduced by quantized all-to-alls, those whole at rest
    (whose gradients ``shard_map`` all-reduces at full precision), and what the compiled reductions
    really send (:func:`jzero.ledger.element_types.gradient_reductions`); None without qgZ."""
    if not plan.qgz:
        return None
    blocks = plan.gradient_blocks()
    by_path = {t.path: t for t in plan.tensors}
    reductions = gradient_reductions(ops, plan.zero.quantized_gradients)
    return GradientQuantization(
        gradients=plan.zero.quantized_gradients,
        quantized=len(blocks),
        quantized_bytes=sum(by_path[p].nbytes for p in blocks),
        smallest_block=min(blocks.values(), default=0),
        not_quantized=[excluded(t, "whole at rest") for t in plan.tensors if t.path not in blocks],
        reductions=reductions,
    )


def _numpy_name(hlo: str) -> str:
    """A floating type's numpy name (``bf16`` -> ``bfloat16``); any other HLO type as it is."""
    found = by_hlo(hlo)
    return found.name if found is not None and found.floating else hlo


def hierarchical(plan: Plan, precision: Precision, hlo_text: str) -> Hierarchical | None:
    """hpZ's secondary copy per device: the plan's bytes, the paper's formula (the parameters in
    the compute dtype over the devices of a host, ``data``, and N_m), and what the compiled layer
    loops save of it (its scanned layers' stacks, found by shape); None without hpZ."""
    if not plan.hpz:
        return None
    dtype = precision.compute_dtype
    itemsize = np.dtype(dtype).itemsize
    gathered = [t for t in plan.tensors if t.param_spec != t.replicated_spec]
    formula = sum(math.prod(t.shape) for t in gathered) * itemsize / plan.data_size / model_ways(plan.mesh.shape)
    stacks = [
        (np.dtype(dtype).name, NamedSharding(plan.mesh, plan.secondary_spec(t.param_spec)).shard_shape(t.shape))
        for t in gathered
        if (t.logical or (None,))[0] == LAYERS
    ]
    written = [(_numpy_name(d), dims) for loop in forward_loop_writes(hlo_text) for d, dims, _, _ in loop]
    saved = 0
    for stack in stacks:
        if stack in written:
            written.remove(stack)
            saved += math.prod(stack[1]) * itemsize
    alone = [t for t in gathered if plan.secondary_spec(t.param_spec) == t.param_spec]
    return Hierarchical(
        not_over_replica=[excluded(t, "replica x data divides none of its dimensions") for t in alone],
        secondary_bytes=plan.secondary_bytes(dtype),
        formula_bytes=formula,
        scanned_bytes=sum(math.prod(dims) * itemsize for _, dims in stacks),
        saved_by_loops_bytes=saved,
    )


def quantization(plan: Plan, ops: list[Collective]) -> Quantization | None:
    """qwZ's part of the report: what is quantized, what is gathered at full precision and why,
    and what the compiled gathers really send (:func:`jzero.ledger.element_types.parameter_gathers`);
    None when weights are not quantized."""
    layouts = plan.weight_layouts()
    if not layouts:
        return None
    by_path = {t.path: t for t in plan.tensors}
    quantized, others, kept = [], [], []
    for path, lay in layouts.items():
        shape, _, target = plan.parameter_gather(by_path[path])
        elements = math.prod(NamedSharding(plan.mesh, target).shard_shape(shape))
        if isinstance(lay, Layout):
            quantized.append(elements)
            others.append(lay.blocks * math.prod(NamedSharding(plan.mesh, target).shard_shape(shape)) // lay.local_size)
        else:
            others.append(elements)
            kept.append(excluded(by_path[path], lay))
    gathers = parameter_gathers(ops, plan.zero.quantized_weights, quantized, others)
    return Quantization(
        weights=plan.zero.quantized_weights,
        block=plan.zero.quantization_block,
        quantized=len(quantized),
        quantized_bytes=sum(by_path[p].nbytes for p, lay in layouts.items() if isinstance(lay, Layout)),
        not_quantized=kept,
        gathers=gathers,
    )
