"""Two processes on localhost under jax.distributed: `dcn` puts the replica axis across hosts, and
their checkpoint restores in one process."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
from conftest import reference_with_floor, tiny_config

from jzero.build import setup
from jzero.checkpoint import CHECKPOINTS, RunCheckpoints
from jzero.data import text_batches

HELPER = Path(__file__).parent / "helpers" / "dcn_mesh.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_dcn_axis_spans_processes(tmp_path):
    port = _free_port()
    outs = [tmp_path / f"p{i}.json" for i in range(2)]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(HELPER), str(port), str(i), str(outs[i]), str(tmp_path / "run")], env=env, stderr=subprocess.PIPE
        )
        for i in range(2)
    ]
    try:
        errors = [p.communicate(timeout=240)[1].decode()[-2000:] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), errors
    results = [json.loads(o.read_text()) for o in outs]
    assert results[0]["devices"] == 8
    # Each replica group (a row of the mesh) lives in one process: only `replica` crosses hosts.
    assert results[0]["grid_processes"] == [[0, 0, 0, 0], [1, 1, 1, 1]]
    assert results[0]["losses"] == results[1]["losses"]

    s = setup(tiny_config("data.max_bytes=100000", "mesh.axes.data=1"), devices=jax.devices()[:1])
    data = text_batches(None, 100_000, 16, 16, 0)

    def batch(k):
        return jnp.asarray(data.global_batch(k))

    # Three ZeRO-3 steps across processes give one device's losses, within 10x the reordering floor.
    reference = reference_with_floor(s.init_fn, s.loss_fn, s.tx, s.rng, batch, steps=3)
    reference.check(losses=results[0]["losses"])

    # The checkpoint both processes wrote (each its own shards) restores in this one process, on
    # one device at stage 0, and gives the two-process run's third loss.
    state_dir = tmp_path / "run" / CHECKPOINTS / "2" / "state"
    assert sorted(p.name for p in state_dir.glob("ocdbt.process_*")) == ["ocdbt.process_0", "ocdbt.process_1"]
    restored = RunCheckpoints(tmp_path / "run").restore(2, s.abstract_state())
    assert int(restored.state.step) == 2 and restored.data["next_step"] == 2
    reference.check(losses=[*results[0]["losses"][:2], float(s.loss_fn(restored.state.params, batch(2)))])
