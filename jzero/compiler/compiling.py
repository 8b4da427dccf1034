"""A lowered program compiled with XLA options: through the persistent cache where it serves the
devices (:mod:`jzero.compiler.cache`), and an option XLA refuses named in one line
(:func:`jzero.compiler.xla_flags.compile_error`). Which options a step gets is
:func:`jzero.compiler.options.compiler_options`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jzero.compiler import cache, xla_flags

__all__ = ["check_options", "compile_lowered"]


def compile_lowered(lowered: Any, devices: Sequence[Any], options: Mapping[str, Any] | None, mine: Mapping[str, Any]) -> Any:
    """``lowered`` compiled for ``devices`` with ``options`` (:func:`jzero.compiler.options.compiler_options`'s), through
    the persistent cache where it serves them (:func:`jzero.compiler.cache.for_devices`).

    Args:
      lowered: a ``jax.jit(...).lower(...)``.
      devices: what it compiles for.
      options: the compile's XLA options.
      mine: the config's ``compiler.xla_options``, which an error names as such.

    Raises:
      ConfigError: XLA does not know an option, or cannot read its value, naming it.
    """
    with cache.for_devices(devices) as cache_options:
        if cache_options:
            try:
                return _compile(lowered, {**cache_options, **(options or {})}, mine)
            except jax.errors.JaxRuntimeError:
                pass  # the kernel cache failed (its file unwritable, say): the same compile without it
        return _compile(lowered, options, mine)


def _compile(lowered: Any, options: Mapping[str, Any] | None, mine: Mapping[str, Any]) -> Any:
    try:
        return lowered.compile(compiler_options=options or None)
    except jax.errors.JaxRuntimeError as err:
        refused = xla_flags.compile_error(err, mine)
        if refused is None:
            raise
        raise refused from None


def check_options(devices: Sequence[Any], options: Mapping[str, Any] | None, mine: Mapping[str, Any]) -> None:
    """Refuse an XLA option before anything is compiled or written: a one-op program compiles with
    ``options`` (XLA reads them all whatever the program).

    Raises:
      ConfigError: as :func:`compile_lowered`, naming the option.
    """
    compile_lowered(jax.jit(jnp.negative).lower(jnp.float32(0)), devices, options, mine)
