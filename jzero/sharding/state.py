"""The train state: step, parameters, optimizer state and precision bookkeeping, as one pytree."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from jzero.memory.precision import FP32, LossScale, MasterState, Precision, cast
from jzero.sharding.trainable import frozen_out, trainable_mask

__all__ = ["TrainState", "create_state", "unbox_state"]


@flax.struct.dataclass
class TrainState:
    """``params`` may hold Flax ``Partitioned`` boxes in an abstract state; live states are unboxed."""

    step: jax.Array
    params: Any  # in the policy's param dtype
    opt_state: Any  # a MasterState (fp32 master + inner state) when params are narrower than master
    skipped: jax.Array  # steps whose gradient was not finite, so nothing was applied
    loss_scale: LossScale | None = None  # dynamic loss scaling, when anything is float16


def create_state(
    params: Any, tx: optax.GradientTransformation, precision: Precision = FP32, trainable: Sequence[str] | None = None
) -> TrainState:
    """A fresh state from fp32 ``params``; boxed (logically annotated) params stay boxed so the
    plan can read their names. The optimizer state (and a master copy) covers the parameters whose
    path a ``trainable`` regex finds, all of them when it is None (:mod:`jzero.sharding.trainable`)."""
    full = nn.unbox(params)
    train = frozen_out(full, trainable_mask(full, trainable))
    if precision.uses_master:
        master = cast(train, precision.master_dtype)
        opt_state = MasterState(master=master, inner=tx.init(master))
    else:
        opt_state = tx.init(cast(train, precision.param_dtype))
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=cast(params, precision.param_dtype),
        opt_state=opt_state,
        skipped=jnp.zeros((), jnp.int32),
        loss_scale=LossScale.create(precision.loss_scale) if precision.scales_loss else None,
    )


def unbox_state(state: TrainState) -> TrainState:
    return state.replace(params=nn.unbox(state.params))
