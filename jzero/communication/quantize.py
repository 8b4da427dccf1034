"""Block-wise symmetric quantization laid out on a tensor's shards (ZeRO++'s qwZ).

A tensor sharded over a mesh is viewed as ``[f_1, ..., f_k, blocks, block]``: one leading
dimension per mesh axis that splits it (its size, that axis's), then each device's own shard,
flattened in row-major order and cut into blocks of ``block`` elements (the last padded with zeros
where ``block`` does not divide a large shard). Every block lies inside
one device's shard, so quantizing the resting shards and gathering the int values gives bit for
bit what gathering first and quantizing the whole would. The view is reshapes and one transpose
that keep each element on its device: no communication.

Each block has one float32 scale, its largest magnitude over the width's top value (127 for
int8), and its values round to the nearest step: a value is within half a step of its original.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jzero.dtypes import QUANTIZED_WIDTHS

__all__ = [
    "MIN_PADDED_BLOCKS",
    "NONE",
    "WIDTHS",
    "Layout",
    "dequantize",
    "from_blocks",
    "from_wire",
    "layout",
    "quantize",
    "to_blocks",
    "to_wire",
]

NONE = "none"  # not quantized
MIN_PADDED_BLOCKS = 8  # a shard is padded to whole blocks only when it holds at least this many
# Width -> (the int dtype's name, its largest value used): symmetric, so -127 .. 127 for int8.
WIDTHS: dict[str, tuple[str, int]] = {width: (width, int(jnp.iinfo(width).max)) for width in QUANTIZED_WIDTHS}


def _axes(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one tensor is cut into blocks on its shards.

    Attributes:
      shape: the tensor's shape.
      parts: per dimension, the sizes it splits into: one per mesh axis on it, then the local size.
      axes: the mesh axis of each leading (per-axis) dimension, in order.
      block: elements per block.
    """

    shape: tuple[int, ...]
    parts: tuple[tuple[int, ...], ...]
    axes: tuple[str, ...]
    block: int

    @property
    def local_size(self) -> int:
        return math.prod(p[-1] for p in self.parts)

    @property
    def blocks(self) -> int:
        """Blocks per shard; the last is padded with zeros when ``block`` does not divide the shard."""
        return -(-self.local_size // self.block)

    def spec(self, kept: Sequence[str]) -> P:
        """The blocked view's spec with only the mesh axes in ``kept`` still splitting it."""
        return P(*(a if a in kept else None for a in self.axes), None, None)

    def scale_spec(self, kept: Sequence[str]) -> P:
        return P(*(a if a in kept else None for a in self.axes), None)

    def _order(self) -> list[int]:
        """Positions of the split dimensions: every axis part first, then every local part."""
        position, front, local = 0, [], []
        for dim_parts in self.parts:
            front.extend(range(position, position + len(dim_parts) - 1))
            local.append(position + len(dim_parts) - 1)
            position += len(dim_parts)
        return front + local


def layout(shape: Sequence[int], spec: P, mesh: Mesh, block: int) -> Layout | str:
    """The blocks of a tensor of ``shape`` resting as ``spec`` on ``mesh``, or why there are none.

    Returns:
      A :class:`Layout`, or a reason (text) the tensor is not quantized: it is 1-D (biases and norms
      stay at full precision), its shard is smaller than a block, or ``block`` does not divide a
      shard too small to pad (under :data:`MIN_PADDED_BLOCKS` blocks: the padding would cost more
      than an eighth of it).
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) < 2:
        return "1-D"
    entries = list(spec) + [None] * (len(shape) - len(spec))
    parts, axes = [], []
    for size, entry in zip(shape, entries, strict=True):
        used = [a for a in _axes(entry) if int(mesh.shape[a]) > 1]
        factors = [int(mesh.shape[a]) for a in used]
        parts.append((*factors, size // math.prod(factors)))
        axes.extend(used)
    lay = Layout(shape, tuple(parts), tuple(axes), block)
    if lay.local_size < block:
        return f"{lay.local_size} elements per device, fewer than a block ({block})"
    if lay.local_size % block and lay.local_size < MIN_PADDED_BLOCKS * block:
        return f"{lay.local_size} elements per device, not a multiple of the block ({block}) and too few to pad"
    return lay


def to_blocks(x: jax.Array, lay: Layout) -> jax.Array:
    """``x`` as ``[*per-axis dims, blocks, block]`` (:class:`Layout`); each device keeps its elements."""
    split = x.reshape([p for dim_parts in lay.parts for p in dim_parts])
    front = split.transpose(lay._order())
    flat = front.reshape(*front.shape[: len(lay.axes)], lay.local_size)
    pad = lay.blocks * lay.block - lay.local_size
    if pad:
        flat = jnp.pad(flat, [(0, 0)] * len(lay.axes) + [(0, pad)])
    return flat.reshape(*flat.shape[: len(lay.axes)], lay.blocks, lay.block)


def from_blocks(b: jax.Array, lay: Layout) -> jax.Array:
    """The inverse of :func:`to_blocks`."""
    order = lay._order()
    locals_ = [dim_parts[-1] for dim_parts in lay.parts]
    flat = b.reshape(*b.shape[: len(lay.axes)], lay.blocks * lay.block)[..., : lay.local_size]
    front = flat.reshape(*flat.shape[: len(lay.axes)], *locals_)
    inverse = [order.index(i) for i in range(len(order))]
    return front.transpose(inverse).reshape(lay.shape)


def quantize(b: jax.Array, width: str = "int8") -> tuple[jax.Array, jax.Array]:
    """Symmetric quantization of each block (the last dimension) of ``b``.

    Returns:
      ``(values, scales)``: the int values, shaped like ``b``, and a float32 scale per block, so that
      ``values * scales[..., None]`` is within half a scale of ``b``. An all-zero block has scale 0.
    """
    dtype, top = WIDTHS[width]
    b = b.astype(jnp.float32)
    scale = jnp.max(jnp.abs(b), axis=-1) / top
    steps = b / jnp.where(scale > 0, scale, 1.0)[..., None]
    return jnp.clip(jnp.round(steps), -top, top).astype(dtype), scale


def dequantize(values: jax.Array, scales: jax.Array, dtype: Any) -> jax.Array:
    """``values * scales`` per block, in ``dtype``."""
    return (values.astype(jnp.float32) * scales[..., None]).astype(dtype)


def to_wire(values: jax.Array, width: str) -> jax.Array:
    """Int values as the int8 bytes a collective sends: int8 as they are, int4 two to a byte along the
    last dimension (even). XLA widens an s4 collective to s8 (docs/design.md, "The GPU target", "An
    s4 collective travels as s8"), so int4 is packed by hand to send half the bytes."""
    if width == "int8":
        return values
    nibbles = (values.astype(jnp.int8) + 8).astype(jnp.uint8)  # -7..7 -> 1..15
    packed = nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)
    return jax.lax.bitcast_convert_type(packed, jnp.int8)


def from_wire(wire: jax.Array, width: str) -> jax.Array:
    """The inverse of :func:`to_wire`: int8 values (int4's unpacked to one a byte)."""
    if width == "int8":
        return wire
    packed = jax.lax.bitcast_convert_type(wire, jnp.uint8)
    pairs = jnp.stack([packed & 15, packed >> 4], axis=-1)
    return (pairs.reshape(*wire.shape[:-1], 2 * wire.shape[-1]).astype(jnp.int8) - 8).astype(jnp.int8)
