"""The ``compiler:`` section and the XLA options every compile of a step is given, in one place:
jzero's GPU defaults (:data:`GPU_COMPILER_OPTIONS`), what the step itself needs, the user's
``XLA_FLAGS`` and the config's ``compiler.xla_options``, merged by :func:`jzero.compiler.xla_flags.in_effect`
(the later wins). No JAX here.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from jzero.compiler import xla_flags
from jzero.compiler.platforms import on_gpus
from jzero.errors import ConfigError, clip

__all__ = [
    "GPU_COMPILER_OPTIONS",
    "LAYERS_PER_COMBINED_OP",
    "PIPELINED_GATHERS",
    "SLOP_FACTOR",
    "CompilerConfig",
    "compiler_options",
    "gpu_compiler_options",
    "xla_options",
]

_XLA_FLAG = re.compile(r"^xla_[a-z0-9_]+$")
_AS = "as in XLA_FLAGS without --"


@dataclasses.dataclass(frozen=True)
class CompilerConfig:
    """``compiler:``. ``xla_options``: XLA flag name -> value (true/false, a number or a string), given
    to every compile of the step over jzero's defaults and ``XLA_FLAGS`` (:func:`xla_options`)."""

    xla_options: dict[str, bool | int | float | str] = dataclasses.field(default_factory=dict)

    def check(self) -> None:
        """Flag names only: whether XLA knows a flag and its value's type is the compile's to say
        (:func:`jzero.compiler.xla_flags.compile_error`), as the config has no XLA.

        Raises:
          ConfigError: ``compiler.xla_options.<name>``, a name that is no XLA flag's.
        """
        for name in self.xla_options:
            if not _XLA_FLAG.match(name):
                key = f"{xla_flags.CONFIG_KEY}.{clip(name)}"
                raise ConfigError(key, f"not an XLA flag name (xla_ then lowercase letters, digits and _, {_AS})")

    def build(self, devices: Sequence[Any], **inputs: Any) -> dict[str, dict]:
        """The options in effect for a step on ``devices``, with where each comes from
        (:func:`xla_options`, ``inputs`` its keywords but ``options``)."""
        return xla_options(devices, options=self.xla_options, **inputs)


# XLA options for GPU programs; every GPU compile (the plan's and a GPU run's) uses them. What each
# changes (benchmarks/gpu_options.py): docs/gpu-targets.md, "Overlap, and the XLA options jzero
# sets for GPUs".
# - The latency-hiding scheduler puts compute between each async collective's start and done. XLA
#   0.10.2 already did; set so that a change of XLA's default cannot serialize the gathers and
#   reduce-scatters.
# - Pipelined collectives: XLA's collective pipeliner moves the next layer's all-gather (and this
#   layer's gradient reduce-scatter, and all-reduce) across the layer loop's iterations, so each
#   runs under another layer's compute: FSDP2's prefetch of one layer, done by the compiler.
# - Combining thresholds: XLA merges collectives up to this many bytes into one op. A layer's
#   gathers must be one op, which the pipeliner then prefetches whole; at 256 MiB a 7B layer took
#   several ops and some waited. 1 GiB is for a step without layers; gpu_compiler_options sizes
#   them from the layer.
# - The highest-priority stream for collectives: NCCL kernels are not starved by compute kernels
#   at run time (NVIDIA's JAX-Toolbox advice); nothing changes in the compiled program.
PIPELINED_GATHERS = "xla_gpu_enable_pipelined_all_gather"
GPU_COMPILER_OPTIONS: dict[str, str | bool | int] = {
    "xla_gpu_enable_latency_hiding_scheduler": True,
    PIPELINED_GATHERS: True,
    "xla_gpu_enable_pipelined_reduce_scatter": True,
    "xla_gpu_enable_pipelined_all_reduce": True,
    "xla_gpu_enable_highest_priority_async_stream": True,
    "xla_gpu_all_gather_combine_threshold_bytes": 2**30,
    "xla_gpu_reduce_scatter_combine_threshold_bytes": 2**30,
    "xla_gpu_all_reduce_combine_threshold_bytes": 256 * 2**20,
}

