"""The loss wrapped so that the plan's gathers run where the plan puts them.

- :func:`unit_loss`: gathering units, one at a time (:mod:`jzero.communication.gather`);
- :func:`model_gather`: the gather a model calls itself, layer by layer (qwZ, hpZ, qgZ);
- :func:`manual_loss`: qgZ's loss under ``jax.shard_map``, each device on its own rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
from jax.sharding import PartitionSpec as P

from jzero.communication.gather import UnitSpec, tree_gather
from jzero.communication.loss_units import split_units, with_units
from jzero.communication.quantize import Layout
from jzero.memory.precision import FP32, Precision
from jzero.sharding.plan import Plan

__all__ = ["LossFn", "manual_loss", "model_gather", "unit_loss", "units_in_effect"]

LossFn = Callable[[Any, Any], jax.Array]


def unit_loss(loss_fn: LossFn, plan: Plan, precision: Precision = FP32) -> LossFn | None:
    """``loss_fn`` gathering the plan's units one at a time (:func:`jzero.communication.loss_units.with_units`), or
    None when the plan has no units. It takes the resting parameters and casts them itself."""
    if not plan.units:
        return None
    layouts = plan.weight_layouts()
    specs = {
        t.path: _unit_spec(plan, precision, t.param_spec, t.replicated_spec, _layout(layouts, t.path), fp8=_float8(plan, t))
        for t in plan.tensors
        if t.path in plan.units
    }
    return with_units(loss_fn, plan.units, specs, compute_dtype=precision.compute_dtype, prefetch=plan.zero.prefetch)


def units_in_effect(loss_fn: LossFn, plan: Plan, params: Any, batch: Any, precision: Precision = FP32) -> Plan:
    """``plan`` with only the units ``loss_fn`` lets :func:`unit_loss` gather one at a time
    (:func:`jzero.communication.loss_units.split_units`): the others, merged into one region, are left to XLA and
    named in ``plan.merged_units``. ``params`` and ``batch`` may be shapes."""
    if not plan.units:
        return plan
    units, merged = split_units(loss_fn, plan.units, params, batch, compute_dtype=precision.compute_dtype)
    return dataclasses.replace(plan, units=units, merged_units=tuple(merged)) if merged else plan


def _layout(layouts: dict[str, Any], path: str) -> Layout | None:
    lay = layouts.get(path)
    return lay if isinstance(lay, Layout) else None


def model_gather(plan: Plan, precision: Precision = FP32) -> Callable[[str, Any], Any] | None:
    """The gather a model that gathers its own parameters calls (:func:`jzero.communication.gather.tree_gather`):
    at stage 3 with qwZ or ``zero.fp8_gather``, each quantizable parameter (one layer of a scanned
    stack at a time), and with hpZ or qgZ every gathered one (under qgZ with explicit collectives, for
    :func:`manual_loss`); the others left to XLA. None when there is nothing for the model to
    gather itself.

    jzero's GPT takes it as its ``gather`` field; a plan with units gathers in :func:`unit_loss`
    instead.
    """
    if not plan.rule.params or plan.units:
        return None
    layouts, blocks = plan.weight_layouts(), plan.gradient_blocks()
    specs = {}
    for t in plan.tensors:
        lay = _layout(layouts, t.path)
        gathered = plan.parameter_gather(t)
        if gathered is not None and (lay is not None or plan.hpz or plan.qgz or _float8(plan, t)):
            _, source, target = gathered
            specs[t.path] = _unit_spec(plan, precision, source, target, lay, blocks.get(t.path, 0), _float8(plan, t))
    return tree_gather(specs) if specs else None


def _float8(plan: Plan, t: Any) -> bool:
    """``zero.fp8_gather`` casts this parameter to float8 for its gather: it has two or more
    dimensions in one layer (norms and biases go at full precision, as qwZ's)."""
    shape = plan.parameter_gather(t)
    return plan.zero.fp8_gather and shape is not None and len(shape[0]) >= 2


def _unit_spec(
    plan: Plan, precision: Precision, source: P, target: P, lay: Layout | None, grad_block: int = 0, fp8: bool = False
) -> UnitSpec:
    """How one leaf resting as ``source`` is gathered to ``target`` under the plan's ZeRO++ knobs
    (``grad_block``: qgZ's, from :meth:`jzero.sharding.plan.Plan.gradient_blocks`) and in float8 with ``fp8``."""
    secondary = plan.secondary_spec(source) if plan.hpz else None
    spec = UnitSpec(plan.mesh, source, target, precision.grad_reduce_dtype, layout=lay, secondary=secondary, fp8=fp8)
    if not plan.qgz:
        return spec
    return dataclasses.replace(spec, manual=plan.batch_axes, grad_width=plan.zero.quantized_gradients, grad_block=grad_block)


def manual_loss(loss_fn: LossFn, plan: Plan) -> LossFn:
    """qgZ: ``loss_fn`` run under ``jax.shard_map`` over the mesh, each device on its own rows and
    its own parameter shards; the batch mean is the devices' mean.

    ``loss_fn`` must gather its parameters itself with the plan's manual gathers
    (:func:`model_gather`): under ``shard_map`` each gradient's partial sums are the devices' own
    arrays, which the gathers' backward quantizes before reducing. The leaves it does not gather
    (whole at rest) have their gradients summed by ``shard_map`` itself, at full precision.
    """
    param_specs = jax.tree.map(lambda s: s.spec, plan.params)
    unmapped = tuple((name, None) for name, _ in plan.rules)  # activations: each device's own

    def local(params, batch):
        with nn.logical_axis_rules((("batch", None), *unmapped)):
            return jax.lax.pmean(loss_fn(params, batch), plan.batch_axes)

    return jax.shard_map(local, mesh=plan.mesh, in_specs=(param_specs, plan.batch.spec), out_specs=P())
