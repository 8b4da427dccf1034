"""Which JAX platforms this host can use, chosen the way JAX documents (``jax_platforms``).

With JAX's CUDA plugin installed (the ``gpu-target`` extra, or ``jax[cuda12]``) on a host without
NVIDIA's driver, JAX tries the plugin when its backends start, prints the plugin's failed CUDA
check as a traceback ("Jax plugin configuration error"), and uses the CPU anyway. ``import jzero``
(:func:`select_platforms`) and the command line (:func:`platforms_for`) ask for ``cpu`` on such a
host, unless ``JAX_PLATFORMS`` says otherwise. No JAX at import: the plugins are found as JAX finds
them, importing none.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import pkgutil
import sys
from collections.abc import Sequence
from typing import Any

__all__ = [
    "cuda_driver_present",
    "cuda_plugins",
    "flash_attention_available",
    "gpu_compiler_available",
    "importable",
    "jax_plugin_modules",
    "on_gpus",
    "platforms_for",
    "select_platforms",
]


def importable(name: str) -> bool:
    """Whether ``name`` can be imported, without importing it (its parents are imported)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a missing parent package, or a module with no spec
        return False


def jax_plugin_modules() -> list[str]:
    """The PJRT plugin modules JAX would load, found as JAX finds them, importing none of them.

    JAX loads every module under the ``jax_plugins`` namespace package and every ``jax_plugins``
    entry point (``jax._src.xla_bridge.discover_pjrt_plugins``); a name that cannot be imported is
    left out, since JAX could not load it either.
    """
    import importlib.metadata  # here: 30 ms, which the command line's start (Ctrl-C from 0.3 s) can do without

    names = set(_namespace_plugins()) | {entry.value for entry in importlib.metadata.entry_points(group="jax_plugins")}
    return sorted(name for name in names if importable(name))


def _namespace_plugins() -> list[str]:
    """The modules of the ``jax_plugins`` namespace package: most plugins, found without reading
    every installed distribution's entry points."""
    if not importable("jax_plugins"):
        return []
    namespace = importlib.util.find_spec("jax_plugins")
    return [f"jax_plugins.{m.name}" for m in pkgutil.iter_modules(namespace.submodule_search_locations or [])]


def cuda_plugins() -> list[str]:
    """The CUDA plugins among :func:`jax_plugin_modules`."""
    return [name for name in jax_plugin_modules() if "cuda" in name]


def gpu_compiler_available() -> bool:
    """Whether a CUDA plugin for JAX is installed (the ``gpu-target`` extra, or ``jax[cuda12]``).

    Any layout JAX itself accepts counts (:func:`jax_plugin_modules`): ``jax_plugins.xla_cuda12``
    from ``jax-cuda12-pjrt``, a CUDA 13 plugin, or one advertised only by an entry point.
    """
    return any("cuda" in name for name in _namespace_plugins()) or bool(cuda_plugins())


def cuda_driver_present() -> bool:
    """Whether this host has NVIDIA's driver library, without which no GPU can be used."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def platforms_for(target: bool = False) -> str | None:
    """The ``jax_platforms`` to set before JAX starts, or None to leave JAX's own.

    Args:
      target: compiling for a GPU target, whose devices are compile-only.

    Returns:
      ``"cpu"`` for a target, and when ``JAX_PLATFORMS`` is unset, a CUDA plugin is installed and
      the host has no NVIDIA driver (nor a TPU's ``libtpu``, which ``cpu`` would hide); else None.
    """
    if target:
        return "cpu"
    if os.environ.get("JAX_PLATFORMS") or cuda_driver_present() or importable("libtpu"):
        return None
    return "cpu" if gpu_compiler_available() else None


def select_platforms() -> None:
    """Apply :func:`platforms_for` to this process: ``JAX_PLATFORMS`` before JAX is imported, or
    ``jax.config`` once it is; too late once JAX's backends have started (nothing is changed then)."""
    platforms = platforms_for()
    if platforms is None:
        return
    if "jax" not in sys.modules:
        os.environ["JAX_PLATFORMS"] = platforms
        return
    jax = sys.modules["jax"]
    if jax.config.jax_platforms != platforms:
        try:
            jax.config.update("jax_platforms", platforms)
        except RuntimeError:  # the backends have started: JAX keeps what it has
            pass


def on_gpus(devices: Sequence[Any]) -> bool:
    """Whether ``devices`` are GPUs, real ones or a GPU target's compile-only devices."""
    return bool(devices) and devices[0].platform in ("gpu", "cuda")


def flash_attention_available() -> bool:
    """Whether cuDNN is installed for JAX's fused attention (the ``nvidia-cudnn-cu12`` wheel, part of
    ``jax[cuda12]`` and of the ``gpu-target`` extra). Without it ``jax.nn.dot_product_attention(...,
    implementation="cudnn")`` fails to trace ("cuDNN not found"), a GPU target's deviceless compile
    included; with it that compile succeeds (docs/design.md, "The GPU target", "cuDNN's flash
    attention compiles deviceless once cuDNN is installed")."""
    return importable("nvidia.cudnn")
