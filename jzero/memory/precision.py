"""Dtype policy, fp32 master weights and dynamic loss scaling.

With 16-bit parameters the optimizer keeps an fp32 master copy inside its state
(:class:`MasterState`), so the plan partitions it exactly like the moments: the paper's K = 12
(master 4 + momentum 4 + variance 4 bytes per parameter) for Adam. The working 16-bit parameters are
recast from the master after each update.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp

from jzero.dtypes import PRECISION_DTYPES

__all__ = [
    "DTYPES",
    "FP32",
    "LossScale",
    "MasterState",
    "Precision",
    "cast",
]

DTYPES = {name: getattr(jnp, name) for name in PRECISION_DTYPES}


@dataclasses.dataclass(frozen=True)
class Precision:
    """Which dtype each piece of training state and compute uses."""

    param_dtype: Any = jnp.float32  # the working parameters, as the model sees them
    # What ``make_train_step`` casts the parameters to before calling the loss function (so
    # activations and matmuls run in it); None: the parameters' own dtype.
    compute_dtype: Any = None
    master_dtype: Any = jnp.float32  # kept with the optimizer state when params are narrower
    grad_reduce_dtype: Any = None  # dtype gradients are reduced in; None: the params' dtype
    loss_scale: float = 2.0**15  # initial dynamic loss scale, used when anything is float16
    loss_scale_window: int = 1000  # finite steps before the scale doubles
    fp8: str = "none"  # the layers' projections' GEMMs: none, tensorwise or rowwise (jzero.memory.float8)

    @property
    def uses_master(self) -> bool:
        return jnp.dtype(self.param_dtype) != jnp.dtype(self.master_dtype)

    @property
    def scales_loss(self) -> bool:
        return jnp.float16 in (jnp.dtype(self.param_dtype), jnp.dtype(self.compute_dtype or self.param_dtype))

    @classmethod
    def from_names(cls, param: str, compute: str | None, master: str, grad_reduce: str | None, **kw) -> Precision:
        return cls(
            param_dtype=DTYPES[param],
            compute_dtype=DTYPES[compute or param],
            master_dtype=DTYPES[master],
            grad_reduce_dtype=DTYPES[grad_reduce] if grad_reduce else None,
            **kw,
        )


FP32 = Precision()  # plain fp32 training: no master copy, no loss scaling


class MasterState(NamedTuple):
    """Optimizer state with an fp32 master copy of the (16-bit) parameters."""

    master: Any
    inner: Any


@flax.struct.dataclass
class LossScale:
    """Dynamic loss scaling: halve on overflow, double after ``window`` finite steps."""

    scale: jax.Array
    good_steps: jax.Array

    @classmethod
    def create(cls, initial: float) -> LossScale:
        return cls(scale=jnp.asarray(initial, jnp.float32), good_steps=jnp.zeros((), jnp.int32))

    def next(self, finite: jax.Array, window: int) -> LossScale:
        grow = finite & (self.good_steps + 1 >= window)
        scale = jnp.where(finite, jnp.where(grow, self.scale * 2, self.scale), jnp.maximum(self.scale / 2, 1.0))
        good = jnp.where(finite & ~grow, self.good_steps + 1, 0)
        return LossScale(scale=scale, good_steps=good.astype(jnp.int32))


def cast(tree: Any, dtype: Any) -> Any:
    """Cast floating leaves of ``tree`` to ``dtype``; integer leaves stay as they are."""
    if dtype is None:
        return tree
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)
