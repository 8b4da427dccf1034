"""Tests run on 8 simulated CPU devices, fixed before JAX starts its backend."""

import os

# LLVM optimisation level 0 cuts compile time by about a third on these tiny models; the HLO (its
# sharding, collectives and memory analysis) is what the tests check, and it is unaffected.
FLAGS = "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + FLAGS).strip()
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


STEPS = 20
# A sharded run and one device differ only in the order of floating-point sums (XLA partitions the
# reductions differently); over 20 fp32 AdamW steps at lr 1e-3 the largest gap measured was 3e-7.
ATOL, RTOL = 2e-6, 1e-5
LR = "optimizer.learning_rate=1e-3"


@pytest.fixture(scope="session")
def data():
    from jzero.data import text_batches

    cfg = tiny_config()
    return text_batches(None, cfg.data.max_bytes, cfg.model.seq_len, cfg.train.global_batch_size, cfg.seed)


def reference_run(init_fn, loss_fn, tx, rng, batches, steps=STEPS):
    """Plain optax on one device: the answer every stage and mesh must reproduce."""
    import flax.linen as nn
    import optax
    from flax import nnx

    with nnx.use_eager_sharding(False):
        params = jax.jit(lambda k: nn.unbox(init_fn(k)))(rng)  # no mesh: one device
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, batch):
        grads = jax.grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    for k in range(steps):
        params, opt_state = step(params, opt_state, batches(k))
    return params, opt_state


@pytest.fixture(scope="session")
def reference(data):
    """The tiny GPT trained 20 steps on one device."""
    import jax.numpy as jnp

    from jzero.trainer import setup

    s = setup(tiny_config(LR, "mesh.axes.data=1"), devices=jax.devices()[:1])
    return reference_run(s.init_fn, s.loss_fn, s.tx, s.rng, lambda k: jnp.asarray(data.global_batch(k)))


def train_sharded(s, batches, steps=STEPS):
    """Sharded init and ``steps`` compiled steps of a :class:`jzero.trainer.Setup`; returns the final state."""
    state = s.init_state()
    step = s.make_step()
    for k in range(steps):
        state, _ = step(state, batches(k, s.plan.batch))
    return state


def assert_trees_close(got, want):
    import numpy as np

    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=ATOL, rtol=RTOL)
