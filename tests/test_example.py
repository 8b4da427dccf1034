"""The README's own-loop examples (plain Flax linen and NNX loops converted to ZeRO) run and learn."""


import jax
import jax.numpy as jnp
import pytest
from support.examples import load_example
from support.reference import reference_with_floor


@pytest.fixture(scope="module")
def linen_loop():
    return load_example("zero3_loop")


@pytest.fixture(scope="module")
def nnx_loop():
    return load_example("nnx_loop")


def _learned(losses):
    return sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5


@pytest.mark.parametrize("stage", [0, 3])
def test_linen_loop_trains(devices, linen_loop, stage, capsys):
    assert _learned(linen_loop.main(steps=40, stage=stage))
    assert f"stage {stage} on 8 devices" in capsys.readouterr().out


def test_stages_agree_on_the_linen_loop(linen_loop):
    """Stage 0 and stage 3 both give one-device optax's losses, within 10x the reordering floor."""
    init_fn, loss_fn, tx, key = linen_loop.training_parts()
    reference = reference_with_floor(init_fn, loss_fn, tx, key, lambda k: jax.tree.map(jnp.asarray, linen_loop.make_batch(k)), 10)
    for stage in (0, 3):
        reference.check(losses=linen_loop.main(steps=10, stage=stage))


def test_nnx_loop_trains_on_dp4_mp2(devices, nnx_loop, capsys):
    assert _learned(nnx_loop.main(steps=60, stage=3))
    out = capsys.readouterr().out
    assert "P('data', 'model')" in out  # up/kernel: mlp on model, ZeRO on data
