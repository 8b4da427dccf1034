"""jzero's errors, by kind. Each is bad input that jzero can name: ``str(err)`` is one line,
``"<where>: <what is wrong>"``, and the command line prints it and exits with status 2.

- :class:`ConfigError`: a config key or a command-line flag (``zero.stage``, ``--out``);
- :class:`PlanError`: a sharding plan asked of the Python API (a stage, a mesh, a tensor's spec);
- :class:`CheckpointError`: a checkpoint folder or file, named by its path.
"""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = ["CheckpointError", "ConfigError", "JzeroError", "PlanError", "clip", "show_value"]


class JzeroError(ValueError):
    """Bad input, named by ``where`` (a key, a flag, a tensor or a path)."""

    def __init__(self, where: str, message: str):
        self.where = where
        text = f"{where}: {message}" if where else message
        super().__init__(" ".join(text.splitlines()))  # one line even when a path or value holds a newline


class ConfigError(JzeroError):
    """A bad config value, file or flag; ``key`` is the dotted key or the flag."""

    @property
    def key(self) -> str:
        return self.where


class PlanError(JzeroError):
    """A plan that cannot be made: an unknown stage, a mesh without ``data``, a spec that does not fit."""


class CheckpointError(JzeroError):
    """A checkpoint that cannot be used: missing, unreadable, not jzero's, or of another model."""


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple, _REPR.maxset = 3, 4, 4, 4, 4
_REPR.maxstring, _REPR.maxlong, _REPR.maxother = 60, 40, 60


def show_value(value: Any, limit: int = 80) -> str:
    """A value's repr for an error message, at most about ``limit`` characters.

    The repr is built by a bounded walk (``reprlib``): a few hundred bytes of YAML aliases can
    expand to a value whose full repr is megabytes, and building it would be the problem itself.
    """
    return clip(_REPR.repr(value), limit)


def clip(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters, marked with ``...`` when cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
