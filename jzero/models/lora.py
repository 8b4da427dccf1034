"""Low-rank adapters (LoRA, Hu et al. 2021) on the kernels of jzero's models' layers.

An adapted kernel ``W`` [in, out] gains ``lora_a`` [in, rank] and ``lora_b`` [rank, out] beside it,
and its layer computes ``x W + (alpha / rank) (x A) B``. ``A`` starts uniform in ``±1/sqrt(in)`` (PEFT's
default) and ``B`` at zero, so an adapted model starts as the model it adapts. ``A`` carries the
kernel's input name and ``B`` its output name, so the plan shards them as their kernel over
``model`` and ZeRO partitions them like any parameter.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jzero.errors import ConfigError
from jzero.models.names import ADAPTERS, A, B, is_adapter

__all__ = [
    "ADAPTERS", "A", "B", "LoraDense", "LoraSpec", "adapted_kernels", "adapter_paths", "check_targets", "is_adapter",
    "lora_spec", "merged_adapters", "merged_kernel",
]  # fmt: skip



@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """The ``lora:`` section as the model reads it.

    Attributes:
      rank: the adapters' rank r.
      alpha: the scale's numerator: the update is ``alpha / rank`` times ``A B``.
      targets: path regexes (``re.search`` on ``layers/q_proj/kernel``): the kernels that get adapters.
    """

    rank: int
    alpha: float
    targets: tuple[str, ...]

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def adapts(self, kernel_path: str) -> bool:
        """Whether the kernel at ``kernel_path`` gets an adapter."""
        return any(re.search(t, kernel_path) for t in self.targets)


def lora_spec(section: Any) -> LoraSpec | None:
    """The ``lora:`` section (:class:`jzero.models.config.LoraConfig`) as the model reads it; None
    when its rank is 0 (off)."""
    return LoraSpec(section.rank, float(section.alpha), tuple(section.targets)) if section.rank else None


class LoraDense(nn.Dense):
    """A Dense with a low-rank adapter on its kernel (the module docstring says how)."""

    rank: int = 8
    scale: float = 2.0
    in_name: str | None = None  # the kernel's logical names, which A and B share
    out_name: str | None = None

    @nn.compact
    def __call__(self, inputs: jax.Array) -> jax.Array:
        y = super().__call__(inputs)
        init_a = nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform")  # bound 1/sqrt(in)
        a = self.param(A, nn.with_logical_partitioning(init_a, (self.in_name, None)), (inputs.shape[-1], self.rank))
        b = self.param(B, nn.with_logical_partitioning(nn.initializers.zeros, (None, self.out_name)), (self.rank, self.features))
        x, a, b = nn.dtypes.promote_dtype(inputs, a, b, dtype=self.dtype)
        return y + (x @ a) @ b * jnp.asarray(self.scale, y.dtype)


def adapted_kernels(paths: Sequence[str]) -> list[str]:
    """The kernel paths, among parameter ``paths``, that carry an adapter."""
    return [p.removesuffix(A) + "kernel" for p in paths if p.endswith(f"/{A}")]


def check_targets(spec: LoraSpec, paths: Sequence[str]) -> None:
    """Each of ``lora.targets`` adapts at least one kernel among the parameter ``paths``.

    Raises:
      ConfigError: naming ``lora.targets[i]`` and the nearest kernel path.
    """
    adapted = adapted_kernels(paths)
    for i, target in enumerate(spec.targets):
        if not any(re.search(target, k) for k in adapted):
            kernels = [p for p in paths if p.endswith("/kernel")] or list(paths)
            nearest = difflib.get_close_matches(target, kernels, n=1, cutoff=0)
            where = f" (the nearest kernel is {nearest[0]!r})" if nearest else ""
            raise ConfigError(f"lora.targets[{i}]", f"{target!r} matches no kernel of the model's layers{where}")


def adapter_paths(kernel_path: str) -> tuple[str, str]:
    """The paths of the ``A`` and ``B`` beside the kernel at ``kernel_path``."""
    base = kernel_path.removesuffix("kernel")
    return base + A, base + B


def merged_kernel(kernel: Any, a: Any, b: Any, scale: float) -> jax.Array:
    """``W + scale A B`` in float32, back in the kernel's dtype (any leading dimensions, the layers'
    included, shared by all three)."""
    delta = jnp.einsum("...ir,...ro->...io", jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
    return (jnp.asarray(kernel, jnp.float32) + scale * delta).astype(kernel.dtype)


def merged_adapters(params: Mapping[str, Any], scale: float) -> dict[str, Any]:
    """``params`` (nested dicts) with each adapter folded into its kernel (:func:`merged_kernel`),
    and the adapters gone: the model without LoRA that computes the same."""
    out = {}
    for name, value in params.items():
        if isinstance(value, Mapping) and A in value:
            merged = merged_kernel(value["kernel"], value[A], value[B], scale)
            out[name] = {k: v for k, v in value.items() if k not in (A, B)} | {"kernel": merged}
        elif isinstance(value, Mapping):
            out[name] = merged_adapters(value, scale)
        else:
            out[name] = value
    return out
