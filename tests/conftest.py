"""Tests run on 8 simulated CPU devices, fixed before JAX starts its backend."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402

from jzero.config import Config, load_config  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

TINY = [
    "model.d_model=32",
    "model.n_layers=2",
    "model.n_heads=2",
    "model.seq_len=16",
    "train.global_batch_size=16",
    "data.max_bytes=200000",
]


def tiny_config(*overrides: str) -> Config:
    """A model small enough to compile in seconds on 2 cores."""
    return load_config(None, [*TINY, *overrides])


@pytest.fixture(scope="session")
def devices():
    assert jax.device_count() == 8, "tests expect 8 simulated CPU devices"
    return jax.devices()
