"""The ZeRO partition over the data axes: which mesh axes a stage splits a tensor over, and on which
dimension (``D`` in :mod:`jzero.sharding.plan`), and what a shard holds."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jzero.dtypes import array_bytes
from jzero.sharding.axes import BATCH_AXES, DATA, LAYERS, REPLICA
from jzero.sharding.rules import axes_of

__all__ = ["data_partition", "drop_first", "hierarchy", "shard_bytes", "without_axis", "zero_axes"]


def without_axis(entry: Any, axis: str) -> Any:
    rest = tuple(a for a in axes_of(entry) if a != axis)
    return rest[0] if len(rest) == 1 else (rest or None)


def drop_first(spec: P, ndim: int) -> P:
    return P(*(list(spec) + [None] * (ndim - len(spec)))[1:])


def shard_bytes(shape: Sequence[int], dtype: Any, spec: P, mesh: Mesh) -> int:
    return array_bytes(NamedSharding(mesh, spec).shard_shape(tuple(shape)), dtype)


def zero_axes(mesh: Mesh) -> tuple[str, ...]:
    """The axes ZeRO partitions model states over: ``data``, then every other axis of size > 1
    except ``replica`` (whose groups keep whole copies; under hpZ it goes with ``data``, see
    :func:`data_partition`).

    A tensor the model axis does not split is held whole by every device of that axis; ZeRO then
    partitions it over ``model`` too, so per-device bytes fall by N_d x N_m as the paper assumes.
    """
    others = tuple(a for a in mesh.axis_names if a not in BATCH_AXES and int(mesh.shape[a]) > 1)
    return (DATA, *others)


def hierarchy(mesh: Mesh, hpz: bool, qgz: bool) -> tuple[str, ...]:
    """hpZ's primary partition: ``replica`` and ``data`` on one dimension, major first (empty without hpZ).

    In mesh order, one GSPMD reduce-scatter over all devices reduces the gradient. Under qgZ,
    ``data`` major: a device's secondary slice (its ``data`` chunk) is then the ``replica`` gather
    of its own lane's primary shards, and the gradient's two hops run within the host, then across.
    """
    if not hpz:
        return ()
    return (DATA, REPLICA) if qgz else tuple(a for a in mesh.axis_names if a in (REPLICA, DATA))


def data_partition(
    shape: tuple[int, ...], spec: P, mesh: Mesh, logical: tuple | None = None, hierarchy: tuple[str, ...] = ()
) -> tuple[P, int | None]:
    """Add the ZeRO axes (:func:`zero_axes`) to ``spec``: returns (D spec, the dim ``data`` went on, or None).

    ``data`` goes on the best dimension it divides (with a ``hierarchy``, hpZ's primary partition:
    those axes together on one dimension, major first; see :func:`hierarchy`); then each other
    ZeRO axis the spec leaves unused goes on the best dimension that still divides, if any.
    """
    entries = list(spec) + [None] * (len(shape) - len(spec))
    if any(DATA in axes_of(e) for e in entries):
        return P(*entries), None
    logical = tuple(logical) if logical else (None,) * len(shape)

    def rank(dim: int) -> tuple:
        # The scan axis last, then dims no model axis uses, then larger first, then earlier first.
        return (logical[dim] == LAYERS, entries[dim] is not None, -shape[dim], dim)

    def place(new: tuple[str, ...]) -> int | None:
        for dim in sorted(range(len(shape)), key=rank):
            axes = axes_of(entries[dim])
            factor = math.prod(int(mesh.shape[a]) for a in (*axes, *new))
            if shape[dim] % factor == 0:
                entries[dim] = (*axes, *new) if axes or len(new) > 1 else new[0]
                return dim
        return None

    data_dim = None
    if hierarchy and int(mesh.shape.get(REPLICA, 1)) > 1:
        data_dim = place(hierarchy)
    if data_dim is None:  # hpZ's partition does not divide: ``data`` alone (plan lists it)
        data_dim = place((DATA,))
    if data_dim is not None:
        used = {a for e in entries for a in axes_of(e)}
        for axis in zero_axes(mesh)[1:]:
            if axis not in used:
                place((axis,))
    return P(*entries), data_dim
