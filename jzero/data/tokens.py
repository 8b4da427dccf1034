"""The token folder ``jzero data prepare`` writes and ``data.tokens`` reads.

Four files, each written once:

- ``tokens.bin``: the training split's token ids, one flat little-endian array,
  ``uint16`` when the vocabulary fits in 65,536 ids, else ``uint32``; every document is followed
  by the end-of-document id;
- ``eval.bin``: the validation split, whole documents held out of ``tokens.bin``, in the same form;
- ``tokens.json``: the header (:class:`TokenHeader`): the dtype, the vocabulary size, the
  end-of-document id, the tokenizer's SHA-256 and, per split, its file, documents and tokens;
- ``tokenizer.json``: the Hugging Face ``tokenizers`` tokenizer that made the ids.

Reading maps a split's file (:func:`open_split`): nothing is loaded until a window is sliced, so a
file of any size opens at once. A mapping keeps every page it touched resident in the process,
though, and the kernel maps whole page-cache folios (up to 2 MiB here) for a 258-byte window: read at
random, the process's RSS climbs to the file's size. So the map is advised random access (no
read-ahead of megabytes per window), and :func:`release_pages` unmaps what a window touched once
it is copied out (the pages stay in the page cache); ``benchmarks/data_rss.py`` measures both.

Opening checks the file's size against the header; :func:`largest_id` reads the ids once, front to
back in chunks (the kernel reads ahead; memory stays one chunk), so that an id past the model's
vocabulary is refused before training rather than turning every step's loss to NaN.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import mmap
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from jzero.errors import ConfigError, clip

__all__ = [
    "EVAL_FILE",
    "HEADER_FILE",
    "SPLITS",
    "TOKENIZER_FILE",
    "TOKENS_FILE",
    "SplitInfo",
    "TokenHeader",
    "TokenWriter",
    "largest_id",
    "open_split",
    "read_header",
    "release_pages",
    "token_dtype",
]

TOKENS_FILE = "tokens.bin"
EVAL_FILE = "eval.bin"
HEADER_FILE = "tokens.json"
TOKENIZER_FILE = "tokenizer.json"
SPLITS = {"train": TOKENS_FILE, "eval": EVAL_FILE}
FORMAT = "jzero-tokens"
VERSION = 1


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest id type for ``vocab_size`` ids: ``uint16`` up to 65,536, else ``uint32``."""
    return np.dtype("<u2" if vocab_size <= 1 << 16 else "<u4")


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    """One split of a token folder: its file's name, its documents and its tokens (EOS ids included)."""

    file: str
    documents: int
    tokens: int


@dataclasses.dataclass(frozen=True)
class TokenHeader:
    """``tokens.json``: what the ids of a token folder are.

    Attributes:
      dtype: ``uint16`` or ``uint32``.
      vocab_size: the tokenizer's ids run from 0 to ``vocab_size - 1``.
      eos_id: the end-of-document id that follows each document.
      tokenizer_hash: the SHA-256 of ``tokenizer.json`` (a :class:`jzero.data.tokenizer.Tokenizer`'s ``digest``).
      splits: ``train`` and ``eval``.
    """

    dtype: str
    vocab_size: int
    eos_id: int
    tokenizer_hash: str
    splits: dict[str, SplitInfo]

    def to_json(self) -> str:
        body = {"format": FORMAT, "version": VERSION, **dataclasses.asdict(self)}
        return json.dumps(body, indent=2) + "\n"


def _header_from(raw: Any, where: Path, key: str) -> TokenHeader:
    def bad(what: str) -> ConfigError:
        return ConfigError(key, f"{where} is not a token folder's header: {what}")

    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise bad(f'no "format": "{FORMAT}"')
    if raw.get("version") != VERSION:
        raise bad(f"version {clip(repr(raw.get('version')), 20)}, this jzero reads {VERSION}")
    ints = {name: raw.get(name) for name in ("vocab_size", "eos_id")}
    if any(type(v) is not int or v < 0 for v in ints.values()) or ints["vocab_size"] < 1:
        raise bad(f"vocab_size and eos_id must be integers, got {clip(repr(ints), 60)}")
    if raw.get("dtype") != token_dtype(ints["vocab_size"]).name:
        raise bad(f"dtype {clip(repr(raw.get('dtype')), 20)} for a vocabulary of {ints['vocab_size']}")
    if not isinstance(raw.get("tokenizer_hash"), str):
        raise bad("no tokenizer_hash")
    splits = raw.get("splits")
    if not isinstance(splits, dict) or set(splits) != set(SPLITS):
        raise bad(f"splits must be {' and '.join(SPLITS)}")
    infos = {}
    for name, file in SPLITS.items():
        s = splits[name]
        counts = [s.get(k) for k in ("documents", "tokens")] if isinstance(s, dict) else [None]
        if not isinstance(s, dict) or s.get("file") != file or any(type(c) is not int or c < 0 for c in counts):
            raise bad(f"split {name} must be {{file: {file}, documents: N, tokens: N}}")
        infos[name] = SplitInfo(file, s["documents"], s["tokens"])
    return TokenHeader(raw["dtype"], ints["vocab_size"], ints["eos_id"], raw["tokenizer_hash"], infos)


