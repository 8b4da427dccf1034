"""The documents of ``jzero data prepare``'s sources, read one at a time: files, folders, globs and JSONL.

A source is a file, a folder (every file under it, sorted), or a glob (``**`` matches sub-folders).
A text file is one document, read as UTF-8 with undecodable bytes replaced (U+FFFD): some real
sources, the standard library's own tests among them, are not valid UTF-8. A ``.jsonl`` file holds
one document per line, a JSON object with a ``text`` string; blank lines are skipped. Nothing holds
more than one document in memory.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

from jzero.errors import ConfigError, clip

__all__ = ["Documents", "expand_source", "expand_sources", "read_documents"]


def expand_source(source: str, key: str) -> list[Path]:
    """The files a source names: itself, every file under a folder (sorted), or a glob's files (sorted).

    Args:
      source: a file, a folder or a glob.
      key: the config key or flag that names the source in errors.

    Returns:
      The files, at least one.

    Raises:
      ConfigError: no file is found at ``source``.
    """
    path = Path(source)
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
    else:
        files = sorted(Path(p) for p in glob.glob(source, recursive=True) if Path(p).is_file())
    if not files:
        raise ConfigError(key, f"no files found at {source}")
    return files


def expand_sources(sources: Sequence[str], key: str = "SOURCES") -> list[Path]:
    """Every source's files, in the order given; a file named twice is read once, at its first place."""
    seen: dict[Path, Path] = {}
    for source in sources:
        for f in expand_source(source, key):
            seen.setdefault(f.resolve(), f)
    return list(seen.values())


def _jsonl_documents(path: Path) -> Iterator[tuple[str, int]]:
    found = False
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                shown = clip(line.decode("utf-8", "replace").strip(), 60)
                raise ConfigError(str(path), f"line {number} is not JSON: {shown}") from None
            text = record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise ConfigError(str(path), f"line {number} is not a JSON object with a text string")
            found = True
            yield text, len(line)
    if not found:
        raise ConfigError(str(path), "is an empty JSONL file: no line holds a document")


def read_documents(path: Path) -> Iterator[tuple[str, int]]:
    """The documents of one file, each with the bytes of the file it took (for a progress bar).

    Args:
      path: a text file (one document) or a ``.jsonl`` file (one per line, a ``text`` field).

    Yields:
      ``(text, bytes_read)`` pairs.

    Raises:
      ConfigError: named by the file: it cannot be read, or is a JSONL file with no document, a line
        that is not JSON, or a line without a ``text`` string.
    """
    try:
        if path.suffix == ".jsonl":
            yield from _jsonl_documents(path)
        else:
            data = path.read_bytes()
            yield data.decode("utf-8", errors="replace"), len(data)
    except OSError as err:
        raise ConfigError(str(path), f"cannot read it: {err.strerror or err}") from None


class Documents:
    """The documents at some sources, streamed afresh on each iteration.

    Attributes:
      files: the sources' files, in order (:func:`expand_sources`).
      total_bytes: their size on disk.
      bytes_read: the bytes the current iteration has read so far.
    """

    def __init__(self, sources: Sequence[str], key: str = "SOURCES"):
        self.files = expand_sources(sources, key)
        self.total_bytes = sum(f.stat().st_size for f in self.files)
        self.bytes_read = 0

    def __iter__(self) -> Iterator[str]:
        self.bytes_read = 0
        for path in self.files:
            for text, size in read_documents(path):
                self.bytes_read += size
                yield text
