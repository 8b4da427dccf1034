"""The optimizers a config can name: ``optimizer.name`` to an optax transformation, with its
learning-rate schedule and optional clipping.

optax is imported where a transformation is built: config validation reads :data:`OPTIMIZERS`
here without JAX.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only
    import optax

__all__ = ["OPTIMIZERS", "build_optimizer", "build_schedule"]

# optimizer.name -> its transformation, from optax, the optimizer: section and the schedule.
_OPTIMIZERS: dict[str, Callable[[Any, Any, Any], Any]] = {
    "adamw": lambda optax, o, lr: optax.adamw(lr, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay),
    "adam": lambda optax, o, lr: optax.adam(lr, b1=o.b1, b2=o.b2, eps=o.eps),
    "adafactor": lambda optax, o, lr: optax.adafactor(lr, weight_decay_rate=o.weight_decay or None),
    "lion": lambda optax, o, lr: optax.lion(lr, b1=o.b1, b2=o.b2, weight_decay=o.weight_decay),
    "sgd": lambda optax, o, lr: optax.sgd(lr, momentum=o.b1),
}
OPTIMIZERS = tuple(_OPTIMIZERS)


def build_schedule(cfg: Any, total_steps: int) -> optax.Schedule:
    """Linear warmup from 0, then constant or cosine decay to ``min_lr_ratio`` at ``total_steps``.
    ``cfg`` is the ``optimizer:`` section (:class:`~jzero.config.schema.OptimizerConfig`)."""
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


def build_optimizer(cfg: Any, total_steps: int) -> optax.GradientTransformation:
    """The ``optimizer:`` section's optax transformation, with its schedule and optional clipping."""
    import optax

    tx = _OPTIMIZERS[cfg.name](optax, cfg, build_schedule(cfg, total_steps))
    if cfg.clip_norm is not None:
        # The norm is the global gradient's: GSPMD reduces over the logical arrays, whatever the sharding.
        tx = optax.chain(optax.clip_by_global_norm(cfg.clip_norm), tx)
    return tx
