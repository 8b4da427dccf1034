"""ZeRO-3's explicit gather: a unit's parameters whole just before its first use, released after,
gathered again in the backward, and its gradient reduce-scattered as soon as it is computed.

:func:`unit_call` is the mechanism, for one unit and a function of it;
:func:`jzero.communication.loss_units.with_units` applies it to a loss from outside, without
touching the model.

Why each piece is there:

- A ``custom_vjp`` gathers a leaf (``with_sharding_constraint`` to its whole
  spec, after one to its resting spec). Its backward constrains the gradient straight to the
  resting spec, so XLA reduce-scatters the devices' partial sums (GPU) instead of all-reducing a
  whole copy first, in the reduce dtype. Under qgZ's ``shard_map`` (a spec with ``manual`` axes)
  the same ``custom_vjp`` all-gathers explicitly and reduces by quantized all-to-alls
  (:mod:`jzero.communication.collectives`).
- ``jax.checkpoint`` with :data:`_SAVED` (JAX's ``dots_with_no_batch_dims_saveable``): the forward
  keeps the unit's projections' outputs, not its whole parameters, and the backward gathers them again. Its
  ``prevent_cse`` barrier runs on the unit's cotangents, so that gather waits until the backward
  reaches the unit.
- ``optimization_barrier`` ties the shards, inside the checkpoint, to what the gather must wait
  for: the inputs of the unit ``prefetch`` units back, and a scalar of the previous unit's gathered
  tensors. Without units XLA schedules the gathers early (``benchmarks/units.py``: 6.1 layers'
  worth of 6 held at once); the first tie stops that, the second keeps the gathers in order, so
  GPU XLA's combiner cannot merge two units' gathers into one op.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jzero.communication.collectives import gather_axes, quantized_gather, quantized_reduce_scatter, reduce_scatter, spec_axes
from jzero.communication.quantize import NONE, Layout, dequantize, from_blocks, quantize, to_blocks
from jzero.compiler.platforms import on_gpus
from jzero.lazy import moved_names
from jzero.memory import float8
from jzero.trees import path_str

__all__ = [
    "CPU_UNIT_OPTIONS",
    "GPU_UNIT_OPTIONS",
    "UNIT_REMAT",
    "SAVE_SECONDARY",
    "SECONDARY",
    "UnitSpec",
    "gather",
    "gathering",
    "tree_gather",
    "unit_call",
    "unit_options",
]
_MOVED = ("Region", "regions", "split_units", "with_units")
__getattr__ = moved_names(__name__, {name: f"jzero.communication.loss_units.{name}" for name in _MOVED})


@dataclasses.dataclass(frozen=True)
class UnitSpec:
    """How one parameter leaf is gathered.

    Attributes:
      mesh: the device mesh.
      resting: its spec at rest (the stage's ``PartitionSpec``).
      whole: its spec once gathered (the model axes only).
      reduce_dtype: the dtype its gradient is reduce-scattered in (None: the parameter's).
      compute_dtype: the dtype it is gathered and read in (None: the parameter's).
      layout: qwZ's blocks on the resting shards (:func:`jzero.communication.quantize.layout`): the leaf is
        gathered as int8 values and a scale per block, dequantized to the compute dtype. None:
        gathered in the compute dtype.
      secondary: hpZ's secondary partition (the resting spec without ``replica``), or None.
      manual: under qgZ, the batch axes of the ``shard_map`` the gather runs in
        (:func:`jzero.sharding.gathers.manual_loss`): it gathers with explicit collectives over them, and its
        gradient is reduced over them by all-to-alls. Empty: GSPMD places the collectives.
      grad_width: under ``manual``, qgZ's width (``int8``, ``int4``); none: reduced in ``reduce_dtype``.
      grad_block: the gradient's elements per scale (:meth:`jzero.sharding.plan.Plan.gradient_blocks`).
      fp8: gathered in float8 (e4m3) with one scale from the whole leaf's largest magnitude
        (``zero.fp8_gather``), and cast back to the compute dtype once whole.
    """

    mesh: Any
    resting: P
    whole: P
    reduce_dtype: Any = None
    compute_dtype: Any = None
    layout: Layout | None = None
    secondary: P | None = None
    manual: tuple[str, ...] = ()
    grad_width: str = NONE
    grad_block: int = 0
    fp8: bool = False


# hpZ's secondary copy, by the name checkpoint policies save it under (:data:`SAVE_SECONDARY`).
SECONDARY = "jzero_hpz_secondary"


def _to(x: jax.Array, spec: UnitSpec, target: P, compute: Any) -> jax.Array:
    """``x`` (at rest) gathered to ``target`` in ``compute``: quantized where ``spec`` has a layout."""
    if spec.layout is not None:
        return _quantized_gather(x, spec, target, compute)
    if spec.fp8:
        return _float8_gather(x, spec, target, compute)
    return jax.lax.with_sharding_constraint(x.astype(compute), NamedSharding(spec.mesh, target))


def _float8_gather(x: jax.Array, spec: UnitSpec, target: P, compute: Any) -> jax.Array:
    """``x`` (at rest) cast to float8 on its own shards with the whole tensor's scale (XLA reduces
    the shards' largest magnitudes: one all-reduce of a scalar), gathered to ``target`` as float8,
    and cast to ``compute``."""
    resting = NamedSharding(spec.mesh, spec.resting)
    values, scale = float8.scaled_cast(jax.lax.with_sharding_constraint(x, resting), float8.E4M3)
    # As qwZ's: without the barrier XLA may cast after the gather, which then sends the wide type.
    values = jax.lax.optimization_barrier(jax.lax.with_sharding_constraint(values, resting))
    whole = jax.lax.with_sharding_constraint(values, NamedSharding(spec.mesh, target))
    return (whole.astype(jnp.float32) * scale).astype(compute)


def _secondary(x: jax.Array, spec: UnitSpec, compute: Any) -> jax.Array:
    """hpZ: the secondary copy of ``x`` (at rest), sliced from the forward's gather over all devices."""
    # The barrier keeps the gather whole: otherwise XLA sees only the slice used and gathers that.
    whole = jax.lax.optimization_barrier(_to(x, spec, spec.whole, compute))
    return jax.lax.with_sharding_constraint(whole, NamedSharding(spec.mesh, spec.secondary))


def _quantized_gather(x: jax.Array, spec: UnitSpec, target: P, compute: Any) -> jax.Array:
    """qwZ: ``x`` (at rest) quantized on its own shards, gathered to ``target`` as int values and
    scales, and dequantized."""
    lay, mesh = spec.layout, spec.mesh
    kept = spec_axes(target)
    values, scales = quantize(jax.lax.with_sharding_constraint(to_blocks(x, lay), NamedSharding(mesh, lay.spec(lay.axes))))
    # Without the barrier CPU XLA moves the int conversion after the gather, which then sends f32.
    values, scales = jax.lax.optimization_barrier((values, scales))
    values = jax.lax.with_sharding_constraint(values, NamedSharding(mesh, lay.spec(kept)))
    scales = jax.lax.with_sharding_constraint(scales, NamedSharding(mesh, lay.scale_spec(kept)))
    return jax.lax.with_sharding_constraint(from_blocks(dequantize(values, scales, compute), lay), NamedSharding(mesh, target))


def gather(shard: jax.Array, spec: UnitSpec) -> jax.Array:
    """One parameter leaf whole (the all-gather, in the compute dtype, or quantized); in the backward its
    gradient goes straight from the devices' partial sums to the resting spec (a reduce-scatter, in
    the reduce dtype), never through a whole, all-reduced copy. Quantized, the backward is the same:
    straight through.

    With hpZ the leaf goes whole through its secondary copy, named :data:`SECONDARY` between two
    ``custom_vjp`` s (a checkpoint policy sees no name inside one): the backward's recomputation
    then gathers it from the saved copy, within the host, and the gradient still goes to the
    resting spec in one reduce-scatter."""
    compute = spec.compute_dtype or shard.dtype
    if spec.manual:
        return _manual_gather(shard, spec, compute)
    if spec.secondary is None:
        return _reduced_back(lambda x: _to(x, spec, spec.whole, compute), shard, spec)
    secondary = checkpoint_name(_reduced_back(lambda x: _secondary(x, spec, compute), shard, spec), SECONDARY)
    # Split again after the name, so that the copy is saved split, not as the whole it becomes;
    # inside the custom_vjp, so that the gradient is not reduced to it on the way back.
    return _passed_back(lambda x: _from_secondary(x, spec), secondary)


def _from_secondary(x: jax.Array, spec: UnitSpec) -> jax.Array:
    """hpZ: the leaf whole from its secondary copy ``x`` (a gather within the host); in float8 with
    ``spec.fp8``, its scale the copy's own largest magnitude (the forward's, to float8's rounding)."""
    split = NamedSharding(spec.mesh, spec.secondary)
    x = jax.lax.with_sharding_constraint(x, split)
    if not spec.fp8:
        return jax.lax.with_sharding_constraint(x, NamedSharding(spec.mesh, spec.whole))
    return _float8_gather(x, dataclasses.replace(spec, resting=spec.secondary), spec.whole, x.dtype)


def _reduced_back(fn: Callable[[jax.Array], jax.Array], shard: jax.Array, spec: UnitSpec) -> jax.Array:
    """``fn`` of the leaf pinned to its resting spec; the backward constrains the cotangent to that
    spec, in the reduce dtype."""
    reduce = spec.reduce_dtype or shard.dtype
    resting = NamedSharding(spec.mesh, spec.resting)

    @jax.custom_vjp
    def jzero_gather(x):
        # Pinned to the resting spec first: otherwise sharding propagation moves the backward's
        # gather above the checkpoint's barrier, where XLA merges it with the forward's.
        return fn(jax.lax.with_sharding_constraint(x, resting))

    def backward(_, ct):
        return (jax.lax.with_sharding_constraint(ct.astype(reduce), resting).astype(shard.dtype),)

    jzero_gather.defvjp(lambda x: (jzero_gather(x), None), backward)
    return jzero_gather(shard)


def _passed_back(fn: Callable[[jax.Array], jax.Array], x: jax.Array) -> jax.Array:
    """``fn`` of ``x``, its cotangent passed back unconstrained (a reshard, not a reduction)."""

    @jax.custom_vjp
    def jzero_regather(v):
        return fn(v)

    jzero_regather.defvjp(lambda v: (jzero_regather(v), None), lambda _, ct: (ct,))
    return jzero_regather(x)


def _manual_gather(shard: jax.Array, spec: UnitSpec, compute: Any) -> jax.Array:
    """:func:`gather` under qgZ's ``shard_map``: explicit all-gathers over the batch axes, and a
    backward that reduces the devices' partial gradients by quantized all-to-alls
    (:func:`jzero.communication.collectives.quantized_reduce_scatter`). With hpZ, two hops each way: across the
    hosts (``replica``) to the secondary copy, named :data:`SECONDARY` between them, then within."""
    if spec.secondary is None:
        return _manually_reduced(lambda x: _gathered(x, spec, spec.manual, compute), shard, spec, spec.resting, spec.manual)
    inner = tuple(a for a in spec.manual if a in spec_axes(spec.secondary))
    outer = tuple(a for a in spec.manual if a not in inner)
    secondary = _manually_reduced(lambda x: _gathered(x, spec, outer, compute), shard, spec, spec.resting, outer)
    secondary = checkpoint_name(secondary, SECONDARY)
    within = dataclasses.replace(spec, resting=spec.secondary, layout=None)  # the copy is dequantized already
    return _manually_reduced(lambda x: _gathered(x, within, inner, compute), secondary, spec, spec.secondary, inner)


def _gathered(x: jax.Array, spec: UnitSpec, axes: tuple[str, ...], compute: Any) -> jax.Array:
    if spec.layout is not None:
        return quantized_gather(x, spec.layout, axes, compute)
    if spec.fp8:  # the whole tensor's scale, over every manual axis: hpZ's two hops round alike
        scale = float8.scale_for(jax.lax.pmax(jnp.max(jnp.abs(x.astype(jnp.float32))), spec.manual), float8.E4M3)
        values = float8.cast(x, float8.E4M3, scale)
        return (gather_axes(values, spec.resting, axes).astype(jnp.float32) * scale).astype(compute)
    return gather_axes(x.astype(compute), spec.resting, axes)


def _manually_reduced(
    fn: Callable[[jax.Array], jax.Array], x: jax.Array, spec: UnitSpec, resting: P, axes: tuple[str, ...]
) -> jax.Array:
    """``fn(x)``, whose backward sums every device's cotangent over ``axes`` down to ``x``'s part
    (``x`` resting as ``resting``): quantized where ``spec`` has a gradient width."""
    reduce = spec.reduce_dtype or x.dtype

    @jax.custom_vjp
    def jzero_gather(v):
        return fn(v)

    def backward(_, ct):
        if spec.grad_width != NONE:
            ct = quantized_reduce_scatter(ct, resting, axes, spec.grad_width, spec.grad_block)
        else:
            ct = reduce_scatter(ct.astype(reduce), resting, axes)
        return (ct.astype(x.dtype),)

    jzero_gather.defvjp(lambda v: (jzero_gather(v), None), backward)
    return jzero_gather(x)


def tree_gather(specs: dict[str, UnitSpec]) -> Callable[[str, Any], Any]:
    """A model's own gather: ``gather(prefix, tree)`` gathers each leaf of ``tree`` whose path under
    ``prefix`` has a spec (:func:`gather`), and leaves the others as they are.

    jzero's GPT calls it on each block's parameters inside its scan (:func:`gathering`), and on the
    embedding and the head, so that stage 3 gathers each layer explicitly, quantized under qwZ.
    """

    def gather_tree(prefix: str, tree: Any) -> Any:
        def one(path, x):
            name = "/".join(filter(None, (prefix, path_str(path))))
            return gather(x, specs[name]) if name in specs else x

        return jax.tree_util.tree_map_with_path(one, tree)

    return gather_tree


def gathering(module: Any, gather_tree: Callable[[str, Any], Any] | None, prefix: str) -> Any:
    """A Flax linen module class whose parameters go through ``gather_tree(prefix, params)`` where it
    runs (the class unchanged when ``gather_tree`` is None). Wrap the layer a scan repeats, before
    ``nn.remat``: the rematerialised backward then gathers its layer again."""
    if gather_tree is None:
        return module

    def trans_in(variables):  # {collection: tree}
        return {**variables, "params": gather_tree(prefix, variables["params"])}

    return nn.map_variables(module, "params", trans_in_fn=trans_in, init=False)


# The unit's checkpoint policy: keep the projections' outputs (matmuls without batch dimensions),
# redo the rest, attention's batched products and the gathered parameters included (gathered
# again). The other policies kept gathered buffers or attention's scores into the backward
# (docs/units.md, "How it works").
UNIT_REMAT = "dots_with_no_batch_dims_saveable"
_SAVED = getattr(jax.checkpoint_policies, UNIT_REMAT)
# hpZ: every checkpoint around a gather keeps the secondary copy too.
SAVE_SECONDARY = jax.checkpoint_policies.save_only_these_names(SECONDARY)


def _token(gathered: Any, specs: Any) -> jax.Array | None:
    """A scalar that exists once the unit is gathered: one element of its smallest tensor that
    every device holds whole (a local read), or None when no tensor is whole everywhere."""
    pairs = zip(jax.tree.leaves(gathered), jax.tree.leaves(specs, is_leaf=_is_spec), strict=True)
    whole = [x for x, spec in pairs if not any(spec.whole)]
    return min(whole, key=lambda x: x.size).reshape(-1)[0] if whole else None


def _is_spec(x: Any) -> bool:
    return isinstance(x, UnitSpec)


def _tie(shards: Any, after: Any) -> Any:
    """``shards`` as values that exist only once ``after`` does (no gradient flows into ``after``)."""
    if not jax.tree.leaves(after):
        return shards
    tied, _ = jax.lax.optimization_barrier((shards, after))
    return tied


def unit_call(fn: Callable[..., Any], shards: Any, specs: Any, *args: Any, after: Any = ()) -> tuple[Any, jax.Array]:
    """``fn(gathered, *args)`` with ``shards`` gathered just before and released after.

    Args:
      fn: a function of the unit's whole parameters and ``args``.
      shards: the unit's parameters as they rest (a pytree).
      specs: a :class:`UnitSpec` per leaf of ``shards`` (same structure).
      *args: the unit's other inputs.
      after: values the gather waits for (the prefetch point; ``()`` for none).

    Returns:
      ``(fn's result, token)``: the token (:func:`_token`) exists once the unit is gathered; pass
      it in the next unit's ``after`` to keep the gathers in order.
    """

    def unit(shards, args, after):
        # Tied inside the checkpoint: the backward regathers from the resting shards themselves.
        gathered = jax.tree.map(gather, _tie(shards, after), specs)
        return fn(gathered, *args), _token(gathered, specs)

    policy = jax.checkpoint_policies.save_from_both_policies(_SAVED, SAVE_SECONDARY)
    return jax.checkpoint(unit, policy=policy, prevent_cse=True)(shards, args, jax.lax.stop_gradient(after))


# XLA's CPU pipeline removes optimization barriers before its last CSE pass, which then merges each
# rematerialised computation with the forward's: a gathering unit's backward all-gather disappears,
# and every unit stays gathered from the forward to the backward (docs/design.md, "The CPU
# backend", "Remat saves memory only under a loop, unless a pass is turned off"). GPU pipelines
# remove them only after scheduling.
CPU_UNIT_OPTIONS: dict[str, str] = {"xla_disable_hlo_passes": "cse_barrier_expander"}
# With units, each unit's gradient is reduce-scattered as the backward leaves it: combined, XLA held
# every unit's gradient for one reduce-scatter at the end (docs/units.md, "What it does, measured").
GPU_UNIT_OPTIONS: dict[str, int] = {"xla_gpu_reduce_scatter_combine_threshold_bytes": 0}


def unit_options(devices: Sequence[Any]) -> dict[str, str | int]:
    """What a step that gathers by units needs from XLA on ``devices``: :data:`GPU_UNIT_OPTIONS`
    on GPUs, :data:`CPU_UNIT_OPTIONS` on CPUs. The step's own ``jax.jit`` carries them."""
    return dict(GPU_UNIT_OPTIONS if on_gpus(devices) else CPU_UNIT_OPTIONS)
