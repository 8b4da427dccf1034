"""What values a run config may hold: :func:`validate`, each section's own ``check()`` in one order,
and the checks across sections. None needs devices (the mesh against the devices is
:mod:`jzero.sharding.mesh`'s). Each refusal is one :class:`ConfigError` naming the key.
"""

from __future__ import annotations

from jzero.checks import MAX_INT32, MAX_PARAMS, in_range
from jzero.config.schema import MAX_SEED, Config, ZeroConfig
from jzero.dtypes import FP8_RECIPES
from jzero.errors import ConfigError
from jzero.lazy import moved_names
from jzero.models.names import OWN

__getattr__ = moved_names(__name__, {
    "check_coordinator": "jzero.config.schema.check_coordinator", "validate_cluster": "jzero.config.schema.ClusterConfig.check",
    "check_batch_divides": "jzero.sharding.axes.check_batch_divides",
})  # fmt: skip

__all__ = ["validate"]


def validate(config: Config) -> None:
    """Checks that need no devices; mesh-vs-device checks live in :mod:`jzero.sharding.mesh`.

    Every number is checked for range (floats are finite already): a value a run cannot use is
    refused here, naming its key, rather than failing deep inside JAX.

    Args:
      config: the whole run config.

    Raises:
      ConfigError: the first value a run cannot use, naming its key.
    """
    # One section after another, in this order: a config with several bad keys names the same one first.
    in_range(config.seed, "seed", 0, MAX_SEED)
    config.mesh.check()
    _check_zero(config.zero, config.precision.master_copy, config.mesh.axes)
    config.model.check()
    config.optimizer.check()
    config.train.check(config.mesh.axes)
    config.precision.check()
    config.run.check()
    config.checkpoint.check()
    config.runtime.check()
    config.data.check()
    config.partitioning.check(config.mesh.axes)
    config.lora.check(config.model.name)
    _check_fp8(config)
    config.compiler.check()


def _check_fp8(config: Config) -> None:
    """Float8 matmuls go on jzero's models' layers: a model of yours has no such layers to convert."""
    if config.precision.fp8 != FP8_RECIPES[0] and config.model.name == OWN:
        where = f"jzero's models' layer projections, not a model of your own (model.name: {OWN})"
        raise ConfigError("precision.fp8", f"float8 matmuls go on {where}")


def _check_zero(zero: ZeroConfig, master_copy: bool, axes: dict[str, int]) -> None:
    zero.check(axes, master_copy=master_copy, error=ConfigError)
    in_range(zero.prefetch, "zero.prefetch", 0, MAX_INT32)
    in_range(zero.persist_below_bytes, "zero.persist_below_bytes", 0, MAX_PARAMS * 16)
