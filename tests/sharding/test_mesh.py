"""The devices the README promises: a mesh over all devices of a one-device CPU host says how to get
more, in one line; ``jzero.build_job`` simulates ``runtime.cpu_devices`` as ``jzero train`` does."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.configs import TINY, tiny_config

from jzero.errors import ConfigError
from jzero.training.job import build_job

ROOT = Path(__file__).resolve().parents[2]


def _fresh(code: str) -> subprocess.CompletedProcess:
    """``code`` in a new Python with JAX's defaults: one CPU device on a host without a GPU."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_one_cpu_device_is_said_and_so_is_how_to_get_more():
    code = """
import jzero
print(jzero.make_mesh({"data": -1}).size)
try:
    jzero.make_mesh({"data": 8})
except jzero.ConfigError as err:
    print(err)
"""
    done = _fresh(code)
    size, refused = done.stdout.splitlines()
    assert size == "1"
    assert refused.startswith("mesh.axes: data=8 x model=1 = 8 devices does not divide the 1 available; ")
    (note,) = done.stderr.splitlines()
    assert note.startswith("jzero: note: JAX has 1 CPU device") and 'jax.config.update("jax_num_cpu_devices", 8)' in note
    assert 'jax.config.update("jax_num_cpu_devices", 8)' in refused


def test_build_job_simulates_runtime_cpu_devices():
    code = f"""
import jzero
config = jzero.load_config(None, {[*TINY, "runtime.cpu_devices=4", "mesh.axes.data=-1"]!r})
print(jzero.build_job(config).mesh.size)
"""
    done = _fresh(code)
    assert (done.stdout, done.stderr) == ("4\n", "")


def test_a_device_count_that_cannot_be_had_any_more_says_how(devices):
    """JAX started with 8 devices here; asking for 4 is one line naming the key and both ways out."""
    with pytest.raises(ConfigError) as err:
        build_job(tiny_config("runtime.cpu_devices=4"))
    assert str(err.value) == (
        "runtime.cpu_devices: JAX already started with 8 CPU devices, not 4: set runtime.cpu_devices: 8, "
        'or call jax.config.update("jax_num_cpu_devices", 4) right after importing jax'
    )
