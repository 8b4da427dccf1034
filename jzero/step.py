"""Sharded init and the compiled train step.

The step is one ``jax.jit`` function whose in/out shardings come from a :class:`~jzero.plan.Plan`.
Inside it, sharding constraints tell XLA where each tensor must be; XLA inserts the collectives:

1. gradients are constrained to the stage's gradient spec (all-reduce at stages 0-1,
   reduce-scatter at stages 2-3);
2. gradients and parameters are constrained to the update spec, so at stages >= 1 the optimizer
   runs on the device's 1/N_d slice (at stage 1 this slices the all-reduced gradient locally);
3. the new parameters are constrained to their at-rest spec: all-gathered at stages 1-2, left
   sharded at stage 3.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import flax.linen as nn
import jax
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jzero.plan import Plan
from jzero.state import TrainState, create_state, unbox_state

LossFn = Callable[[Any, Any], jax.Array]


@contextlib.contextmanager
def activation_rules(plan: Plan) -> Iterator[None]:
    """Make the model's logical activation constraints act on ``plan.mesh``."""
    with jax.sharding.use_abstract_mesh(plan.mesh.abstract_mesh), nn.logical_axis_rules(plan.rules):
        yield


def _init_params(init_fn: Callable[[jax.Array], Any], key: jax.Array) -> Any:
    # NNX would otherwise read sharding names as mesh axes at creation; jzero maps them itself.
    with nnx.use_eager_sharding(False):
        return init_fn(key)


def abstract_state(init_fn: Callable[[jax.Array], Any], tx: optax.GradientTransformation, rng: jax.Array) -> TrainState:
    """The train state's shapes and logical annotations, with nothing allocated.

    ``init_fn(key)`` returns the parameters: a linen params dict (boxed or not) or an NNX
    ``State`` (``nnx.state(Model(rngs=nnx.Rngs(key)), nnx.Param)``).
    """
    return jax.eval_shape(lambda key: create_state(_init_params(init_fn, key), tx), rng)


def sharded_init(init_fn: Callable[[jax.Array], Any], tx: optax.GradientTransformation, plan: Plan, rng: jax.Array) -> TrainState:
    """Initialise straight into the plan's shardings: no device ever holds the whole state."""

    # No activation rules here: init's forward pass is dead code once only params are kept, and
    # Flax's boxed DenseGeneral kernels would hit the constraints while still reshaped.
    def init(key):
        return unbox_state(create_state(_init_params(init_fn, key), tx))

    return jax.jit(init, out_shardings=plan.state)(rng)


def _constrain(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(jax.lax.with_sharding_constraint, tree, shardings)


def make_train_step(loss_fn: LossFn, tx: optax.GradientTransformation, plan: Plan, *, donate: bool = True):
    """``step(state, batch) -> (state, metrics)``, jitted with the plan's shardings.

    ``loss_fn(params, batch)`` returns the scalar mean loss over the global batch. Metrics are
    ``loss`` and ``grad_norm`` (the global L2 norm of the reduced gradient).
    """

    def step(state: TrainState, batch: Any) -> tuple[TrainState, dict[str, jax.Array]]:
        with activation_rules(plan):
            loss, grads = jax.value_and_grad(loss_fn)(state.params, batch)
            grads = _constrain(grads, plan.grads)
            grad_norm = optax.tree.norm(grads)
            grads = _constrain(grads, plan.update)
            params = _constrain(state.params, plan.update)
            updates, opt_state = tx.update(grads, state.opt_state, params)
            params = _constrain(optax.apply_updates(params, updates), plan.params)
        new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state)
        return new_state, {"loss": loss, "grad_norm": grad_norm}

    scalar = NamedSharding(plan.mesh, P())
    return jax.jit(
        step,
        in_shardings=(plan.state, plan.batch),
        out_shardings=(plan.state, {"loss": scalar, "grad_norm": scalar}),
        donate_argnums=(0,) if donate else (),
    )
