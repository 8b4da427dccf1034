"""Checkpoint writes in flight in this process: committed before the interpreter exits, and before
another manager opens their folder.

An async save (:meth:`jzero.checkpoint.runs.RunCheckpoints.save`) finishes on Orbax's threads,
which hand work to ``concurrent.futures`` executors. Python refuses new executor work from the
start of its shutdown (``concurrent.futures`` registers that with ``threading._register_atexit``),
before any :mod:`atexit` callback runs. So a script whose last line was ``save(...)`` exited 0 and
left only ``<step>.orbax-checkpoint-tmp`` behind, with three tracebacks ending in "cannot schedule
new futures after interpreter shutdown" (the README's snippet, run as written). The wait is
registered the same way, after ``concurrent.futures``, so it runs first.

A second manager opened on the same folder would sweep the first one's temporary folder away as a
killed run's leftover (Orbax's ``cleanup_tmp_directories``): so it waits for that write first.
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401  registers its exit hook before ours, so ours runs first
import os
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["forget", "track", "wait_for"]

_IN_FLIGHT: list[Any] = []  # RunCheckpoints with a write in flight, held until it is committed


def track(checkpoints: Any) -> None:
    """Commit ``checkpoints``' write in flight at exit unless it is waited for first."""
    if checkpoints not in _IN_FLIGHT:
        _IN_FLIGHT.append(checkpoints)


def forget(checkpoints: Any) -> None:
    """Its write was waited for: nothing to do at exit."""
    if checkpoints in _IN_FLIGHT:
        _IN_FLIGHT.remove(checkpoints)


def wait_for(directory: Path) -> None:
    """Commit the writes in flight into ``directory`` (raising a failure)."""
    for checkpoints in list(_IN_FLIGHT):
        if checkpoints.directory == directory:
            checkpoints.wait()


def _commit_in_flight() -> None:
    """Wait for every write in flight; a failed one is one line and exit status 1, never 0."""
    failed = False
    for checkpoints in list(_IN_FLIGHT):
        try:
            checkpoints.wait()
        except Exception as err:  # CheckpointWriteError names the step and its folder
            print(f"jzero: at exit, {err}", file=sys.stderr)
            failed = True
    if failed:
        sys.stderr.flush()
        os._exit(1)


threading._register_atexit(_commit_in_flight)
