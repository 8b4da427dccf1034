"""Orbax's replica-parallel writes, gated by size (jzero/checkpoint/slices.py): what each replicated
array was written as, read from the step's own array metadata (``write_shape``)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec

from jzero.checkpoint.runs import RunCheckpoints
from jzero.checkpoint.slices import MIN_REPLICA_SLICE_BYTES


def _write_shapes(folder) -> dict[str, list[int]]:
    (listing,) = (folder / "array_metadatas").iterdir()  # one process
    rows = json.loads(listing.read_text())["array_metadatas"]
    return {r["array_metadata"]["param_name"]: r["array_metadata"]["write_shape"] for r in rows}


def test_a_small_replicated_array_is_written_whole_and_a_large_one_in_slices(tmp_path, devices):
    """Replicated over 8 devices: an array whose eighth is under the gate is written whole by one
    replica (no slice programs at a process's first save); one whose eighth reaches it, in 8 slices."""
    RunCheckpoints(tmp_path / "run")  # opening a run's checkpoints sets the gate, for every Orbax save after
    replicated = NamedSharding(jax.sharding.Mesh(np.array(devices), ("data",)), PartitionSpec())
    rows = 8 * MIN_REPLICA_SLICE_BYTES // (4 * 256)  # float32 rows of 256: an eighth is the gate's size
    state = {
        "small": jax.device_put(jnp.ones((64, 256), jnp.float32), replicated),
        "large": jax.device_put(jnp.ones((rows, 256), jnp.float32), replicated),
    }
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "saved", state)
    shapes = _write_shapes(tmp_path / "saved")
    assert shapes["small"] == [64, 256]
    assert shapes["large"] == [rows // 8, 256]
