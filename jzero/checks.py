"""The checks every config section's ``check()`` makes of its values, and the limits they keep.

Each section record (``optimizer:`` in :mod:`jzero.optimizers`, ``precision:`` in
:mod:`jzero.memory.config`, ``model:`` and ``lora:`` in :mod:`jzero.models.config`) checks its own keys
with these, so that a refusal reads the same whichever section makes it: one
:class:`~jzero.errors.ConfigError` naming the key. No JAX here.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Iterable
from typing import Annotated, Any

from jzero.errors import ConfigError, clip, show_value

__all__ = [
    "MAX_INT32",
    "MAX_PARAMS",
    "PathText",
    "at_least_zero",
    "check_regex",
    "check_regexes",
    "float32",
    "in_range",
    "one_of",
    "positive",
]

PATH = "path"  # the mark of a key that names a file or folder: a string without NUL bytes
PathText = Annotated[str, PATH]

# JAX runs with 32-bit integers (jax_enable_x64 is off): token ids, positions, optax's step count and
# the loss scale's step counter are int32, so every size and count that reaches JAX stays below 2**31.
MAX_INT32 = 2**31 - 1
# Parameter counts are exact as floats below 2**53 (the ledger and the estimate use floats), and
# 16 bytes per parameter (fp32 Adam) x 2**53 = 2**57 stays inside int64 byte counts.
MAX_PARAMS = 2**53


def float32(value: float) -> float:
    """``value`` rounded to the nearest float32 (infinity past its largest)."""
    return struct.unpack("f", struct.pack("f", value))[0]


def in_range(value: float, key: str, low: float, high: float, *, open_low: bool = False, open_high: bool = False) -> None:
    """``low <= value <= high`` (or strictly, per end); written so that NaN fails too.

    Raises:
      ConfigError: naming ``key`` and the range.
    """
    above = value > low if open_low else value >= low
    below = value < high if open_high else value <= high
    if not (above and below):
        ends = f"{'(' if open_low else '['}{_num(low)}, {_num(high)}{')' if open_high else ']'}"
        want = f">= {_num(low)}" if high == math.inf and not open_low else f"in {ends}"
        raise ConfigError(key, f"must be {want}, got {_num(value)}")


def positive(value: float, key: str, high: float = MAX_INT32) -> None:
    """``0 < value <= high``; NaN fails.

    Raises:
      ConfigError: naming ``key``.
    """
    if not 0 < value <= high:  # False for NaN too
        bound = "" if high == math.inf else f" and at most {_num(high)}"
        raise ConfigError(key, f"must be positive{bound}, got {_num(value)}")


def at_least_zero(value: int, key: str) -> None:
    """``0 <= value <= MAX_INT32``.

    Raises:
      ConfigError: naming ``key``.
    """
    if not 0 <= value <= MAX_INT32:
        raise ConfigError(key, f"must be 0 or more and at most {_num(MAX_INT32)}, got {_num(value)}")


def one_of(value: Any, key: str, known: Iterable[str], what: str) -> None:
    """``value`` is one of ``known``.

    Raises:
      ConfigError: ``"<key>: unknown <what> <value> (known: ...)"``.
    """
    known = tuple(known)
    if value not in known:
        raise ConfigError(key, f"unknown {what} {show_value(value)} (known: {', '.join(known)})")


def check_regexes(patterns: Iterable[Any], key: str) -> None:
    """Each of ``patterns`` is a regex (whether it finds a parameter is the plan's to say).

    Raises:
      ConfigError: naming ``key[i]``, the first that is not a string or does not compile.
    """
    for i, pattern in enumerate(patterns):
        if not isinstance(pattern, str):
            raise ConfigError(f"{key}[{i}]", f"must be a path regex, got {show_value(pattern)}")
        check_regex(pattern, f"{key}[{i}]")


def check_regex(pattern: str, key: str) -> None:
    """``pattern`` compiles as a regex.

    Raises:
      ConfigError: naming ``key`` and why it does not.
    """
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as err:
        raise ConfigError(key, f"bad regex {show_value(pattern)}: {clip(str(err))}") from None


def _num(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"
