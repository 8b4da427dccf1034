"""The train state: step, parameters and optimizer state, as one pytree."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class TrainState:
    """``params`` may hold Flax ``Partitioned`` boxes in an abstract state; live states are unboxed."""

    step: jax.Array
    params: Any
    opt_state: Any


def create_state(params: Any, tx: optax.GradientTransformation) -> TrainState:
    """A fresh state; boxed (logically annotated) params stay boxed so the plan can read their names."""
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(nn.unbox(params)))


def unbox_state(state: TrainState) -> TrainState:
    return state.replace(params=nn.unbox(state.params))
