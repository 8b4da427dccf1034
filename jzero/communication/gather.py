"""ZeRO-3's explicit gather: a unit's parameters whole just before its first use, released after,
gathered again in the backward, and its gradient reduce-scattered as soon as it is computed.

:func:`unit_call` is the mechanism, for one unit and a function of it. :func:`with_units` applies
it to a loss from outside, without touching the model: it traces the loss to a jaxpr, finds where
each unit's parameters are read, and runs each such stretch of the program as a :func:`unit_call`.
That works for any Flax linen or NNX model, a Hugging Face Flax model or a plain function of a
parameter dict, since all of them are one jaxpr once traced. A ``jit`` (``nn.jit``) or remat call
that reads several units is run in place first; units one ``custom_vjp`` reads together are left
to XLA, as without units.

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
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
from jax._src import source_info_util  # the op names of the traced program survive the replay
from jax.ad_checkpoint import checkpoint_name
from jax.extend.core import Literal, Var
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jzero.communication.collectives import gather_axes, quantized_gather, quantized_reduce_scatter, reduce_scatter, spec_axes
from jzero.communication.quantize import NONE, Layout, dequantize, from_blocks, quantize, to_blocks
from jzero.compiler.platforms import on_gpus
from jzero.trees import path_str

__all__ = [
    "CPU_UNIT_OPTIONS",
    "GPU_UNIT_OPTIONS",
    "UNIT_REMAT",
    "Region",
    "SAVE_SECONDARY",
    "SECONDARY",
    "UnitSpec",
    "gather",
    "gathering",
    "regions",
    "split_units",
    "tree_gather",
    "unit_call",
    "unit_options",
    "with_units",
]


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


# hpZ's secondary copy, by the name checkpoint policies save it under (:data:`SAVE_SECONDARY`).
SECONDARY = "jzero_hpz_secondary"


def _to(x: jax.Array, spec: UnitSpec, target: P, compute: Any) -> jax.Array:
    """``x`` (at rest) gathered to ``target`` in ``compute``: quantized where ``spec`` has a layout."""
    if spec.layout is not None:
        return _quantized_gather(x, spec, target, compute)
    return jax.lax.with_sharding_constraint(x.astype(compute), NamedSharding(spec.mesh, target))


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
    split, whole = NamedSharding(spec.mesh, spec.secondary), NamedSharding(spec.mesh, spec.whole)
    # Split again after the name, so that the copy is saved split, not as the whole it becomes;
    # inside the custom_vjp, so that the gradient is not reduced to it on the way back.
    return _passed_back(lambda x: jax.lax.with_sharding_constraint(jax.lax.with_sharding_constraint(x, split), whole), secondary)


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
# again). Two others were measured (benchmarks/units.py): saving everything but the gathered
# parameters kept what layout ops made of them (a reshaped scale, a transposed kernel), which held
# the gathered buffers into the backward; saving every matmul output kept attention's scores too.
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


@dataclasses.dataclass(frozen=True)
class Region:
    """A stretch of a loss's equations that reads one or more units' gathered leaves.

    Attributes:
      start, stop: the equations ``[start, stop)`` of the traced loss.
      leaves: the parameter leaves (flat indices) it gathers.
    """

    start: int
    stop: int
    leaves: tuple[int, ...]


def regions(reads: Sequence[set[int]], unit_of: dict[int, int]) -> list[Region]:
    """Where to gather: from the parameter leaves each equation reads, the stretches to run gathered.

    A unit's reads split into clusters wherever another unit is read in between (a tied embedding
    read at both ends of the model is gathered twice); clusters that share an equation merge.

    Args:
      reads: per equation, the parameter leaves (flat indices) it reads.
      unit_of: leaf -> unit, for the leaves to gather.

    Returns:
      The regions, in program order, none overlapping.
    """
    clusters: list[list] = []  # [start, stop, leaves]
    open_: dict[int, list] = {}  # unit -> its latest cluster
    previous = None
    for i, leaves in enumerate(reads):
        for leaf in sorted(leaf for leaf in leaves if leaf in unit_of):
            unit = unit_of[leaf]
            cluster = open_.get(unit)
            if cluster is None or (previous != unit and cluster[1] <= i):
                cluster = open_[unit] = [i, i + 1, set()]
                clusters.append(cluster)
            cluster[1] = i + 1
            cluster[2].add(leaf)
            previous = unit
    merged: list[list] = []
    for start, stop, leaves in sorted(clusters, key=lambda c: c[0]):
        if merged and start < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
            merged[-1][2] |= leaves
        else:
            merged.append([start, stop, set(leaves)])
    return [Region(start, stop, tuple(sorted(leaves))) for start, stop, leaves in merged]


def _run(eqns: Sequence[Any], env: dict) -> None:
    """Evaluate equations into ``env``, as ``jax.core.eval_jaxpr`` does, one stretch at a time."""
    for eqn in eqns:
        args = [a.val if isinstance(a, Literal) else env[a] for a in eqn.invars]
        name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
        with source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack), eqn.ctx.manager:
            out = eqn.primitive.bind(*args, **eqn.primitive.get_bind_params(eqn.params))
        for var, value in zip(eqn.outvars, out if eqn.primitive.multiple_results else [out], strict=True):
            if isinstance(var, Var):
                env[var] = value


def _reads(eqn: Any) -> list[Var]:
    return [a for a in eqn.invars if isinstance(a, Var)]


def _last_reads(jaxpr: Any) -> dict[Var, int]:
    """Each variable's last reader (an equation index; ``len(eqns)`` for the jaxpr's results)."""
    last = {v: i for i, eqn in enumerate(jaxpr.eqns) for v in _reads(eqn)}
    last.update({v: len(jaxpr.eqns) for v in jaxpr.outvars if isinstance(v, Var)})
    return last


def with_units(
    loss_fn: Callable[[Any, Any], jax.Array],
    units: dict[str, int],
    specs: dict[str, UnitSpec],
    *,
    compute_dtype: Any = None,
    prefetch: int = 1,
) -> Callable[[Any, Any], jax.Array]:
    """``loss_fn`` with its units' parameters gathered region by region (:func:`unit_call`).

    Units whose parameters one equation reads together (a ``custom_vjp`` around several layers)
    cannot be split: they are left to XLA, as with no units, and a warning says so in one line
    (:func:`split_units`).

    Args:
      loss_fn: ``loss_fn(params, batch)``.
      units: parameter path -> unit, for the parameters to gather.
      specs: parameter path -> :class:`UnitSpec`, for the same parameters.
      compute_dtype: the dtype the loss reads the parameters in (None: their own).
      prefetch: how many units ahead a gather may start (0: once the previous unit is done).

    Returns:
      A loss of the resting parameters, with the same value and gradient.
    """

    def loss(params, batch):
        t = _trace(loss_fn, units, params, batch, compute_dtype)
        for line in t.merged:
            warnings.warn(line, stacklevel=2)
        # Units gather (and cast) their own shards; the other leaves are read as they are, cast.
        leaves = [x if compute_dtype is None or i in t.unit_of else x.astype(compute_dtype) for i, x in enumerate(t.leaves)]
        jaxpr = t.closed.jaxpr
        env = dict(zip(jaxpr.constvars, t.closed.consts, strict=True))
        env.update(zip(jaxpr.invars, [*leaves, *jax.tree.leaves(batch)], strict=True))
        # Each region gathers its own leaves from the shards; nothing else reads them.
        dtype = {} if compute_dtype is None else {"compute_dtype": compute_dtype}
        specs_of = [[dataclasses.replace(specs[t.paths[i]], **dtype) for i in r.leaves] for r in t.found]
        return _replay(jaxpr, env, t.found, specs_of, prefetch)

    return loss


def split_units(
    loss_fn: Callable[[Any, Any], jax.Array], units: dict[str, int], params: Any, batch: Any, *, compute_dtype: Any = None
) -> tuple[dict[str, int], list[str]]:
    """The units :func:`with_units` can gather one at a time in ``loss_fn``, and why the others cannot.

    Args:
      loss_fn: ``loss_fn(params, batch)``.
      units: parameter path -> unit.
      params, batch: the loss's arguments, or their shapes (``jax.ShapeDtypeStruct``).
      compute_dtype: the dtype the loss reads the parameters in (None: their own).

    Returns:
      ``(units in effect, lines)``: ``units`` without those merged into one region, and one line
      per such region naming its units and the equation that reads them together.
    """
    t = _trace(loss_fn, units, params, batch, compute_dtype)
    return {t.paths[i]: unit for i, unit in t.unit_of.items()}, t.merged


@dataclasses.dataclass(frozen=True)
class _Traced:
    """A loss traced for :func:`with_units`: its flat jaxpr, the regions to gather and the merged units."""

    closed: Any
    leaves: list[Any]  # the parameter leaves, as given
    paths: list[str]
    unit_of: dict[int, int]  # leaf -> unit, for the units in effect
    found: list[Region]
    merged: list[str]


def _trace(loss_fn: Callable[..., jax.Array], units: dict[str, int], params: Any, batch: Any, compute_dtype: Any) -> _Traced:
    """``loss_fn`` traced, the calls that read several units opened (:func:`_opened`), and its regions."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    paths = [path_str(p) for p, _ in flat]
    avals = [jax.ShapeDtypeStruct(x.shape, compute_dtype or x.dtype) for _, x in flat]
    closed = jax.make_jaxpr(lambda ps, b: loss_fn(treedef.unflatten(ps), b))(avals, batch)
    unit_of = {i: units[p] for i, p in enumerate(paths) if p in units}
    closed = _opened(closed, unit_of)
    index = {v: i for i, v in enumerate(closed.jaxpr.invars[: len(flat)])}
    reads = [{index[v] for v in _reads(e) if v in index} for e in closed.jaxpr.eqns]
    found = regions(reads, unit_of)
    merged = [r for r in found if len({unit_of[i] for i in r.leaves}) > 1]
    if merged:  # left to XLA, as with no units: gathered once, where XLA places it
        names = _unit_names(units)
        lines = [_merged_line(r, reads, unit_of, closed.jaxpr.eqns, names) for r in merged]
        dropped = {unit_of[i] for r in merged for i in r.leaves}
        unit_of = {i: unit for i, unit in unit_of.items() if unit not in dropped}
        return _Traced(closed, [x for _, x in flat], paths, unit_of, regions(reads, unit_of), lines)
    return _Traced(closed, [x for _, x in flat], paths, unit_of, found, [])