def read_header(folder: str | Path, key: str = "data.tokens") -> TokenHeader:
    """A token folder's checked header.

    Args:
      folder: the token folder.
      key: the config key that names it in errors.

    Returns:
      Its :class:`TokenHeader`, whose ``tokenizer.json`` has the hash it records.

    Raises:
      ConfigError: named by ``key``: no such folder, no header, a header that does not parse or is
        not a token folder's, or a ``tokenizer.json`` missing or not the one the header names.
    """
    folder = Path(folder)
    where = folder / HEADER_FILE
    if not folder.is_dir():
        raise ConfigError(key, f"{folder} is not a folder (a token folder is what jzero data prepare --out writes)")
    try:
        raw = json.loads(where.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(key, f"{folder} has no {HEADER_FILE}: not a token folder (jzero data prepare writes one)") from None
    except (OSError, ValueError) as err:
        raise ConfigError(key, f"cannot read {where}: {clip(str(getattr(err, 'strerror', None) or err), 80)}") from None
    header = _header_from(raw, where, key)
    tokenizer = folder / TOKENIZER_FILE
    try:
        digest = hashlib.sha256(tokenizer.read_bytes()).hexdigest()
    except OSError as err:
        raise ConfigError(key, f"cannot read {tokenizer}: {err.strerror or err}") from None
    if digest != header.tokenizer_hash:
        hashes = f"SHA-256 {digest[:12]}..., the header's {header.tokenizer_hash[:12]}..."
        raise ConfigError(key, f"{tokenizer} is not the tokenizer {where} names ({hashes})")
    return header


def open_split(folder: str | Path, split: str, key: str = "data.tokens", header: TokenHeader | None = None) -> np.ndarray:
    """A split's token ids as a read-only memory map, after checking its file against the header.

    Args:
      folder: the token folder.
      split: ``train`` (``tokens.bin``) or ``eval`` (``eval.bin``).
      key: the config key that names the folder in errors.
      header: the folder's header, if already read (default: :func:`read_header`).

    Returns:
      A 1-D ``np.memmap`` of the header's dtype (an empty array for an empty split).

    Raises:
      ConfigError: named by ``key``: the header's (:func:`read_header`), or a file that is missing,
        whose size is not a multiple of its dtype, or whose token count disagrees with the header.
    """
    folder = Path(folder)
    header = header if header is not None else read_header(folder, key)
    info, dtype = header.splits[split], token_dtype(header.vocab_size)
    path = folder / info.file
    try:
        size = path.stat().st_size
    except OSError as err:
        raise ConfigError(key, f"cannot read {path}: {err.strerror or err}") from None
    if size % dtype.itemsize:
        what = f"not a multiple of its dtype {dtype.name} ({dtype.itemsize} bytes)"
        raise ConfigError(key, f"{path} holds {size} bytes, {what}: it is cut short, or not a token file")
    if size // dtype.itemsize != info.tokens:
        header_file = folder / HEADER_FILE
        raise ConfigError(key, f"{path} holds {size // dtype.itemsize} tokens, its header {header_file} says {info.tokens}")
    if size == 0:
        return np.zeros((0,), dtype)  # mmap refuses an empty file
    ids = np.memmap(path, dtype=dtype, mode="r")
    _advise(ids, "MADV_RANDOM")
    return ids


def largest_id(path: str | Path, dtype: np.dtype, chunk: int = 1 << 22) -> int:
    """The largest id in a token file, or -1 for an empty one.

    Args:
      path: a split's file (:func:`open_split` has checked its size).
      dtype: its ids' dtype (:func:`token_dtype`).
      chunk: ids read at a time (4 Mi ids: 8 MiB of ``uint16``).

    Returns:
      The largest id. One sequential pass over the file, read ahead by the kernel: a mapped
      split's random-access advice would make it a page fault per 4 KiB.
    """
    buf, top = np.empty(chunk, dtype), -1
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(memoryview(buf).cast("B")):
            top = max(top, int(buf[: n // buf.itemsize].max()))
    return top


def _advise(ids: np.ndarray, advice: str) -> None:
    mapped, flag = getattr(ids, "_mmap", None), getattr(mmap, advice, None)  # np.memmap's own mmap; Linux's flags
    if isinstance(mapped, mmap.mmap) and flag is not None:
        mapped.madvise(flag)


def release_pages(ids: np.ndarray) -> None:
    """Unmap the pages that reading a memory-mapped split mapped into this process (a no-op for other arrays).

    The file's pages stay in the page cache, so reading them again costs a page fault, not a read:
    called once each window is copied out, it keeps the process's RSS to one window's pages (a few
    MiB), not every page read so far. It costs about 10 us.
    """
    _advise(ids, "MADV_DONTNEED")


class TokenWriter:
    """Appends documents' ids to a new folder's split files, then writes its header.

    Both split files are opened to create (never to overwrite) when the writer is made.
    """

    def __init__(self, folder: str | Path, vocab_size: int, eos_id: int):
        self.folder = Path(folder)
        self.vocab_size, self.eos_id = vocab_size, eos_id
        self.dtype = token_dtype(vocab_size)
        self.counts = {name: [0, 0] for name in SPLITS}  # documents, tokens
        self._files: dict[str, BinaryIO] = {}
        for name, file in SPLITS.items():
            self._files[name] = open(self.folder / file, "xb")  # noqa: SIM115 (closed by finish or close)

    def add(self, ids: np.ndarray, split: str) -> None:
        """One document's ids, its EOS id already at the end, into ``split``."""
        self._files[split].write(np.asarray(ids, self.dtype).tobytes())
        self.counts[split][0] += 1
        self.counts[split][1] += len(ids)

    def close(self) -> None:
        for f in self._files.values():
            f.close()

    def finish(self, tokenizer_hash: str) -> TokenHeader:
        """Close the split files and write ``tokens.json``; returns the header written."""
        self.close()
        splits = {name: SplitInfo(SPLITS[name], docs, tokens) for name, (docs, tokens) in self.counts.items()}
        header = TokenHeader(self.dtype.name, self.vocab_size, self.eos_id, tokenizer_hash, splits)
        with open(self.folder / HEADER_FILE, "x", encoding="utf-8") as f:
            f.write(header.to_json())
        return header