# A step with layers combines one layer's gathers (and gradient reduce-scatters) into one op, never
# two layers': at 1 GiB XLA merged the forward's first layer with the backward's first (layer 31)
# into one gather at the step's start, held through the forward, and the embedding with the head
# (7B stage 3 on h100x8: 4.30 layers' worth gathered at once, 5.4 ms exposed; at 1.25 layers 2.65
# and 3.6 ms; benchmarks/gpu_options.py).
LAYERS_PER_COMBINED_OP = 1.25
_LAYER_COMBINED = ("xla_gpu_all_gather_combine_threshold_bytes", "xla_gpu_reduce_scatter_combine_threshold_bytes")
SLOP_FACTOR = "xla_gpu_memory_limit_slop_factor"  # the scheduler's memory limit (jzero.ledger.targets.scheduler_slop_factor)


def gpu_compiler_options(layer_bytes: int = 0, slop_factor: int | None = None) -> dict[str, str | bool | int]:
    """jzero's XLA options for a GPU step whose layer gathers ``layer_bytes`` per device.

    Args:
      layer_bytes: one layer's gathered parameters per device in the compute dtype
        (:meth:`jzero.sharding.plan.Plan.layer_bytes`); 0 for a step without layers.
      slop_factor: ``xla_gpu_memory_limit_slop_factor`` for the GPU it compiles for
        (:func:`jzero.ledger.targets.scheduler_slop_factor`); None: XLA's scheduler limit stays its own.

    Returns:
      :data:`GPU_COMPILER_OPTIONS`, with the all-gather and reduce-scatter combining thresholds at
      :data:`LAYERS_PER_COMBINED_OP` layers' bytes when there are layers, and the slop factor.
    """
    options = dict(GPU_COMPILER_OPTIONS)
    if layer_bytes:
        options.update(dict.fromkeys(_LAYER_COMBINED, math.ceil(layer_bytes * LAYERS_PER_COMBINED_OP)))
    if slop_factor is not None:
        options[SLOP_FACTOR] = slop_factor
    return options


def xla_options(
    devices: Sequence[Any],
    *,
    needs: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    layer_bytes: int = 0,
    slop_factor: int | None = None,
) -> dict[str, dict]:
    """The XLA options in effect for a program on ``devices``, each with where it comes from.

    Args:
      devices: what it compiles for; GPUs (real or a target's) get :func:`gpu_compiler_options`,
        unless ``XLA_FLAGS`` names the flag.
      needs: what the step itself needs (a step that gathers by units:
        :func:`jzero.communication.gather.unit_options`).
      options: the config's ``compiler.xla_options``, which win over everything.
      layer_bytes: one layer's gathered bytes per device (:meth:`jzero.sharding.plan.Plan.layer_bytes`),
        which sizes the GPU combining thresholds.
      slop_factor: the GPU scheduler's memory limit (:func:`jzero.ledger.targets.scheduler_slop_factor`).

    Returns:
      name -> ``{"value": ..., "from": "jzero" | "XLA_FLAGS" | "compiler.xla_options"}``
      (:func:`jzero.compiler.xla_flags.in_effect`).
    """
    defaults = gpu_compiler_options(layer_bytes, slop_factor) if on_gpus(devices) else {}
    return xla_flags.in_effect(defaults, needs or {}, options or {}, xla_flags.user_flags())


def compiler_options(devices: Sequence[Any], **inputs: Any) -> dict[str, Any] | None:
    """The XLA options a compile on ``devices`` is given: :func:`xla_options` (``inputs`` are its
    keywords) but those ``XLA_FLAGS`` sets, which XLA already has; None when there are none."""
    effect = xla_options(devices, **inputs)
    given = {name: e["value"] for name, e in effect.items() if e["from"] != xla_flags.ENV}
    return given or None
