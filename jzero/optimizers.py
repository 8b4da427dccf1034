"""The ``optimizer:`` section: its record (:class:`OptimizerConfig`), its checks and the optax
transformation it builds, with its learning-rate schedule and optional clipping.

optax is imported where a transformation is built: config validation reads this module without JAX.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jzero.checks import MAX_INT32, float32, in_range, one_of, positive
from jzero.errors import ConfigError

if TYPE_CHECKING:  # annotations only
    import optax

__all__ = ["OPTIMIZERS", "SCHEDULES", "OptimizerConfig", "build_optimizer", "build_schedule"]

# optimizer.name -> its transformation, from optax, the optimizer: section and the schedule.
_OPTIMIZERS: dict[str, Callable[[Any, Any, Any], Any]] = {
    "adamw": lambda optax, o, lr: optax.adamw(lr, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay),
    "adam": lambda optax, o, lr: optax.adam(lr, b1=o.b1, b2=o.b2, eps=o.eps),
    "adafactor": lambda optax, o, lr: optax.adafactor(lr, weight_decay_rate=o.weight_decay or None),
    "lion": lambda optax, o, lr: optax.lion(lr, b1=o.b1, b2=o.b2, weight_decay=o.weight_decay),
    "sgd": lambda optax, o, lr: optax.sgd(lr, momentum=o.b1),
}
OPTIMIZERS = tuple(_OPTIMIZERS)
SCHEDULES = ("constant", "cosine")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """``optimizer:``: an optax optimizer by name (:data:`OPTIMIZERS`) and its schedule."""

    name: str = "adamw"  # adamw, adam, adafactor, lion or sgd (momentum b1)
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    schedule: str = "constant"  # constant or cosine (to min_lr_ratio x learning_rate at train.steps)
    warmup_steps: int = 0  # linear warmup from 0
    min_lr_ratio: float = 0.1
    clip_norm: float | None = None  # clip by the global gradient norm

    def check(self) -> None:
        """Refuse a value no optimizer can run with.

        Raises:
          ConfigError: the first such key, ``optimizer.<key>``.
        """
        one_of(self.name, "optimizer.name", OPTIMIZERS, "optimizer")
        positive(self.learning_rate, "optimizer.learning_rate", math.inf)
        in_range(self.weight_decay, "optimizer.weight_decay", 0, math.inf, open_high=True)
        _decay_rate(self.b1, "optimizer.b1")
        _decay_rate(self.b2, "optimizer.b2")
        positive(self.eps, "optimizer.eps", math.inf)
        in_range(self.min_lr_ratio, "optimizer.min_lr_ratio", 0, 1)
        in_range(self.warmup_steps, "optimizer.warmup_steps", 0, MAX_INT32)
        one_of(self.schedule, "optimizer.schedule", SCHEDULES, "schedule")
        if self.clip_norm is not None:
            positive(self.clip_norm, "optimizer.clip_norm", math.inf)

    def build(self, total_steps: int) -> optax.GradientTransformation:
        """The optax transformation, with its schedule over ``total_steps`` (:func:`build_optimizer`)."""
        return build_optimizer(self, total_steps)


def _decay_rate(value: float, key: str) -> None:
    """In [0, 1), also as the float32 the optimizer uses it in: 1 would never forget, above it diverges
    (docs/design.md, "Facts behind the code")."""
    in_range(value, key, 0, 1, open_high=True)
    if float32(value) == 1:
        raise ConfigError(key, f"is 1 as a float32, which the optimizer uses; at most {1 - 2**-24!r}, got {value!r}")


def build_schedule(cfg: OptimizerConfig, total_steps: int) -> optax.Schedule:
    """Linear warmup from 0, then constant or cosine decay to ``min_lr_ratio`` at ``total_steps``."""
    import optax

    peak = cfg.learning_rate
    if cfg.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            0.0, peak, cfg.warmup_steps, max(total_steps, cfg.warmup_steps + 1), end_value=peak * cfg.min_lr_ratio
        )
    if cfg.warmup_steps:
        warmup = optax.linear_schedule(0.0, peak, cfg.warmup_steps)
        return optax.join_schedules([warmup, optax.constant_schedule(peak)], [cfg.warmup_steps])
    return optax.constant_schedule(peak)


def build_optimizer(cfg: OptimizerConfig, total_steps: int) -> optax.GradientTransformation:
    """The ``optimizer:`` section's optax transformation, with its schedule and optional clipping."""
    import optax

    tx = _OPTIMIZERS[cfg.name](optax, cfg, build_schedule(cfg, total_steps))
    if cfg.clip_norm is not None:
        # The norm is the global gradient's: GSPMD reduces over the logical arrays, whatever the sharding.
        tx = optax.chain(optax.clip_by_global_norm(cfg.clip_norm), tx)
    return tx
