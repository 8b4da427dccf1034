"""Gathering units applied to a loss from outside, without touching the model.

:func:`with_units` traces the loss to a jaxpr, finds where each unit's parameters are read, and runs
each such stretch of the program as a :func:`jzero.communication.gather.unit_call`. That works for
any Flax linen or NNX model, a Hugging Face Flax model or a plain function of a parameter dict,
since all of them are one jaxpr once traced. A ``jit`` (``nn.jit``) or remat call that reads several
units is run in place first; units one ``custom_vjp`` reads together are left to XLA, as without
units (:func:`split_units`).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax._src import source_info_util  # the op names of the traced program survive the replay
from jax.extend.core import Literal, Var

from jzero.communication.gather import UnitSpec, unit_call
from jzero.trees import path_str

__all__ = ["Region", "regions", "split_units", "with_units"]


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
