"""Checkpoints that verify their own bytes: a manifest of every file's size and checksum.

Orbax commits a step atomically, but neither it nor TensorStore checks the data files when they
are read back: a truncated copy, a bad disk or a partial rsync after the commit is found only if it
happens to break decompression, and a flipped byte is read as if it were saved. So at commit jzero
writes ``jzero-manifest.json`` into the step folder (xxh3-64 of each file; in the save's background
thread, before Orbax renames the folder into place) and checks the files against it before any
read. Orbax's own step record (``_CHECKPOINT_METADATA``, ``commit_success.txt``) is left out: Orbax
rewrites it after the commit.

This module imports no JAX: :func:`verify` splits the files among processes by ``part``, and the
caller agrees on the verdict.
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import xxhash

from jzero.errors import DamagedCheckpoint

__all__ = ["MANIFEST", "Unverified", "verify", "write_manifest"]

MANIFEST = "jzero-manifest.json"
_TMP = f".{MANIFEST}.tmp"  # a manifest being written
_ALGORITHM = "xxh3_64"
_ORBAX_STEP_RECORD = ("_CHECKPOINT_METADATA", "commit_success.txt")  # rewritten by Orbax after the commit
_THREADS = min(8, os.cpu_count() or 1)


@dataclasses.dataclass(frozen=True)
class Unverified:
    """A step with no manifest, written before jzero wrote them: it can be read, not verified."""

    step_dir: Path

    def __str__(self) -> str:
        return f"checkpoint {self.step_dir} has no {MANIFEST} (written before jzero verified checkpoints); read unverified"


def _files(step_dir: Path) -> Iterator[Path]:
    for path in sorted(step_dir.rglob("*")):
        if path.is_file() and path.name not in (MANIFEST, _TMP, *_ORBAX_STEP_RECORD):
            yield path


def _digest(path: Path) -> str:
    """The file's xxh3-64, hashed from a memory map: no copy, and xxhash releases the GIL."""
    with path.open("rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return xxhash.xxh3_64_hexdigest(b"")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return xxhash.xxh3_64_hexdigest(mapped)


def _digests(paths: list[Path]) -> list[str | OSError]:
    """Each file's digest (or the error reading it), hashed by a few threads at once."""

    def one(path: Path) -> str | OSError:
        try:
            return _digest(path)
        except OSError as err:
            return err

    with ThreadPoolExecutor(_THREADS) as pool:
        return list(pool.map(one, paths))


def write_manifest(step_dir: Path) -> int:
    """Record every file of ``step_dir`` (size and checksum) in its manifest; returns the bytes hashed.

    Written to a temporary name and renamed, so a manifest is whole or absent.
    """
    paths = list(_files(step_dir))
    digests = _digests(paths)
    for digest in digests:
        if isinstance(digest, OSError):
            raise digest
    files = {
        str(p.relative_to(step_dir)): {"bytes": p.stat().st_size, _ALGORITHM: d} for p, d in zip(paths, digests, strict=True)
    }
    tmp = step_dir / _TMP
    tmp.write_text(json.dumps({"algorithm": _ALGORITHM, "files": files}, indent=0, sort_keys=True))
    os.replace(tmp, step_dir / MANIFEST)
    return sum(f["bytes"] for f in files.values())


def _manifest(step_dir: Path) -> dict[str, dict] | None:
    """The manifest's files, or None when there is none. A manifest that cannot be read is damage."""
    path = step_dir / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
        if manifest["algorithm"] != _ALGORITHM or not all(isinstance(f, dict) for f in files.values()):
            raise ValueError("not a manifest jzero wrote")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise DamagedCheckpoint(step_dir, MANIFEST, f"is unreadable ({type(err).__name__})") from None
    return files


def _size_problem(path: Path, want: dict) -> str | None:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return "is missing"
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    return None if size == want.get("bytes") else f"has {size:,} bytes, {want.get('bytes'):,} when written"


def _checksum_problem(digest: str | OSError, want: dict) -> str | None:
    if isinstance(digest, OSError):
        return f"cannot be read ({digest.strerror or digest})"
    return None if digest == want.get(_ALGORITHM) else f"has checksum {digest}, {want.get(_ALGORITHM)} when written"


def verify(step_dir: Path, part: tuple[int, int] = (0, 1), expect_manifest: bool = False) -> Unverified | int:
    """Check a step's files against its manifest: sizes first (every file), then checksums.

    Args:
      step_dir: a committed step folder.
      part: ``(k, n)``: hash only every n-th file from the k-th, so n processes share the reading
        (sizes are checked in full by each). Each process must then agree on the verdict.
      expect_manifest: the step says it was written with one, so its absence is damage.

    Returns:
      The bytes verified, or :class:`Unverified` for a step written before manifests.

    Raises:
      DamagedCheckpoint: naming the first bad file: a missing or resized one first, then by checksum.
    """
    files = _manifest(step_dir)
    if files is None:
        if expect_manifest:
            raise DamagedCheckpoint(step_dir, MANIFEST, "is missing")
        return Unverified(step_dir)
    names = sorted(files)
    for name in names:  # a stat each: truncated and missing files are found before any hashing
        if problem := _size_problem(step_dir / name, files[name]):
            raise DamagedCheckpoint(step_dir, name, problem)
    index, count = part
    mine = names[index::count]
    for name, digest in zip(mine, _digests([step_dir / name for name in mine]), strict=True):
        if problem := _checksum_problem(digest, files[name]):
            raise DamagedCheckpoint(step_dir, name, problem)
    return sum(files[name]["bytes"] for name in names[index::count])