def _unit_names(units: dict[str, int]) -> dict[int, str]:
    """unit -> its name: the path prefix its parameters share (a parameter alone: its path)."""
    parts: dict[int, list[str]] = {}
    for path, unit in units.items():
        # commonprefix compares lists element by element: whole path components.
        parts[unit] = os.path.commonprefix([parts.get(unit, path.split("/")), path.split("/")])
    return {unit: "/".join(p) for unit, p in parts.items()}


def _merged_line(region: Region, reads: Sequence[set[int]], unit_of: dict[int, int], eqns: Sequence[Any], names: dict) -> str:
    """One line naming a region's units and the equations that read them together."""
    units = sorted({unit_of[i] for i in region.leaves})
    span = range(region.start, region.stop)
    together = [eqns[k].primitive.name for k in span if len({unit_of[i] for i in reads[k] if i in unit_of}) > 1]
    first, last = names[units[0]], names[units[-1]]
    which = f"{first}..{last} ({len(units)} units)" if len(units) > 2 else f"{first} and {last}"
    by = f"one {together[0]}" if len(together) == 1 else ", ".join(dict.fromkeys(together))
    return f"units: {which} merged into one region (their parameters are read by {by}); XLA gathers them, as without units"


# Calls with no derivative rule of their own, whose bodies can run in place (a custom_jvp or
# custom_vjp cannot: its rule covers its whole body).
_CALLS = frozenset({"jit", "closed_call", "call", "remat2"})


