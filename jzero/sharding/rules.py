"""Model parallelism as specs: logical axis names to mesh axes through the rules, and path rules.

Every tensor's model-parallel spec (``R`` in :mod:`jzero.sharding.plan`) comes from here: a path
rule that matches its path, else its logical names (Flax's ``nn.with_logical_partitioning``) mapped
through ``partitioning.rules`` (:func:`default_rules` when unset).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
from flax import nnx
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jzero.errors import PlanError
from jzero.sharding.axes import BATCH_AXES, DATA, LAYERS, MODEL, REPLICA
from jzero.trees import path_str

__all__ = [
    "axes_of",
    "check_path_rules",
    "default_rules",
    "logical_names",
    "logical_to_mesh",
    "model_spec",
    "normal_rules",
]


def default_rules(axis_names: Sequence[str]) -> list[list]:
    """Megatron-style logical-axis rules: heads (query, key and value), MLP hidden and vocabulary on ``model``; the batch on
    ``data`` (and ``replica`` when the mesh has one); everything else unsharded by the rules.

    Args:
      axis_names: the mesh's axis names.

    Returns:
      An ordered list of ``[logical_name, mesh_axis_or_axes_or_None]``; the first match wins.
    """
    batch = [a for a in BATCH_AXES if a in axis_names] if REPLICA in axis_names else DATA
    return [
        ["batch", batch],
        ["vocab", MODEL],
        ["embed", None],
        ["heads", MODEL],
        ["kv_heads", MODEL],  # grouped-query attention's key and value heads
        ["kv", None],
        ["mlp", MODEL],
        [LAYERS, None],
        ["length", None],
        ["activation_length", MODEL],  # the sequence of saved activations, when they are partitioned
    ]


def logical_names(params: Any) -> dict[str, tuple | None]:
    """Each parameter's logical axis names, by path: from linen ``Partitioned`` boxes or from the
    ``sharding`` metadata of NNX variables. Unannotated parameters map to None."""
    get_spec = nnx.get_partition_spec if isinstance(params, nnx.State) else nn.get_partition_spec
    specs = jax.tree_util.tree_flatten_with_path(get_spec(params), is_leaf=lambda x: isinstance(x, P))[0]
    return {path_str(path): (tuple(spec) if isinstance(spec, P) and len(spec) else None) for path, spec in specs}


def axes_of(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def logical_to_mesh(name: str | None, rules: Sequence[Sequence[Any]]) -> Any:
    """The first rule for ``name`` wins; an unnamed or unruled dimension is unsharded.

    Unlike Flax's resolver this never silently drops an axis already used in the same spec, so a
    rule table that uses one mesh axis twice in a tensor is reported rather than half-applied.
    """
    for logical, axis in rules:
        if logical == name:
            return tuple(axis) if isinstance(axis, list) else axis
    return None


def model_spec(path: str, shape: tuple[int, ...], logical: tuple | None, mesh: Mesh, rules, path_rules=()) -> P:
    """The tensor's model-parallel spec, from the first matching path rule, else its logical names
    through ``rules``; checks that each axis exists, divides its dimension and is used once."""
    where = f"{path} {list(shape)}"
    mesh_axes = None
    for pattern, spec in path_rules:
        if re.search(pattern, path):
            if len(spec) != len(shape):
                gives = f"path rule {pattern!r} gives {len(spec)} dims, not {len(shape)}"
                raise PlanError(where, f"{gives} (partitioning.path_rules)")
            mesh_axes = [tuple(a) if isinstance(a, list) else a for a in spec]
            break
    if mesh_axes is None and logical:
        mesh_axes = [logical_to_mesh(name, rules) for name in logical]
    if mesh_axes is None:
        return P(*([None] * len(shape)))
    entries, used = [], set()
    for dim, (size, entry) in enumerate(zip(shape, mesh_axes, strict=True)):
        axes = axes_of(entry)
        for axis in axes:
            if axis not in mesh.shape:
                raise PlanError(where, f"mesh axis {axis!r} does not exist (partitioning.rules)")
            if axis in used:
                raise PlanError(where, f"mesh axis {axis!r} used twice (partitioning.rules)")
            used.add(axis)
        factor = math.prod(int(mesh.shape[a]) for a in axes)
        if size % factor:
            problem = f"dimension {dim} ({size}) is not divisible by mesh axis {entry!r} ({factor})"
            raise PlanError(where, f"{problem} (partitioning.rules)")
        # A size-1 axis splits nothing; leaving it out keeps the dim free for ZeRO and specs legible.
        real = tuple(a for a in axes if int(mesh.shape[a]) > 1)
        entries.append(real[0] if len(real) == 1 else (real or None))
    return P(*entries)


def check_path_rules(path_rules: Sequence[Sequence[Any]], paths: Sequence[str]) -> None:
    """Each path rule places at least one parameter. A rule that matches no path, or only paths an
    earlier rule places (the first match wins), is a typo that would leave its tensors replicated.

    Raises:
      PlanError: naming the first such rule (``partitioning.path_rules[i]``), or a regex that is not one.
    """
    placed: set[int] = set()
    for path in paths:
        placed.add(next((i for i, rule in enumerate(path_rules) if _search(rule, i, path)), -1))
    for i, rule in enumerate(path_rules):
        if i not in placed and paths:
            where, pattern = f"partitioning.path_rules[{i}]", rule[0]
            shadowed = next((p for p in paths if _search(rule, i, p)), None)
            if shadowed is None:
                nearest = difflib.get_close_matches(pattern, paths, n=1, cutoff=0)[0]
                raise PlanError(where, f"{pattern!r} matches no parameter path (the nearest is {nearest!r})")
            earlier = f"an earlier rule places every path it matches ({shadowed!r}, ...)"
            raise PlanError(where, f"{pattern!r} places nothing: {earlier}")


def _search(rule: Sequence[Any], i: int, path: str) -> bool:
    try:
        return re.search(rule[0], path) is not None
    except (re.error, TypeError) as err:
        raise PlanError(f"partitioning.path_rules[{i}]", f"bad regex {rule[0]!r}: {err}") from None


def normal_rules(rules: Sequence[Sequence[Any]] | None, mesh: Mesh) -> tuple[tuple[str, Any], ...]:
    """The rule table as ``(name, axis)`` tuples, a list of axes made a tuple (default: :func:`default_rules`)."""
    if rules is None:
        rules = default_rules(mesh.axis_names)
    return tuple((name, tuple(axis) if isinstance(axis, list) else axis) for name, axis in rules)
