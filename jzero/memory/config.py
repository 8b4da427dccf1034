"""The ``precision:`` section: its record (:class:`PrecisionConfig`), its checks and the
:class:`~jzero.memory.precision.Precision` it builds. No JAX until it builds."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from jzero.checks import one_of, positive
from jzero.dtypes import FP8_RECIPES, PRECISION_DTYPES
from jzero.errors import ConfigError, show_value

if TYPE_CHECKING:
    from jzero.memory.precision import Precision

__all__ = ["MASTER_DTYPE", "PrecisionConfig"]

MASTER_DTYPE = "float32"  # the one dtype of the master copy (and of every optimizer state)


@dataclasses.dataclass(frozen=True)
class PrecisionConfig:
    """``precision:``: the dtypes of parameters, compute, master copy and gradient reduction
    (:mod:`jzero.memory.precision`), and float8 matmuls (:mod:`jzero.memory.float8`)."""

    param_dtype: str = "float32"  # the working parameters: float32, bfloat16 or float16
    compute_dtype: str | None = None  # activations and matmuls; None: param_dtype
    master_dtype: str = MASTER_DTYPE  # kept with the optimizer state when params are narrower
    grad_reduce_dtype: str | None = None  # dtype gradients are reduced in; None: param_dtype
    loss_scale: float = 32768.0  # initial dynamic loss scale (used when anything is float16)
    loss_scale_window: int = 1000  # finite steps before the scale doubles
    fp8: str = FP8_RECIPES[0]  # the layers' projections in float8: none, tensorwise or rowwise

    @property
    def master_copy(self) -> bool:
        """The optimizer keeps an fp32 master copy: the working parameters are narrower."""
        return self.param_dtype != self.master_dtype

    def check(self) -> None:
        """Refuse a dtype jzero does not train in, and a loss scale that cannot scale.

        Raises:
          ConfigError: the first such key, ``precision.<key>``.
        """
        for field in ("param_dtype", "compute_dtype", "master_dtype", "grad_reduce_dtype"):
            value = getattr(self, field)
            if value is not None:
                one_of(value, f"precision.{field}", PRECISION_DTYPES, "dtype")
        if self.master_dtype != MASTER_DTYPE:
            raise ConfigError("precision.master_dtype", f"must be {MASTER_DTYPE}, got {show_value(self.master_dtype)}")
        positive(self.loss_scale, "precision.loss_scale", math.inf)  # a float32 (the loader's rule for every float)
        positive(self.loss_scale_window, "precision.loss_scale_window")
        one_of(self.fp8, "precision.fp8", FP8_RECIPES, "float8 recipe")
        compute = self.compute_dtype or self.param_dtype
        if self.fp8 != FP8_RECIPES[0] and compute == "float16":
            # float16's loss scale and float8's own scales would fight over the same range.
            needs = "needs bfloat16 or float32 compute, not float16 (precision.compute_dtype)"
            raise ConfigError("precision.fp8", f"{self.fp8} {needs}")

    def build(self) -> Precision:
        """The :class:`~jzero.memory.precision.Precision` these names make."""
        from jzero.memory.precision import Precision

        return Precision.from_names(
            self.param_dtype,
            self.compute_dtype,
            self.master_dtype,
            self.grad_reduce_dtype,
            loss_scale=self.loss_scale,
            loss_scale_window=self.loss_scale_window,
            fp8=self.fp8,
        )
