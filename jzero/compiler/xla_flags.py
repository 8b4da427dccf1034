"""XLA's options for jzero's compiles: jzero's defaults, the user's ``XLA_FLAGS`` and the config's
``compiler.xla_options``, merged in that order (the later wins), and their errors as one line.

XLA reads ``XLA_FLAGS`` once, when JAX's backends start, and a flag it does not know, or a value it
cannot read, aborts the process from native code (JAX 0.10.2: exit status 1, and the command line
diverts that stderr). :func:`check_xla_flags` asks a child process first. Compile options are
applied over ``XLA_FLAGS`` for one compile (docs/design.md, "The GPU target", "A compile option
wins over the same flag in XLA_FLAGS"), so a default is dropped where ``XLA_FLAGS`` names its flag.
No JAX here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from jzero.errors import ConfigError, show_value

__all__ = [
    "CONFIG_KEY",
    "ENV",
    "check_xla_flags",
    "compile_error",
    "in_effect",
    "user_flags",
]

ENV = "XLA_FLAGS"
CONFIG_KEY = "compiler.xla_options"
DEFAULTS = "jzero"
# jzero sets this one itself (runtime.cpu_devices); it sizes the CPU client and changes no program.
_DEVICE_COUNT = "xla_force_host_platform_device_count"
# The XLA_FLAGS already found good, by this process or the one that started it.
_CHECKED = "JZERO_XLA_FLAGS_CHECKED"
# Building XLA's compile options parses XLA_FLAGS, as a backend's start does, without a device.
_PROBE = "import jaxlib._jax as x; x.CompileOptions()"
_UNKNOWN = re.compile(r"Unknown flags? in XLA_FLAGS: (?P<flags>.*)")
_BAD_VALUE = re.compile(r"Couldn't interpret value (?P<value>.*) for flag (?P<name>\w+)\.")
_NO_OPTION = re.compile(r"No such compile option: '(?P<name>\w+)'")
_BAD_OPTION = re.compile(r"While setting option (?P<name>\w+), '(?P<value>.*)' is not a valid (?P<type>\w+) value")


def user_flags(text: str | None = None) -> dict[str, str]:
    """The flags of ``XLA_FLAGS`` (default: this process's), name -> value as written.

    ``--name`` alone is ``true``, as XLA reads a bare boolean flag.
    """
    text = os.environ.get(ENV, "") if text is None else text
    flags = {}
    for word in text.split():
        name, sep, value = word.lstrip("-").partition("=")
        flags[name] = value if sep else "true"
    return flags


def check_xla_flags(text: str | None = None) -> None:
    """Refuse an ``XLA_FLAGS`` that XLA would abort on, in one line, before JAX's backends start.

    Args:
      text: the flags (default: this process's ``XLA_FLAGS``).

    Raises:
      ConfigError: naming ``XLA_FLAGS``, the flag, and that XLA does not know it or what type its
        value must have.
    """
    text = os.environ.get(ENV, "") if text is None else text
    if not set(user_flags(text)) - {_DEVICE_COUNT} or os.environ.get(_CHECKED) == text:
        return  # nothing, only what jzero sets itself, or checked by a parent: no child process (about 0.3 s)
    env = {**os.environ, ENV: text, "TF_CPP_MIN_LOG_LEVEL": "0"}
    probe = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True)
    if probe.returncode != 0:
        raise _flags_error(probe.stderr, text)
    os.environ[_CHECKED] = text  # the processes this one starts (jzero launch's) inherit the answer


def _flags_error(stderr: str, text: str) -> ConfigError:
    """What XLA's abort said, as one line naming the flag."""
    if unknown := _UNKNOWN.search(stderr):
        return ConfigError(ENV, f"{unknown['flags'].strip()}: unknown XLA flag")
    if bad := _BAD_VALUE.search(stderr):  # XLA's usage table after it is cut short: no type to quote
        return ConfigError(ENV, f"--{bad['name']}={bad['value']}: not a valid value for this XLA flag")
    last = stderr.strip().splitlines()[-1:] or ["no message"]
    return ConfigError(ENV, f"XLA refused {show_value(text)}: {last[0]}")


def in_effect(
    defaults: Mapping[str, Any], needs: Mapping[str, Any], options: Mapping[str, Any], flags: Mapping[str, str]
) -> dict[str, dict[str, Any]]:
    """The XLA options a compile runs with, name -> ``{"value": ..., "from": ...}``.

    Args:
      defaults: jzero's defaults for the devices; ``XLA_FLAGS`` overrides them.
      needs: what the step needs from XLA (gathering units); the step's ``jax.jit`` carries them,
        so they win over ``XLA_FLAGS`` and lose to the config.
      options: the config's ``compiler.xla_options``, which win over everything.
      flags: the user's ``XLA_FLAGS`` (:func:`user_flags`).

    Returns:
      Every option in effect, each after those it overrides; the device count jzero sets itself is
      left out.
    """
    layers = [
        (DEFAULTS, {k: v for k, v in defaults.items() if k not in flags}),
        (ENV, {k: v for k, v in flags.items() if k != _DEVICE_COUNT}),
        (DEFAULTS, needs),
        (CONFIG_KEY, options),
    ]
    merged: dict[str, dict[str, Any]] = {}
    for source, layer in layers:
        for name, value in layer.items():
            merged.pop(name, None)  # moved to the end: the options read in the order they apply
            merged[name] = {"value": value, "from": source}
    return merged


def compile_error(err: Exception, options: Mapping[str, Any]) -> ConfigError | None:
    """A compile's refusal of an XLA option as one line naming it, or None for any other error.

    Args:
      err: what ``Lowered.compile`` raised.
      options: the config's ``compiler.xla_options``; an option not among them is jzero's own.
    """
    message = str(err)
    if no := _NO_OPTION.search(message):
        return ConfigError(_key(no["name"], options), "unknown XLA flag")
    if bad := _BAD_OPTION.search(message):
        value = options.get(bad["name"], bad["value"])
        kind = bad["type"]
        a = "an" if kind[0] in "aeiou" else "a"
        return ConfigError(_key(bad["name"], options), f"must be {a} {kind} value, got {show_value(value)}")
    return None


def _key(name: str, options: Mapping[str, Any]) -> str:
    return f"{CONFIG_KEY}.{name}" if name in options else f"XLA option {name} (jzero's own)"
