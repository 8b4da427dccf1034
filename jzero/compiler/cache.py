"""JAX's persistent compilation cache, on by default in the user's cache folder.

A second run of the same step loads the compiled program from disk instead of compiling it again
(``runtime.compilation_cache``: ``auto``, ``off`` or a folder). JAX keys each entry by the program,
the compiler options and the devices, so a changed config compiles afresh. A cache folder that
``JAX_COMPILATION_CACHE_DIR`` or ``jax.config`` already names is left as it is.

A GPU target's programs compiled on a CPU host cannot be read back from that cache; their kernels
can: XLA's kernel cache file (``xla_gpu_kernel_cache_file``), one per GPU kind in the same folder,
skips the PTX assembly of every kernel compiled before (:func:`for_devices`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import jax
from jax.experimental.compilation_cache.compilation_cache import reset_cache

__all__ = [
    "AUTO",
    "MAX_BYTES",
    "OFF",
    "cache_folder",
    "cache_hits",
    "enable_compilation_cache",
    "for_devices",
    "kernel_cache_file",
]

AUTO, OFF = "auto", "off"
MAX_BYTES = 4 * 2**30  # the least recently used entries go beyond this
_HIT = "/jax/compilation_cache/cache_hits"  # the event JAX records for each program read from the cache
_hits = 0
_listening = False


def cache_folder(setting: str) -> Path | None:
    """The folder ``runtime.compilation_cache`` names: ``auto`` is ``$XDG_CACHE_HOME/jzero/jax``
    (``~/.cache/jzero/jax``), ``off`` is None, anything else is a folder."""
    if setting == OFF:
        return None
    if setting == AUTO:
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "jzero" / "jax"
    return Path(setting).expanduser()


def enable_compilation_cache(setting: str) -> Path | None:
    """Point JAX's persistent cache at ``setting``'s folder, unless a folder is already set.

    Args:
      setting: ``runtime.compilation_cache``.

    Returns:
      The folder JAX caches in, or None when the cache is off.
    """
    global _listening
    if not _listening:
        jax.monitoring.register_event_listener(_count_hit)
        _listening = True
    if jax.config.jax_compilation_cache_dir:
        return Path(jax.config.jax_compilation_cache_dir)
    folder = cache_folder(setting)
    if folder is not None:
        jax.config.update("jax_compilation_cache_dir", str(folder))
        if jax.config.jax_compilation_cache_max_size == -1:  # JAX's default grows without bound
            jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    return folder


def cache_hits() -> int:
    """How many programs this process has read from the persistent cache so far."""
    return _hits


def _count_hit(event: str, **_: object) -> None:
    global _hits
    _hits += event == _HIT


def kernel_cache_file(devices: Sequence[jax.Device]) -> Path | None:
    """XLA's kernel cache for a GPU target's compile-only ``devices``: ``xla-gpu-kernels-<kind>.pb``
    in the persistent cache's folder, one file per GPU kind (its kernels are that GPU's binaries);
    None when the cache is off or the devices are not a GPU target's on a CPU host."""
    folder = jax.config.jax_compilation_cache_dir
    if not _compile_only(devices) or not jax.config.jax_enable_compilation_cache or not folder:
        return None
    kind = re.sub(r"[^A-Za-z0-9]+", "-", devices[0].device_kind).strip("-").lower()
    return Path(folder) / f"xla-gpu-kernels-{kind}.pb"


def _compile_only(devices: Sequence[jax.Device]) -> bool:
    return devices[0].platform in ("gpu", "cuda") and jax.default_backend() == "cpu"


@contextlib.contextmanager
def for_devices(devices: Sequence[jax.Device]) -> Iterator[dict[str, str | bool]]:
    """Compile for ``devices`` with the persistent cache, unless they are a GPU target's compile-only
    devices on a CPU host: JAX writes their programs to the cache but cannot read them back without
    a GPU (docs/design.md, "The GPU target", "Where a deviceless compile's time goes").

    Yields:
      The XLA options to compile with besides the program's own: for a GPU target, the kernel cache
      (:func:`kernel_cache_file`, which needs LLVM's module split), held under a lock for the
      compile, since XLA rewrites the file whole and another process could read it half written.
    """
    if not _compile_only(devices) or not jax.config.jax_enable_compilation_cache:
        yield {}
        return
    kernels = kernel_cache_file(devices)
    # JAX decides once per process whether to use the cache; resetting makes it decide again.
    jax.config.update("jax_enable_compilation_cache", False)
    reset_cache()
    try:
        with _kernel_cache(kernels) as options:
            yield options
    finally:
        jax.config.update("jax_enable_compilation_cache", True)
        reset_cache()


@contextlib.contextmanager
def _kernel_cache(kernels: Path | None) -> Iterator[dict[str, str | bool]]:
    """XLA's options for the kernel cache ``kernels``, with an exclusive lock on ``<kernels>.lock``
    for as long as the block runs; none when there is no file or its folder or lock cannot be made
    (a read-only cache folder: the compile goes without the kernel cache)."""
    lock = None
    if kernels is not None:
        try:
            kernels.parent.mkdir(parents=True, exist_ok=True)
            lock = open(kernels.with_suffix(".lock"), "a")  # noqa: SIM115 - closed below, after the unlock
        except OSError:
            pass
    if lock is None:
        yield {}
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield {"xla_gpu_kernel_cache_file": str(kernels), "xla_gpu_enable_llvm_module_compilation_parallelism": True}
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
