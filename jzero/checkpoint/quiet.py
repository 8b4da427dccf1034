"""Orbax's leftovers after a failed read or write, kept off the terminal: jzero reports the failure
once, in one line, and the sibling operations' tracebacks would bury it."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["failure_reported", "quiet_orbax"]

_ORBAX = f"{os.sep}orbax{os.sep}"


def _code_of(tb: Any) -> list[tuple[str, str]]:
    """``(file, function)`` of each frame of a traceback, read without ``linecache`` (which may
    not import any more while Python shuts down)."""
    frames = []
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_frame.f_code.co_name))
        tb = tb.tb_next
    return frames


def _quiet_orbax_leftovers(previous: Callable[[Any], None], is_finalizing: Callable[[], bool]) -> Callable[[Any], None]:
    """An unraisable-exception hook that drops two kinds of Orbax leftovers and passes on the rest.

    - Orbax runs each read or write in an asyncio loop of its own and closes it as soon as one
      TensorStore operation fails. The operations still in flight then finish on TensorStore's
      threads and try to wake the closed loop, each raising "Event loop is closed" here: thousands
      of tracebacks after one unreadable checkpoint, with jzero's one-line answer among them.
    - After a failed write (a full disk), the write's other coroutines are never finished; Python
      collects them as it shuts down and reports each ("Exception ignored in <coroutine ...>"). The
      failure itself has reached the caller once, as a :class:`CheckpointWriteError`.

    Everything it uses is bound now: module globals may be gone by the time it runs at shutdown.
    """
    code_of, orbax = _code_of, _ORBAX

    def hook(unraisable: Any) -> None:
        exc, frames = unraisable.exc_value, code_of(unraisable.exc_traceback)
        woke_closed_loop = isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"
        if woke_closed_loop and any(name == "call_soon_threadsafe" for _, name in frames):
            return
        if is_finalizing() and any(orbax in file for file, _ in frames):
            return
        previous(unraisable)

    return hook


class _QuietOrbaxOrphans(logging.Filter):
    """Drops asyncio's "... exception was never retrieved" for Orbax's own tasks and TensorStore's
    futures: when one read or write of a checkpoint fails, its sibling operations fail the same way
    and are never awaited. jzero reports the failure itself once (:func:`failure_reported`), and
    from then on drops them all: their tracebacks do not always pass through Orbax."""

    reported = False
    installed = False

    def filter(self, record: logging.LogRecord) -> bool:
        if "exception was never retrieved" not in record.getMessage():
            return True
        if self.reported:
            return False
        return not any(_ORBAX in file for file, _ in _code_of(record.exc_info[2] if record.exc_info else None))


_ORPHANS = _QuietOrbaxOrphans()


class _QuietItemMetadata(logging.Filter):
    """Drops Orbax's "Metadata file does not exist: <step>/<item>/_CHECKPOINT_METADATA": Orbax
    writes that file for a step, not for each item in it, and warns whenever an item's own array
    metadata is read (every restore: jzero checks the shapes first)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Metadata file does not exist") and message.endswith("_CHECKPOINT_METADATA"))


_ITEM_METADATA = _QuietItemMetadata()


def failure_reported() -> None:
    """A checkpoint read or write failed and jzero has said so: its orphaned operations are noise."""
    _ORPHANS.reported = True


def quiet_orbax() -> None:
    """Install the filters, once: called where checkpoints are opened, not on import."""
    if not _ORPHANS.installed:
        _ORPHANS.installed = True
        sys.unraisablehook = _quiet_orbax_leftovers(sys.unraisablehook, sys.is_finalizing)
        logging.getLogger("asyncio").addFilter(_ORPHANS)
        logging.getLogger("absl").addFilter(_ITEM_METADATA)
