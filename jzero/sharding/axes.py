"""The mesh axis names, spelled once, and what follows from a mesh's sizes alone.

No JAX here: the config layer reads these before JAX starts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from jzero.errors import ConfigError

__all__ = [
    "BATCH_AXES",
    "DATA",
    "KNOWN_MESH_AXES",
    "LAYERS",
    "MODEL",
    "REPLICA",
    "batch_ways",
    "check_batch_divides",
    "mesh_text",
    "model_ways",
    "resolve_axes",
]

REPLICA = "replica"  # hierarchical partitioning: whole model-state copies per replica group
DATA = "data"  # ZeRO's partitioning and the batch
MODEL = "model"  # tensor (model) parallelism
KNOWN_MESH_AXES = (REPLICA, DATA, MODEL)
BATCH_AXES = (REPLICA, DATA)  # the batch is split over both; model states only over data
LAYERS = "layers"  # the logical name of a scanned model's stacked-layer dimension


def batch_ways(shape: Mapping[str, int]) -> int:
    """How many ways the batch is split: ``replica`` x ``data``, the batch groups."""
    return math.prod(int(shape.get(a, 1)) for a in BATCH_AXES)


def model_ways(shape: Mapping[str, int]) -> int:
    """N_m: the product of the axes that are not batch axes (model parallelism divides everything)."""
    return math.prod(int(s) for a, s in shape.items() if a not in BATCH_AXES)


def resolve_axes(axes: Mapping[str, int], device_count: int) -> dict[str, int]:
    """Replace a -1 size by the remaining devices and check the mesh divides ``device_count``."""
    axes = dict(axes)
    axes.setdefault(MODEL, 1)
    known = math.prod(s for s in axes.values() if s != -1)
    for name, size in axes.items():
        if size == -1:
            if device_count % known:
                raise ConfigError(
                    f"mesh.axes.{name}",
                    f"-1 cannot fill {device_count} devices: the other axes multiply to {known}",
                )
            axes[name] = device_count // known
    total = math.prod(axes.values())
    if total > device_count or device_count % total:
        raise ConfigError("mesh.axes", f"{mesh_text(axes)} = {total} devices does not divide the {device_count} available")
    return axes


def check_batch_divides(global_batch_size: int, axes: Mapping[str, int], microbatches: int = 1) -> None:
    """The batch is split over ``data`` (and ``replica``), and each microbatch too."""
    ways = batch_ways(axes)
    if global_batch_size % ways:
        name = " x ".join(a for a in BATCH_AXES if a in axes)
        raise ConfigError("train.global_batch_size", f"{global_batch_size} is not divisible by the {name} axis ({ways})")
    if global_batch_size % (ways * microbatches):
        raise ConfigError(
            "train.microbatches",
            f"{microbatches} microbatches of the {global_batch_size}-row batch do not split evenly over {ways} devices",
        )


def mesh_text(axes: Mapping[str, int]) -> str:
    """A mesh's axes as text: ``data=4 x model=2``."""
    return " x ".join(f"{k}={v}" for k, v in axes.items())
