"""One writer per run folder: ``jzero train`` holds ``<run.dir>/train.lock`` for the whole run.

The lock is ``fcntl.flock`` on that file, so the kernel releases it when the holder's process ends,
however it ends: a killed run never blocks its rerun. The file names the holder (its pid and host)
for the refusal's one line, and is removed when the holder lets go. Readers (``jzero checkpoint
info|verify|export``, ``jzero sample``) never take it. No JAX.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from pathlib import Path

from jzero.config.rundir import RunDir
from jzero.errors import ConfigError, path_error

__all__ = ["RunLock", "holder", "process_alive", "writer_may_be_live"]


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