def _opened(closed: Any, unit_of: dict[int, int]) -> Any:
    """``closed`` with every call that reads two units' parameters run in place, nested ones too
    (an ``nn.jit`` model is one ``jit`` equation otherwise); the same jaxpr when there is none."""
    tags = [frozenset({unit_of[i]}) if i in unit_of else frozenset() for i in range(len(closed.jaxpr.invars))]
    if not any(_opens(e, dict(zip(closed.jaxpr.invars, tags, strict=True))) for e in closed.jaxpr.eqns):
        return closed
    avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type) for v in closed.jaxpr.invars]
    return jax.make_jaxpr(lambda *args: _inlined(closed.jaxpr, closed.consts, args, tags))(*avals)


def _units_read(eqn: Any, tag: dict) -> set[int]:
    return set().union(*(tag.get(v, ()) for v in _reads(eqn)))


def _opens(eqn: Any, tag: dict) -> bool:
    return eqn.primitive.name in _CALLS and len(_units_read(eqn, tag)) > 1


def _inlined(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], tags: Sequence[frozenset]) -> list[Any]:
    """Evaluate ``jaxpr`` as :func:`_run` does, running in place the calls that read two units
    (``tags``: the units each argument is a parameter of)."""
    env = dict(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    tag = {v: t for v, t in zip(jaxpr.invars, tags, strict=True) if t}
    for eqn in jaxpr.eqns:
        if not _opens(eqn, tag):
            _run([eqn], env)
            continue
        body = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
        body, body_consts = (body.jaxpr, body.consts) if hasattr(body, "consts") else (body, ())
        inner = [tag.get(a, frozenset()) if isinstance(a, Var) else frozenset() for a in eqn.invars]
        name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
        with source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack):
            out = _inlined(body, body_consts, [_value(a, env) for a in eqn.invars], inner)
        env.update(zip(eqn.outvars, out, strict=True))
    return [_value(a, env) for a in jaxpr.outvars]


