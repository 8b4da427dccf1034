"""Mesh config -> ``jax.sharding.Mesh``.

jzero uses ``AxisType.Auto`` axes on purpose: it places every tensor itself (jit in/out shardings
and ``with_sharding_constraint``) and lets GSPMD propagate the rest. Explicit axes would make
user model code call ``jax.sharding.reshard``, and switching stage must not touch model code.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence

import jax
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

from jzero.errors import ConfigError
from jzero.lazy import moved_names
from jzero.sharding.axes import resolve_axes

__all__ = [
    "MORE_CPU_DEVICES",
    "make_mesh",
    "mesh_shape",
    "simulate_cpu_devices",
]

__getattr__ = moved_names(__name__, {"on_gpus": "jzero.compiler.platforms.on_gpus"})

# How a host without an accelerator gets more devices: JAX's own option, before its backends start.
MORE_CPU_DEVICES = 'for 8 simulated CPU devices call jax.config.update("jax_num_cpu_devices", 8) right after importing jax'


def make_mesh(
    axes: Mapping[str, int],
    devices: Sequence[jax.Device] | None = None,
    dcn: Mapping[str, int] | None = None,
) -> Mesh:
    """Build a mesh of ``AxisType.Auto`` axes.

    Args:
      axes: ordered ``{axis: size}`` (``replica``, ``data``, ``model``); one size may be -1, the
        remaining devices. A mesh smaller than the device count uses the first devices.
      devices: the devices (default: all of them).
      dcn: how many ways each axis spans hosts. With several processes those factors are laid across
        processes (``create_hybrid_device_mesh``), so the other axes' collectives stay inside a host;
        in one process every device is local and ``dcn`` only has to divide its axis.

    Returns:
      The :class:`jax.sharding.Mesh`, with a ``model`` axis (size 1 when not asked for).

    Raises:
      ConfigError: the sizes do not fit the devices.
    """
    if devices is None and -1 in axes.values():
        _note_a_lone_cpu(jax.devices())
    devices = list(jax.devices() if devices is None else devices)
    try:
        axes = resolve_axes(axes, len(devices))
    except ConfigError as err:
        if _lone_cpu(devices):
            raise ConfigError("", f"{err}; {MORE_CPU_DEVICES}") from None
        raise
    dcn = {name: int(dcn.get(name, 1)) for name in axes} if dcn else {}
    for name, ways in dcn.items():
        if axes[name] % ways:
            raise ConfigError(f"mesh.dcn.{name}", f"{ways} does not divide the axis size {axes[name]}")
    names, types = tuple(axes), (AxisType.Auto,) * len(axes)
    processes = len({d.process_index for d in devices})
    if dcn and processes > 1:
        if math.prod(dcn.values()) != processes:
            raise ConfigError("mesh.dcn", f"the dcn sizes multiply to {math.prod(dcn.values())}, not the {processes} processes")
        ici = tuple(axes[n] // dcn[n] for n in names)
        grid = mesh_utils.create_hybrid_device_mesh(ici, tuple(dcn[n] for n in names), devices=devices, process_is_granule=True)
        return Mesh(grid, names, axis_types=types)
    total = math.prod(axes.values())
    return jax.make_mesh(tuple(axes.values()), names, axis_types=types, devices=devices[:total])


def _lone_cpu(devices: Sequence[jax.Device]) -> bool:
    return len(devices) == 1 and devices[0].platform == "cpu"


def _note_a_lone_cpu(devices: Sequence[jax.Device]) -> None:
    """All devices asked for, and JAX has one CPU device: the mesh would shard nothing, silently."""
    if _lone_cpu(devices):
        print(f"jzero: note: JAX has 1 CPU device, so every mesh axis has size 1 and nothing is sharded; {MORE_CPU_DEVICES}",
              file=sys.stderr)  # fmt: skip


def mesh_shape(mesh: Mesh) -> dict[str, int]:
    return {name: int(size) for name, size in mesh.shape.items()}


def simulate_cpu_devices(count: int) -> None:
    """Ask for ``count`` CPU devices; must run before JAX starts its backends.

    On a GPU or TPU host this only sizes the (unused) CPU backend. If JAX has already started
    (as in-process tests do) the existing CPU device count must match.
    """
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:
        have = jax.local_device_count()  # per process, as runtime.cpu_devices is
        if jax.default_backend() == "cpu" and have != count:
            raise ConfigError(
                "runtime.cpu_devices",
                f"JAX already started with {have} CPU devices, not {count}: set runtime.cpu_devices: {have}, or call "
                f'jax.config.update("jax_num_cpu_devices", {count}) right after importing jax',
            ) from None
