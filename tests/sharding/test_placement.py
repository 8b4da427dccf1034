"""The train state on a plan's shardings (:mod:`jzero.sharding.placement`): the shapes and the sharded
init come from one trace of the model's init where the arguments allow."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jzero.sharding.mesh import make_mesh
from jzero.sharding.placement import abstract_state, sharded_init
from jzero.sharding.plan import make_plan


class Two(nn.Module):
    @nn.compact
    def __call__(self, x):
        return x * self.param("a", nn.initializers.normal(), (16, 4)).sum() + self.param("b", nn.initializers.ones, (8,)).sum()


class CountingInit:
    """An ``init_fn`` that counts how often JAX traces it."""

    def __init__(self):
        self.traces = 0

    def __call__(self, key):
        self.traces += 1
        return Two().init(key, jnp.ones(()))["params"]


class UnhashableInit(CountingInit):
    __hash__ = None  # as a dataclass with eq, say: nothing can be cached by it


@pytest.mark.parametrize("make, traces", [(CountingInit, 1), (UnhashableInit, 3)])
def test_the_sharded_init_reuses_the_shapes_trace_where_the_init_hashes(devices, make, traces):
    init_fn, tx, key = make(), optax.adamw(1e-3), jax.random.key(0)
    plan = make_plan(abstract_state(init_fn, tx, key), make_mesh({"data": 8}), 3)
    state = sharded_init(init_fn, tx, plan, key)
    state = sharded_init(init_fn, tx, plan, key)  # a second init traces nothing new either
    assert init_fn.traces == traces
    want = jax.jit(lambda k: Two().init(k, jnp.ones(()))["params"])(key)  # compiled, as the sharded init is
    for name, value in want.items():
        np.testing.assert_array_equal(state.params[name], value)
        assert state.params[name].sharding == plan.state.params[name]
        assert state.opt_state[0].mu[name].sharding == plan.state.opt_state[0].mu[name]