def _value(a: Any, env: dict) -> Any:
    return a.val if isinstance(a, Literal) else env[a]


def _replay(jaxpr: Any, env: dict, found: list[Region], specs_of: list[list[UnitSpec]], prefetch: int) -> Any:
    """Run the jaxpr's equations into ``env``, each region as a :func:`unit_call`."""
    last = _last_reads(jaxpr)
    params = jaxpr.invars
    done, token, inputs_of = 0, None, []
    for region, specs in zip(found, specs_of, strict=True):
        _run(jaxpr.eqns[done : region.start], env)
        body = jaxpr.eqns[region.start : region.stop]
        mine = [params[i] for i in region.leaves]
        defined = {v for e in body for v in e.outvars}
        inputs = [v for v in dict.fromkeys(v for e in body for v in _reads(e)) if v not in defined and v not in mine]
        outputs = [
            v for v in dict.fromkeys(v for e in body for v in e.outvars) if isinstance(v, Var) and last.get(v, -1) >= region.stop
        ]
        inputs_of.append([env[v] for v in inputs])
        back = len(inputs_of) - 1 - prefetch
        after = (inputs_of[back] if back >= 0 else [], [] if token is None else [token])

        def fn(gathered, *args, body=body, mine=mine, inputs=inputs, outputs=outputs):
            local = dict(zip(mine, gathered, strict=True))
            local.update(zip(inputs, args, strict=True))
            _run(body, local)
            return [local[v] for v in outputs]

        values, token = unit_call(fn, [env[v] for v in mine], specs, *inputs_of[-1], after=after)
        env.update(zip(outputs, values, strict=True))
        done = region.stop
    _run(jaxpr.eqns[done:], env)
    out = [a.val if isinstance(a, Literal) else env[a] for a in jaxpr.outvars]
    return out[0] if len(out) == 1 else out


# XLA's CPU pipeline removes optimization barriers before its last CSE pass, which then merges each
# rematerialised computation with the forward's (measured: a gathering unit's backward all-gather
# disappears, and every unit stays gathered from the forward to the backward). GPU pipelines remove
# them only after scheduling.
CPU_UNIT_OPTIONS: dict[str, str] = {"xla_disable_hlo_passes": "cse_barrier_expander"}
# With units, each unit's gradient is reduce-scattered as the backward leaves it: combined, XLA held
# every unit's gradient for one reduce-scatter at the end (benchmarks/units.py, data=4 x model=2 on
# h100x8: 3.33 layers' worth gathered at once, 2.20 with this; data=8 unchanged at 2.13).
GPU_UNIT_OPTIONS: dict[str, int] = {"xla_gpu_reduce_scatter_combine_threshold_bytes": 0}


def unit_options(devices: Sequence[Any]) -> dict[str, str | int]:
    """What a step that gathers by units needs from XLA on ``devices``: :data:`GPU_UNIT_OPTIONS`
    on GPUs, :data:`CPU_UNIT_OPTIONS` on CPUs. The step's own ``jax.jit`` carries them."""
    return dict(GPU_UNIT_OPTIONS if on_gpus(devices) else CPU_UNIT_OPTIONS)
