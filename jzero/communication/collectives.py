"""Explicit collectives for code under ``jax.shard_map``: a shard gathered over some mesh axes, and
every device's partial sum reduced back to its shard, at full precision or quantized (ZeRO++'s
qgZ).

Under GSPMD a gradient's per-device partial sums are not values the program can read: XLA sums
them inside its reduce-scatter. qgZ has to quantize them before the sum, so its loss runs under
``shard_map`` (:func:`jzero.sharding.gathers.manual_loss`), where each partial is the device's own array.
The quantized reduction is an all-to-all per mesh axis: each device cuts its partial into one
chunk per peer, quantizes each chunk in blocks (so no block straddles two destinations), sends
them, and sums what it receives in float32 before the next axis's hop. Never a ``psum_scatter``
of int values: every device's scales differ, and the sums would overflow.

A spec's entry may hold several axes on one dimension, major first. Gathers run minor first and
reductions major first, so each hop's result is the contiguous chunk the next one splits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jzero.communication.quantize import Layout, dequantize, from_blocks, from_wire, quantize, to_wire

__all__ = ["gather_axes", "quantized_gather", "quantized_reduce_scatter", "reduce_scatter", "spec_axes"]


def _entry_axes(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def spec_axes(spec: P) -> list[str]:
    """The mesh axes a spec splits over, in order."""
    return [a for e in spec for a in _entry_axes(e)]


def _splits(spec: P, axes: Sequence[str]) -> list[tuple[int, str]]:
    """``(dimension, axis)`` for each of ``axes`` that ``spec`` splits over, major first."""
    return [(dim, a) for dim, e in enumerate(spec) for a in _entry_axes(e) if a in axes]


def gather_axes(x: jax.Array, spec: P, axes: Sequence[str]) -> jax.Array:
    """``x`` (a shard resting as ``spec``) all-gathered over those of ``axes`` that split it."""
    for dim, a in reversed(_splits(spec, axes)):
        x = jax.lax.all_gather(x, a, axis=dim, tiled=True)
    return x


def _kept(lay: Layout, axes: Sequence[str]) -> Layout:
    """``lay`` for the piece gathered over ``axes`` only: the other axes' parts dropped."""
    parts, shape, position = [], [], 0
    for dim_parts in lay.parts:
        names = lay.axes[position : position + len(dim_parts) - 1]
        position += len(names)
        kept = tuple(n for n, name in zip(dim_parts[:-1], names, strict=True) if name in axes) + (dim_parts[-1],)
        parts.append(kept)
        shape.append(math.prod(kept))
    return Layout(tuple(shape), tuple(parts), tuple(a for a in lay.axes if a in axes), lay.block)


def quantized_gather(x: jax.Array, lay: Layout, axes: Sequence[str], dtype: Any) -> jax.Array:
    """qwZ under ``shard_map``: ``x`` (the device's shard, in ``lay``'s blocks) quantized, its int8
    values and scales gathered over ``axes``, dequantized to ``dtype``."""
    flat = x.reshape(-1)
    pad = lay.blocks * lay.block - flat.size
    values, scales = quantize(jnp.pad(flat, (0, pad)).reshape(lay.blocks, lay.block))
    for a in reversed([a for a in lay.axes if a in axes]):  # each gather prepends its axis
        values = jax.lax.all_gather(values, a, axis=0)
        scales = jax.lax.all_gather(scales, a, axis=0)
    return from_blocks(dequantize(values, scales, dtype), _kept(lay, axes))


def reduce_scatter(ct: jax.Array, spec: P, axes: Sequence[str]) -> jax.Array:
    """Every device's ``ct`` summed over ``axes``, each device left its part as ``spec`` splits it
    (summed whole over the axes ``spec`` does not split)."""
    for dim, a in _splits(spec, axes):
        ct = jax.lax.psum_scatter(ct, a, scatter_dimension=dim, tiled=True)
    return _summed_over_the_rest(ct, spec, axes)


def quantized_reduce_scatter(ct: jax.Array, spec: P, axes: Sequence[str], width: str, block: int) -> jax.Array:
    """:func:`reduce_scatter` in ``width`` blocks of ``block`` elements: one all-to-all per axis,
    summed in float32 between the hops (the axes ``spec`` does not split: summed at full precision)."""
    x = ct.astype(jnp.float32)
    for dim, a in _splits(spec, axes):
        x = _all_to_all_sum(x, a, dim, width, block)
    return _summed_over_the_rest(x, spec, axes)


def _summed_over_the_rest(x: jax.Array, spec: P, axes: Sequence[str]) -> jax.Array:
    """``x`` summed over those of ``axes`` that ``spec`` does not split (the leaf is whole over them)."""
    rest = tuple(a for a in axes if a not in spec_axes(spec))
    return jax.lax.psum(x, rest) if rest else x


def _all_to_all_sum(x: jax.Array, axis: str, dim: int, width: str, block: int) -> jax.Array:
    """``x`` cut along ``dim`` into a chunk per device of ``axis``; each chunk sent in ``width``
    blocks to its device, which sums the chunks it receives in float32."""
    n = jax.lax.axis_size(axis)
    shape = x.shape
    chunk = (*shape[:dim], shape[dim] // n, *shape[dim + 1 :])
    rows = jnp.moveaxis(x.reshape(*shape[:dim], n, shape[dim] // n, *shape[dim + 1 :]), dim, 0).reshape(n, -1)
    size = rows.shape[1]
    blocks = -(-size // block)
    values, scales = quantize(jnp.pad(rows, ((0, 0), (0, blocks * block - size))).reshape(n, blocks, block), width)
    wire = jax.lax.all_to_all(to_wire(values, width), axis, 0, 0, tiled=True)
    scales = jax.lax.all_to_all(scales, axis, 0, 0, tiled=True)
    summed = dequantize(from_wire(wire, width), scales, jnp.float32).sum(axis=0)
    return summed.reshape(-1)[:size].reshape(chunk)
