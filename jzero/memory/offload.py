"""Model states in pinned host memory (ZeRO-Offload, ZeRO-Infinity): memory kinds on shardings, and
the moves between host and device inside the compiled step.

A sharding with ``memory_kind="pinned_host"`` keeps each device's shard in page-locked host memory
that the device reads by DMA; ``jax.device_put`` to a memory space inside ``jit`` is the transfer,
which XLA schedules like any other op. Nothing here runs eagerly.
"""

from __future__ import annotations

from typing import Any, TypeVar

import flax.linen as nn
import jax

__all__ = ["DEVICE", "HOST", "fetching", "memory_kind", "on_device", "on_host", "to_device", "to_host"]

HOST = "pinned_host"
DEVICE = "device"
ModuleT = TypeVar("ModuleT")


def on_host(shardings: Any) -> Any:
    """The same shardings, in pinned host memory."""
    return jax.tree.map(lambda s: s.with_memory_kind(HOST), shardings)


def on_device(shardings: Any) -> Any:
    """The same shardings, in device memory."""
    return jax.tree.map(lambda s: s.with_memory_kind(DEVICE), shardings)


def memory_kind(sharding: Any) -> str:
    """A sharding's memory kind; None (the backend's default) reads as device memory."""
    return getattr(sharding, "memory_kind", None) or DEVICE


def to_device(tree: Any) -> Any:
    """Inside ``jit``: every leaf in device memory, with its sharding kept."""
    return jax.tree.map(lambda x: jax.device_put(x, jax.memory.Space.Device), tree)


def to_host(tree: Any) -> Any:
    """Inside ``jit``: every leaf in pinned host memory, with its sharding kept."""
    return jax.tree.map(lambda x: jax.device_put(x, jax.memory.Space.Host), tree)


def fetching(module: type[ModuleT]) -> type[ModuleT]:
    """A Flax linen module class whose parameters come from host memory to the device where it runs.

    Wrap the layer a scan repeats (before ``nn.remat`` and ``nn.scan``): each step of the loop then
    moves only its own layer's shard, and a rematerialised backward moves it again instead of keeping
    it. Parameters already in device memory pass through unchanged.
    """
    return nn.map_variables(module, "params", trans_in_fn=to_device, init=True)
