"""The train state (:mod:`jzero.sharding.state`): what a fresh one holds at each precision."""

import flax.linen as nn
import jax.numpy as jnp
import optax
import pytest

from jzero.memory.precision import FP32, MasterState, Precision
from jzero.sharding.state import create_state, unbox_state

PARAMS = {"w": jnp.arange(6, dtype=jnp.float32).reshape(2, 3), "count": jnp.arange(2, dtype=jnp.int32)}


def test_fp32_has_no_master_copy_and_no_loss_scale():
    state = create_state(PARAMS, optax.adam(1e-3), FP32)
    assert int(state.step) == 0 and int(state.skipped) == 0 and state.loss_scale is None
    assert not isinstance(state.opt_state, MasterState)
    assert state.params["w"].dtype == jnp.float32 and state.opt_state[0].mu["w"].dtype == jnp.float32


def test_bf16_parameters_keep_an_fp32_master_that_the_optimizer_steps():
    state = create_state(PARAMS, optax.adam(1e-3), Precision(param_dtype=jnp.bfloat16))
    assert state.params["w"].dtype == jnp.bfloat16 and state.params["count"].dtype == jnp.int32
    assert isinstance(state.opt_state, MasterState)
    assert state.opt_state.master["w"].dtype == jnp.float32
    assert (state.opt_state.master["w"] == PARAMS["w"]).all()  # the fp32 values, not rounded through bf16
    assert state.opt_state.inner[0].mu["w"].dtype == jnp.float32
    assert state.loss_scale is None


@pytest.mark.parametrize("precision", [Precision(param_dtype=jnp.float16), Precision(compute_dtype=jnp.float16)])
def test_anything_in_float16_starts_a_dynamic_loss_scale(precision):
    state = create_state(PARAMS, optax.sgd(1e-3), precision)
    assert float(state.loss_scale.scale) == precision.loss_scale and int(state.loss_scale.good_steps) == 0


def test_boxed_parameters_stay_boxed_until_unboxed():
    boxed = {"w": nn.Partitioned(PARAMS["w"], names=("embed", "mlp"))}
    state = create_state(boxed, optax.sgd(1e-3))
    assert isinstance(state.params["w"], nn.Partitioned) and state.params["w"].names == ("embed", "mlp")
    plain = unbox_state(state)
    assert not isinstance(plain.params["w"], nn.Partitioned) and (plain.params["w"] == PARAMS["w"]).all()
