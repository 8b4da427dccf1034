"""The train state made on a plan's shardings: its shapes with nothing allocated, a sharded init in
which no device holds the whole state, a fresh state around given parameters, and the check that a
precision matches the plan's."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jzero.errors import PlanError
from jzero.memory.precision import FP32, MasterState, Precision
from jzero.sharding.plan import Plan
from jzero.sharding.state import TrainState, create_state, unbox_state

__all__ = ["abstract_state", "check_precision", "sharded_abstract", "sharded_init", "state_from_params"]


def _init_params(init_fn: Callable[[jax.Array], Any], key: jax.Array) -> Any:
    # NNX would otherwise read sharding names as mesh axes at creation; jzero maps them itself.
    with nnx.use_eager_sharding(False):
        return init_fn(key)


def _state_fn(init_fn: Callable, tx: optax.GradientTransformation, precision: Precision, trainable: Any) -> Callable:
    """``key ->`` the boxed fresh state: one function object per arguments where they hash, so that
    :func:`abstract_state`'s trace serves every :func:`sharded_init` too (JAX keys its traces by
    the function; tests/sharding/test_placement.py counts them)."""
    trainable = None if trainable is None else tuple(trainable)
    try:
        return _cached_state_fn(init_fn, tx, precision, trainable)
    except TypeError:  # an init_fn or optimizer that does not hash: traced afresh
        return _cached_state_fn.__wrapped__(init_fn, tx, precision, trainable)


@functools.lru_cache(maxsize=8)  # a few jobs' worth: each entry holds its init_fn and model
def _cached_state_fn(init_fn: Callable, tx: optax.GradientTransformation, precision: Precision, trainable: Any) -> Callable:
    def fresh_state(key: jax.Array) -> TrainState:
        return create_state(_init_params(init_fn, key), tx, precision, trainable)

    return fresh_state


def abstract_state(
    init_fn: Callable[[jax.Array], Any],
    tx: optax.GradientTransformation,
    rng: jax.Array,
    precision: Precision = FP32,
    trainable: Sequence[str] | None = None,
) -> TrainState:
    """The train state's shapes and logical annotations, with nothing allocated.

    Args:
      init_fn: ``init_fn(key)`` returns fp32 parameters: a linen params dict (boxed or not) or an
        NNX ``State`` (``nnx.state(Model(rngs=nnx.Rngs(key)), nnx.Param)``).
      tx: the optimizer, whose state is laid out too.
      rng: the key ``init_fn`` is called with.
      precision: the dtype policy (a master copy joins the optimizer state when params are 16-bit).
      trainable: path regexes of the parameters that train (``train.trainable``); the optimizer
        state leaves the others out. None: all train.

    Returns:
      A :class:`~jzero.sharding.state.TrainState` of ``ShapeDtypeStruct`` leaves, for :func:`jzero.sharding.plan.make_plan`.
    """
    return jax.eval_shape(_state_fn(init_fn, tx, precision, trainable), rng)


def sharded_abstract(abstract: TrainState, plan: Plan) -> TrainState:
    """The target a checkpoint restores into.

    Args:
      abstract: from :func:`abstract_state`.
      plan: the plan whose shardings the leaves carry.

    Returns:
      ``abstract`` unboxed, as ``ShapeDtypeStruct`` leaves with ``sharding`` set.
    """
    state = abstract.replace(params=nn.unbox(abstract.params))
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, plan.state)


def sharded_init(
    init_fn: Callable[[jax.Array], Any],
    tx: optax.GradientTransformation,
    plan: Plan,
    rng: jax.Array,
    precision: Precision = FP32,
) -> TrainState:
    """Initialise straight into the plan's shardings: no device ever holds the whole state.

    Args:
      init_fn, tx, rng, precision: as for :func:`abstract_state`.
      plan: the shardings to create the state in.

    Returns:
      The :class:`~jzero.sharding.state.TrainState`, each leaf sharded as ``plan.state`` says.

    Raises:
      PlanError: ``precision`` is not the one the plan's abstract state was made with (:func:`check_precision`).
    """

    check_precision(plan, precision)

    # No activation rules here: init's forward pass is dead code once only params are kept, and
    # Flax's boxed DenseGeneral kernels would hit the constraints while still reshaped.
    fresh_state = jax.jit(_state_fn(init_fn, tx, precision, plan.trainable))  # abstract_state's trace

    def init(key):
        return unbox_state(fresh_state(key))

    return jax.jit(init, out_shardings=plan.state)(rng)


def state_from_params(params: Any, tx: optax.GradientTransformation, plan: Plan, precision: Precision = FP32) -> TrainState:
    """A fresh train state (new optimizer state) around given parameters.

    Args:
      params: fp32 parameters, already placed with the plan's parameter shardings.
      tx: the optimizer.
      plan: the shardings of the state.
      precision: the dtype policy.

    Returns:
      The :class:`~jzero.sharding.state.TrainState` at step 0.
    """
    check_precision(plan, precision)
    return jax.jit(lambda p: unbox_state(create_state(p, tx, precision, plan.trainable)), out_shardings=plan.state)(params)


def check_precision(plan: Plan, precision: Precision) -> None:
    """``precision`` is the one the plan's abstract state was made with (:func:`abstract_state`):
    the same parameter dtype, fp32 master copy and loss scale, so the state has the plan's layout.

    Raises:
      PlanError: naming both precisions and the fix.
    """
    floats = {str(t.dtype) for t in plan.tensors if jnp.issubdtype(t.dtype, jnp.floating)}
    planned = _layout_words(floats, isinstance(plan.state.opt_state, MasterState), plan.state.loss_scale is not None)
    given = _layout_words(floats and {jnp.dtype(precision.param_dtype).name}, precision.uses_master, precision.scales_loss)
    if planned != given:
        raise PlanError(
            "precision",
            f"the plan was made for {planned}, this Precision gives {given}: "
            "pass the same jzero.Precision to abstract_state, sharded_init and make_train_step",
        )


def _layout_words(dtypes: set[str], master: bool, scale: bool) -> str:
    """What a precision puts in the state: ``bfloat16 parameters with an fp32 master copy and a loss scale``."""
    extras = [*(["an fp32 master copy"] * master), *(["a loss scale"] * scale)]
    return f"{'/'.join(sorted(dtypes)) or 'no float'} parameters" + (f" with {' and '.join(extras)}" if extras else "")
