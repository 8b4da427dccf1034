"""How Orbax writes a replicated array: sliced across its replicas only where the slices are large.

Orbax's ``ArrayHandler`` writes a replicated array "replica-parallel" by default on CPU hosts: each
replica writes a slice of it, cut on the device by a jitted slice, one program per shape. On a
small array the slices cost more than the write they share out: each program is traced and
compiled at a process's first save (a 2-step ``jzero train`` of the tests' tiny GPT spent a third of
its 2.1 s in the checkpoint, most of it slicing; docs/design.md). Orbax's own size gate,
``min_slice_bytes_for_replica_parallel``, keeps replica-parallel writes for slices of at least
:data:`MIN_REPLICA_SLICE_BYTES` and writes a smaller array whole from its first replica. What is
written is the same either way: the same values, read back by any mesh.
"""

from __future__ import annotations

import functools

import jax
from orbax.checkpoint import type_handlers
from orbax.checkpoint._src.metadata import array_metadata_store
from orbax.checkpoint._src.serialization import type_handler_registry

__all__ = ["MIN_REPLICA_SLICE_BYTES", "gate_replica_slices"]

MIN_REPLICA_SLICE_BYTES = 1 << 20  # 1 MiB per replica's slice


@functools.cache  # once per process
def gate_replica_slices() -> None:
    """Register Orbax's ``jax.Array`` handler with the size gate, once per process.

    Orbax reads its type handlers from one registry per process, so this holds for every Orbax save
    in the process after it, jzero's or not. The handler is Orbax's default one (with its array
    metadata store) but for the gate.
    """
    handler = type_handlers.ArrayHandler(
        array_metadata_store=array_metadata_store.Store(), min_slice_bytes_for_replica_parallel=MIN_REPLICA_SLICE_BYTES
    )
    # The registry itself, not register_type_handler: that logs a warning for every override.
    type_handler_registry.GLOBAL_TYPE_HANDLER_REGISTRY.add(jax.Array, handler, override=True, ignore_warnings=True)
