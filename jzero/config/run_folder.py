"""The run folder (``run.dir``): the name of everything a run writes there, its metrics log read
back, the checks on a path before a run writes to it, and its one writer's lock.

One writer per run folder: ``jzero train`` holds ``<run.dir>/train.lock`` for the whole run. The lock
is ``fcntl.flock`` on that file, so the kernel releases it when the holder's process ends, however it
ends: a killed run never blocks its rerun. The file names the holder (its pid and host) for the
refusal's one line, and is removed when the holder lets go. Readers (``jzero checkpoint
info|verify|export``, ``jzero sample``) never take it. No JAX: the launcher reads the folder between
restarts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jzero.errors import ConfigError, path_error

__all__ = [
    "CHECKPOINTS",
    "LOCK",
    "RunDir",
    "RunLock",
    "check_run_dir",
    "check_run_path",
    "create_run_dir",
    "holder",
    "not_a_folder",
    "process_alive",
    "writer_may_be_live",
]

CHECKPOINTS = "checkpoints"  # <run.dir>/checkpoints/<step>/, one folder per committed step
LOCK = "train.lock"  # held by the one jzero train writing the folder (:class:`RunLock`); gone when it ends


def not_a_folder(path: str | Path) -> str | None:
    """Why a run folder a reader was given is not a folder, in words, or None when it is one."""
    path = Path(path)
    if path.is_dir():
        return None
    if path.is_symlink():
        return f"is not a run folder: it is a symbolic link to {os.readlink(path)}, which does not exist"
    return "is a file, not a run folder" if path.exists() else "is not a run folder: no such folder"


@dataclasses.dataclass(frozen=True)
class RunDir:
    """A run's folder and the paths of its outputs.

    Attributes:
      path: the folder, ``run.dir``.
    """

    path: Path

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def lock(self) -> Path:
        """The lock file of the trainer writing here (:class:`RunLock`)."""
        return self.path / LOCK

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    @property
    def tokenizer(self) -> Path:
        """The run's own copy of its BPE tokenizer (a byte-level run has none): what ``jzero sample`` decodes with."""
        return self.path / "tokenizer.json"

    @property
    def hf_config(self) -> Path:
        """The Hugging Face ``config.json`` a run imported from (``jzero checkpoint import``): what an
        export keeps of it beyond the model's shape (token ids, names)."""
        return self.path / "hf_config.json"

    @property
    def profile(self) -> Path:
        """The ``jax.profiler`` trace of ``run.profile``'s steps."""
        return self.path / "profile"

    def resumed_config(self, step: int) -> Path:
        """Where a run resumed at ``step`` with another config writes it."""
        return self.path / f"config.step-{step}.yaml"

    def ledger(self, step: int) -> Path:
        """The start-up ledger's file: ``ledger.json``, or ``ledger.step-N.json`` when resumed."""
        first = self.path / "ledger.json"
        return first if not first.exists() else self.path / f"ledger.step-{step}.json"

    def holds(self) -> list[str]:
        """The names of a run's own files already here: a folder that has one holds a run."""
        return [p.name for p in (self.metrics, self.config, self.checkpoints) if p.exists()]

    def newest_committed_step(self) -> int | None:
        """The newest checkpoint Orbax committed (a folder named by its step alone), or None."""
        folder = self.checkpoints
        steps = [int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit()] if folder.is_dir() else []
        return max(steps, default=None)

    def last_logged_step(self) -> int | None:
        """The step of the last whole record in ``metrics.jsonl``, or None."""
        return max((record["step"] for _, record in self._records()), default=None)

    def trim_metrics(self, last_step: int) -> int:
        """Drop the records past ``last_step`` (and a torn last line) from ``metrics.jsonl``,
        atomically, so a resumed run logs each step once. Returns how many were dropped.

        Raises:
          OSError: the log could not be rewritten.
        """
        lines = self.metrics.read_text(errors="replace").splitlines() if self.metrics.exists() else []
        kept = [line for line, record in self._records() if record["step"] <= last_step]
        if len(kept) == len(lines):
            return 0
        tmp = self.metrics.with_name(f".{self.metrics.name}.trim-{os.getpid()}")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, self.metrics)
        return len(lines) - len(kept)

    def _records(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Each whole record of ``metrics.jsonl`` with an integer step, and its line."""
        if not self.metrics.exists():
            return
        for line in self.metrics.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                yield line, record


class RunLock:
    """The lock of one run folder, held from :meth:`acquire` to :meth:`release` (or as a context
    manager). A second lock on the folder, in this process or another, is refused at once.

    Example::

      with RunLock("runs/mine").acquire():
          ...  # the only writer of runs/mine

    Args:
      run_dir: the run folder; it is created (with its missing parents) if need be.
    """

    def __init__(self, run_dir: str | Path):
        self.folder = RunDir(Path(run_dir))
        self.fd: int | None = None
        self.created: list[Path] = []  # folders acquire made, deepest first

    def acquire(self) -> RunLock:
        """Take the lock and write the holder's pid and host into it.

        Returns:
          This lock, held.

        Raises:
          ConfigError: ``run.dir``: another holder has the folder (naming its pid and host), or the
            path cannot be a folder (:func:`jzero.errors.path_error`).
          OutputWriteError: ``run.dir``: the file system refused the folder or its lock file
            (read-only, full, no permission). Folders made for the attempt are removed.
        """
        self.created = _make_folders(self.folder.path)
        try:
            self.fd = _locked(self.folder.lock)
            _name_holder(self.fd, self.folder.lock)
        except BaseException:
            self.release()
            raise
        return self

    def release(self) -> None:
        """Remove the lock file and let go; then remove the folders :meth:`acquire` made, if empty."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.folder.lock)  # while held: whoever opened it meanwhile sees it gone and retries
            os.close(self.fd)
            self.fd = None
        self._remove_created()

    def _remove_created(self) -> None:
        for folder in self.created:  # a refused run leaves no empty folder behind
            with contextlib.suppress(OSError):
                folder.rmdir()
        self.created = []

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder(lock_file: str | Path) -> str:
    """What a lock file says of its holder (``pid N on host H``), or that it says nothing yet."""
    try:
        text = Path(lock_file).read_text(errors="replace").strip()
    except OSError:
        text = ""
    return " ".join(text.split()[:6]) or "holder not yet named"


def writer_may_be_live(run_dir: str | Path) -> bool:
    """Whether a trainer may be writing ``run_dir`` now, seen without taking its lock (taking it,
    even for a moment, could refuse a trainer starting then): its lock file exists and does not
    name a process of this host that has ended."""
    lock = RunDir(Path(run_dir)).lock
    if not lock.exists():
        return False
    words = holder(lock).split()  # "pid N on host H"
    if len(words) != 5 or words[0] != "pid" or not words[1].isdigit() or words[4] != socket.gethostname():
        return True  # not named yet, or another host's: it may be live
    return process_alive(int(words[1]))


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` of this host is running (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _name_holder(fd: int, path: Path) -> None:
    """Write this process's pid and host into the lock file, for a refused second trainer to name."""
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode())
    except OSError as err:
        raise path_error("run.dir", path, err, "write") from None


def _make_folders(run_dir: Path) -> list[Path]:
    """Create ``run_dir`` and its missing parents; returns those created, deepest first."""
    missing = [p for p in (run_dir, *run_dir.parents) if not p.exists()]
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise path_error("run.dir", run_dir, err, "create") from None
    return missing


def _locked(path: Path) -> int:
    """An fd of ``path`` holding its flock. A file unlinked by its last holder between our open and
    our lock is not the lock any more: open the new one."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as err:
            raise path_error("run.dir", path, err, "create") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(
                "run.dir",
                f"{path.parent} is being written by another jzero train ({holder(path)}); "
                "wait for it to end, or choose another run.dir",
            ) from None
        except OSError as err:  # a file system without locks
            os.close(fd)
            raise ConfigError("run.dir", f"cannot lock {path}: {err.strerror or err}") from None
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        os.close(fd)


# Before a run writes to the folder


def check_run_path(run_dir: Path) -> None:
    """Refuse a ``run.dir`` that cannot be a folder: its nearest existing ancestor is a file."""
    for folder in (run_dir, *run_dir.parents):
        if folder.exists():
            if not folder.is_dir():
                raise ConfigError("run.dir", f"{folder} is a file, not a folder")
            break


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
