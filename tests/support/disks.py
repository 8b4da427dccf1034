"""A real small disk for fault tests: a tmpfs mounted for the length of a ``with`` block."""

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` at ``path`` (root only); skips where it cannot be mounted: an
    unprivileged user cannot mount one (the permission tests inject their failure instead)."""
    path.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)])
