"""The run folder before a run writes to it: a path that can be a folder, one that holds no other
run unless resumed, and its lock, which process 0 holds for the whole run."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
from jax.experimental import multihost_utils

from jzero.config.rundir import RunDir
from jzero.config.runlock import RunLock
from jzero.distributed.runtime import is_primary
from jzero.errors import ConfigError, OutputWriteError, path_error

__all__ = ["check_run_dir", "check_run_path", "create_run_dir", "lock_run_dir"]


def check_run_path(run_dir: Path) -> None:
    """Refuse a ``run.dir`` that cannot be a folder: its nearest existing ancestor is a file."""
    for folder in (run_dir, *run_dir.parents):
        if folder.exists():
            if not folder.is_dir():
                raise ConfigError("run.dir", f"{folder} is a file, not a folder")
            break


def lock_run_dir(path: str) -> RunLock:
    """The run folder's lock (:class:`~jzero.config.runlock.RunLock`), held by process 0 once every
    process knows it got it; every process raises the refusal. Release it on every exit path.

    Raises:
      ConfigError: ``run.dir``: another trainer holds the folder, or it cannot be made.
    """
    run_dir = Path(path)
    check_run_path(run_dir)
    lock, refused = RunLock(run_dir), None
    if is_primary():
        try:
            lock.acquire()
        except (ConfigError, OutputWriteError) as err:
            refused = err
    if jax.process_count() > 1:  # the others learn process 0's answer (a collective)
        agreed = multihost_utils.process_allgather(np.int32(refused is not None))
        if refused is None and np.any(agreed):
            refused = ConfigError("run.dir", f"process 0 could not take the lock {lock.folder.lock}")
    if refused is not None:
        raise refused
    return lock


def check_run_dir(path: str, resume: bool) -> tuple[Path, bool]:
    """``run.dir`` and whether it already holds a run, writing nothing. Without ``resume`` a folder
    that holds a run is refused, so nothing is overwritten; a path that cannot be a folder is refused."""
    run_dir = Path(path)
    check_run_path(run_dir)
    existing = RunDir(run_dir).holds()
    if existing and not resume:
        raise ConfigError("--no-resume", f"{run_dir} already holds a run ({', '.join(existing)}); choose another run.dir")
    return run_dir, bool(existing)


def create_run_dir(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise path_error("run.dir", run_dir, err, "create") from None
