"""No lost checkpoint: a save still in flight when a script ends is committed before the interpreter
exits, or its failure is one line and exit status 1 (:mod:`jzero.checkpoint.in_flight`); the README's
own blocks as two scripts are in tests/test_readme.py."""

import os
import subprocess
import sys

import jax
import numpy as np
from support.configs import tiny_config

from jzero.checkpoint.runs import RunCheckpoints
from jzero.training.job import build_job


def _python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_a_write_that_fails_at_exit_is_one_line_and_status_1():
    """The exit hook's failure path, in a real interpreter shutdown: a tracked write whose wait
    raises what a failed commit raises."""
    code = """
from pathlib import Path
from jzero.checkpoint import in_flight
from jzero.errors import CheckpointWriteError

class FailingWrite:
    def wait(self):
        raise CheckpointWriteError(7, Path("/runs/mine/checkpoints/7"), OSError(28, "No space left on device"))

in_flight.track(FailingWrite())
print("script done")
"""
    done = _python(code)
    assert (done.returncode, done.stdout) == (1, "script done\n")
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("jzero: at exit, "), done.stderr
    assert "7" in done.stderr and "No space left on device" in done.stderr


def test_as_a_context_manager_it_commits_on_leaving_the_block(devices, tmp_path):
    s = build_job(tiny_config())
    state = s.init_state()
    with RunCheckpoints(tmp_path) as checkpoints:
        assert checkpoints.save(3, state)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["3"]  # committed, no temporary folder
    restored = RunCheckpoints(tmp_path).restore(3, s.abstract_state()).state
    for got, want in zip(jax.tree.leaves(restored.params), jax.tree.leaves(state.params), strict=True):
        assert np.array_equal(np.asarray(got), np.asarray(want))


def test_a_second_manager_on_the_folder_waits_for_the_first_ones_write(devices, tmp_path):
    """Opening a folder sweeps away temporary folders, as a killed run's; one of this process's own
    writes in flight is committed first, not swept."""
    s = build_job(tiny_config())
    first = RunCheckpoints(tmp_path)
    assert first.save(5, s.init_state())  # async: returns with the write in flight
    with RunCheckpoints(tmp_path) as second:
        assert second.restore_latest(s.abstract_state()).step == 5
