"""jzero's errors, every kind in one place; ``str(err)`` is always one line.

Bad input, under :class:`JzeroError` (``"<where>: <what is wrong>"``; the command line prints it and
exits with status 2):

- :class:`ConfigError`: a config key or a command-line flag (``zero.stage``, ``--out``);
- :class:`PlanError`: a sharding plan asked of the Python API (a stage, a mesh, a tensor's spec);
- :class:`CheckpointError`: a checkpoint folder or file, named by its path;
  :class:`DamagedCheckpoint` is one whose files are not what was written, :class:`RotatedAway` a step
  deleted by its run while being read.

A run that stops, under :class:`RunError` (the command line prints it and exits with status 1):

- :class:`TrainingHalted`: ``train.nonfinite: halt`` met a non-finite gradient;
- :class:`Diverged`: the run is not training (the command line exits with status 4,
  :data:`jzero.distributed.process.DIVERGED`): :class:`TooManySkipped`, more than
  ``train.max_skipped_in_a_row`` steps in a row had one, or :class:`EndedNonFinite`, its last step did;
- :class:`CheckpointWriteError`: a checkpoint could not be written;
- :class:`OutputWriteError`: another of the run's outputs could not be written.
"""

from __future__ import annotations

import errno
import os
import reprlib
from pathlib import Path
from typing import Any

__all__ = [
    "CheckpointError",
    "CheckpointWriteError",
    "ConfigError",
    "DamagedCheckpoint",
    "Diverged",
    "EndedNonFinite",
    "JzeroError",
    "OutputWriteError",
    "PlanError",
    "RotatedAway",
    "RunError",
    "TooManySkipped",
    "TrainingHalted",
    "checked_path",
    "clip",
    "error_line",
    "os_reason",
    "path_error",
    "show_value",
]


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


class DamagedCheckpoint(CheckpointError):
    """A step whose files are not what was written: ``where`` is the step folder, ``file`` the first bad one."""

    def __init__(self, step_dir: Path, file: str, problem: str):
        self.step_dir, self.file, self.problem = step_dir, file, problem
        super().__init__(str(step_dir), f"checkpoint step {step_dir.name} is damaged: {file} {problem}")


class RotatedAway(CheckpointError):
    """A step its run's rotation (``checkpoint.keep``) deleted while it was being read: not damage."""

    def __init__(self, step_dir: Path):
        self.step_dir = step_dir
        super().__init__(str(step_dir), "was deleted by its run's rotation (checkpoint.keep) while being read")


class RunError(RuntimeError):
    """A run that stopped before its last step, for a reason that is not bad input."""


class TrainingHalted(RunError):
    """``train.nonfinite: halt`` met a step with a NaN or Inf gradient (its update was not applied)."""

    def __init__(self, step: int):
        self.step = step
        super().__init__(f"train.nonfinite=halt: step {step} had a non-finite gradient; its update was not applied")


class Diverged(RunError):
    """The run is not training: its steps are non-finite, and nothing untrained was saved."""


class TooManySkipped(Diverged):
    """More than ``train.max_skipped_in_a_row`` steps in a row had a non-finite gradient, so none
    of them applied an update: the run is not training, and stops.

    Attributes:
      first: the first step of the run of skipped steps.
      last: the step at which it passed the limit.
    """

    def __init__(self, limit: int, first: int, last: int, stopped: int):
        self.first, self.last = first, last
        super().__init__(
            f"train.max_skipped_in_a_row={limit}: steps {first} to {last} had a non-finite gradient "
            f"({last - first + 1} in a row) and applied nothing; stopped at step {stopped}, with no untrained step saved"
        )


class EndedNonFinite(Diverged):
    """The run's last step was non-finite (its loss, or its gradient without a loss scale to blame),
    so the run ends on a state it did not train, which is not saved.

    Attributes:
      step: the last step.
      first: the first step of the run of non-finite steps that it ends.
    """

    def __init__(self, step: int, first: int, loss: float):
        self.step, self.first = step, first
        steps = f"step {step}" if first == step else f"steps {first} to {step} ({step - first + 1} in a row)"
        super().__init__(
            f"the run ended on a non-finite step: {steps} had a non-finite loss or gradient (the last loss {loss:g}) "
            f"and applied nothing; no untrained step saved"
        )


class CheckpointWriteError(RunError):
    """A checkpoint write failed (disk full, permissions...); raised in the training thread."""

    def __init__(self, step: int, path: Path, cause: BaseException):
        self.step, self.path, self.cause = step, path, cause
        super().__init__(f"checkpoint: writing step {step} to {path} failed: {error_line(cause)}")


class OutputWriteError(RunError):
    """Writing one of the run's outputs failed (a full disk, permissions): one line naming it.

    Args:
      path: what could not be written.
      cause: the ``OSError``.
      key: the config key or flag that named ``path``, if any, to begin the line with.
      action: what was tried (``"create"``), for ``cannot create PATH``; else ``writing PATH failed``.
    """

    def __init__(self, path: str | Path, cause: OSError, key: str = "", action: str = ""):
        self.path, self.cause = path, cause
        reason = os_reason(cause, path)
        text = f"cannot {action} {path}: {reason}" if action else f"writing {path} failed: {reason}"
        super().__init__(f"{key}: {text}" if key else text)


# Errors that say the path itself cannot be what it is asked to be: the input's fault, not the system's.
_INPUT_ERRNOS = frozenset({errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENAMETOOLONG, errno.ELOOP, errno.ENOENT})


def path_error(key: str, path: str | Path, err: OSError, action: str) -> ConfigError | OutputWriteError:
    """An ``OSError`` met on ``path`` as one line, of the kind its cause is.

    Args:
      key: the config key or flag that named ``path`` (``"run.dir"``, ``"--out"``).
      path: the path that failed.
      err: the error.
      action: what was tried on it, a verb (``"create"``, ``"write"``).

    Returns:
      A :class:`ConfigError` (bad input, exit status 2) when the path cannot be what it is asked to
      be: a component is a file, a dangling link, a name too long; else an :class:`OutputWriteError`
      (exit status 1): a full disk, a read-only file system, a missing permission.
    """
    if err.errno in _INPUT_ERRNOS or _dangling_link(Path(path)) is not None:
        return ConfigError(key, f"cannot {action} {path}: {os_reason(err, path)}")
    return OutputWriteError(path, err, key=key, action=action)


def os_reason(err: OSError, path: str | Path) -> str:
    """Why ``path`` failed, in words: the errno's meaning, or the dangling link behind it (which
    the system reports as "File exists" or "No such file or directory")."""
    link = _dangling_link(Path(path))
    if link is not None:
        return f"{link} is a symbolic link to {os.readlink(link)}, which does not exist"
    return err.strerror or str(err)


def _dangling_link(path: Path) -> Path | None:
    """``path`` or its nearest ancestor that is a symbolic link to nothing, or None."""
    for part in (path, *path.parents):
        if part.is_symlink() and not part.exists():
            return part
    return None


def checked_path(key: str, path: str | Path) -> Path:
    """``path`` as a ``Path``, refused first if it holds a NUL byte, which no system call takes.

    Raises:
      ConfigError: named by ``key``.
    """
    if "\0" in str(path):
        raise ConfigError(key, f"a path must not contain a NUL byte, got {show_value(str(path))}")
    return Path(path)


def error_line(err: BaseException) -> str:
    """``Type: first sentence`` of an error: tensorstore appends pages of spec to its messages."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {text.split('. ')[0][:160]}"


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
