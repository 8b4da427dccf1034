"""``jzero data prepare``: text files, folders, globs or JSONL into a token folder (:mod:`jzero.data.tokens`).

Two streamed passes over the documents (:class:`jzero.data.sources.Documents`): the first trains a
byte-level BPE (:func:`jzero.data.tokenizer.train_bpe`; skipped with ``--tokenizer``), the second
encodes them in chunks and appends each document's ids and an end-of-document id to its split's
file. Memory holds one chunk of documents, not the input.

Document ``i`` (in the sources' order) goes to the validation split when
``floor((i + 1) * f) > floor(i * f)`` for ``--eval-fraction f``: evenly spread, and the same on
every run. With two documents or more and none chosen so, the last one is.

Nothing is overwritten: an ``--out`` that exists and holds anything is refused. The folder is
written beside it as ``.NAME.partial-PID``, locked (``flock``) while its process lives, and renamed
onto ``--out`` at the end: an error or Ctrl-C removes it, and the next prepare onto ``--out``
removes those of processes that died without cleaning up (SIGKILL). While one is locked, another
prepare onto ``--out`` is refused; two that start together both write, and the second to finish is
refused by the rename, which replaces no folder that holds anything.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import math
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn

from jzero.config.run_folder import process_alive
from jzero.data.sources import Documents
from jzero.data.tokenizer import EOS_TOKENS, MIN_BPE_VOCAB, SPECIAL_TOKENS, BpeTokenizer, train_bpe
from jzero.data.tokens import TOKENIZER_FILE, TokenHeader, TokenWriter
from jzero.errors import ConfigError, checked_path, path_error

__all__ = ["MAX_VOCAB", "is_eval_document", "prepare", "prepare_command"]

MAX_VOCAB = 2**31 - 1  # ids are stored as uint32 and read as int32
CHUNK_BYTES = 4 << 20  # text encoded per encode_batch call: the documents held in memory at once
CHUNK_DOCUMENTS = 1024


def is_eval_document(index: int, eval_fraction: float) -> bool:
    """Whether document ``index`` is held out for validation: ``floor((i+1) f) > floor(i f)``."""
    return math.floor((index + 1) * eval_fraction) > math.floor(index * eval_fraction)


class _Bar(AbstractContextManager):
    """A bar per pass over the documents, in bytes read, on stderr; nothing when disabled or when
    stderr is not a terminal (a log would get only the finished bars, after the summary says it all)."""

    def __init__(self, enabled: bool):
        columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeElapsedColumn())
        console = Console(stderr=True)
        self.progress = Progress(*columns, console=console, disable=not (enabled and console.is_terminal))

    def __enter__(self) -> _Bar:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is not None:  # bad input is one line: the bar goes
            self.progress.live.transient = True
        self.progress.__exit__(*exc)

    def track(self, documents: Documents, description: str) -> Iterator[str]:
        task = self.progress.add_task(description, total=documents.total_bytes)
        for text in documents:
            yield text
            self.progress.update(task, completed=documents.bytes_read)
        self.progress.update(task, completed=documents.total_bytes)


def _check_options(vocab_size: int | None, tokenizer: str | Path | None, eval_fraction: float) -> None:
    if (vocab_size is None) == (tokenizer is None):
        raise ConfigError("--vocab-size", "give --vocab-size N (train a tokenizer) or --tokenizer FILE, one of them")
    if vocab_size is not None and not MIN_BPE_VOCAB <= vocab_size <= MAX_VOCAB:
        least = f"at least {MIN_BPE_VOCAB} (the 256 bytes and {' and '.join(SPECIAL_TOKENS)})"
        raise ConfigError("--vocab-size", f"must be {least} and at most {MAX_VOCAB:,}, got {vocab_size}")
    if not 0 < eval_fraction < 1:  # NaN fails this too
        raise ConfigError("--eval-fraction", f"must be above 0 and below 1, got {eval_fraction}")


def _check_out(out: Path) -> None:
    if out.is_dir():
        if any(out.iterdir()):
            raise ConfigError("--out", f"{out} exists and is not empty; prepare writes a new folder and overwrites nothing")
    elif out.exists() or out.is_symlink():
        raise ConfigError("--out", f"{out} exists and is not a folder")


def _given_tokenizer(path: Path) -> BpeTokenizer:
    """``--tokenizer``: a ``tokenizer.json``, or a Hugging Face model's folder holding one."""
    if path.is_dir():
        if not (path / TOKENIZER_FILE).is_file():
            raise ConfigError("--tokenizer", f"{path} is a folder without a {TOKENIZER_FILE}")
        path = path / TOKENIZER_FILE
    tok = BpeTokenizer(path, "--tokenizer")
    if tok.eos_id is None:
        ends = ", ".join(EOS_TOKENS)
        raise ConfigError("--tokenizer", f"{path} has none of the end-of-document tokens {ends}: one ends every document")
    if tok.vocab_size > MAX_VOCAB:
        raise ConfigError("--tokenizer", f"{path} has {tok.vocab_size:,} ids, over {MAX_VOCAB:,}")
    return tok


def _chunks(texts: Iterable[str]) -> Iterator[list[str]]:
    chunk: list[str] = []
    size = 0
    for text in texts:
        chunk.append(text)
        size += len(text)
        if size >= CHUNK_BYTES or len(chunk) >= CHUNK_DOCUMENTS:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _write_tokens(texts: Iterable[str], tok: BpeTokenizer, folder: Path, eval_fraction: float) -> TokenHeader:
    """Encode the documents in chunks into ``folder``'s split files; the header last."""
    hf = tok.hf
    hf.encode_special_tokens = True  # a document's own "<|endoftext|>" is text, not the end of it
    writer = TokenWriter(folder, tok.vocab_size, tok.eos_id)
    try:
        index, pending = 0, None  # the newest document waits: it is the validation one if none else is
        for chunk in _chunks(texts):
            for encoding in hf.encode_batch_fast(chunk):
                ids = np.empty(len(encoding.ids) + 1, writer.dtype)
                ids[:-1], ids[-1] = encoding.ids, tok.eos_id
                if pending is not None:
                    writer.add(*pending)
                pending = (ids, "eval" if is_eval_document(index, eval_fraction) else "train")
                index += 1
        if pending is not None:
            no_eval = writer.counts["eval"][0] == 0 and index >= 2
            writer.add(pending[0], "eval" if no_eval else pending[1])
        return writer.finish(tok.digest)
    finally:
        writer.close()


def _partial_prefix(out: Path) -> str:
    """``.NAME.partial-``, the PID follows; the name is cut so that the whole fits 255 bytes."""
    return f".{out.name[:200]}.partial-"


def _sweep(out: Path) -> None:
    """Remove the temporary folders beside ``out`` left by prepares that died (SIGKILL, a second
    Ctrl-C while cleaning up); refuse ``out`` while another prepare is writing it."""
    prefix = _partial_prefix(out)
    try:
        names = [n for n in os.listdir(out.parent) if n.startswith(prefix) and n[len(prefix) :].isdigit()]
    except OSError:
        return  # no such folder yet, or unreadable: making the temporary folder says why
    for name in names:
        _remove_if_dead(out.parent / name, int(name[len(prefix) :]), out)


def _remove_if_dead(partial: Path, pid: int, out: Path) -> None:
    """Remove ``partial`` if the prepare that made it is dead: its lock free, its PID gone (or ours)."""
    try:
        fd = os.open(partial, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return  # gone meanwhile, or not a folder
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held = f"another jzero data prepare (pid {pid}) is writing {out}"
            raise ConfigError("--out", f"{held}; wait for it to end, or choose another --out") from None
        # Unlocked but its PID alive: a writer between mkdir and flock, or a reused PID; left alone.
        if pid == os.getpid() or not process_alive(pid):
            with contextlib.suppress(OSError):
                if os.path.samestat(os.stat(partial), os.fstat(fd)):  # still the folder locked
                    shutil.rmtree(partial)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _partial_folder(out: Path) -> Iterator[Path]:
    """A new locked folder beside ``out`` to write in, renamed onto ``out`` when the block ends
    well; on any exception (Ctrl-C too) it is removed, with the parents made for it."""
    made: list[Path] = []
    partial, created, lock = out.parent / f"{_partial_prefix(out)}{os.getpid()}", False, None
    try:
        for parent in reversed([p for p in out.absolute().parents if not p.exists()]):
            parent.mkdir()
            made.append(parent)
        partial.mkdir()
        created = True
        lock = os.open(partial, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(lock, fcntl.LOCK_EX)  # the kernel releases it however this process ends
        yield partial
        _publish(partial, out)
    except BaseException:
        if created:
            shutil.rmtree(partial, ignore_errors=True)
        for parent in reversed(made):
            with contextlib.suppress(OSError):  # another writer may have put something there since
                parent.rmdir()
        raise
    finally:
        if lock is not None:
            os.close(lock)


def _publish(partial: Path, out: Path) -> None:
    try:
        os.replace(partial, out)  # onto an empty folder too: rename(2) replaces an empty directory
    except OSError as err:
        if err.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
            raise
        raise ConfigError("--out", f"{out} was written meanwhile, by another process; not overwritten") from None


def prepare(
    sources: list[str],
    out: str | Path,
    *,
    vocab_size: int | None = None,
    tokenizer: str | Path | None = None,
    eval_fraction: float = 0.02,
    progress: bool = True,
) -> TokenHeader:
    """Tokenize the sources' documents into a new token folder ``out``.

    Args:
      sources: text files, folders, globs or ``.jsonl`` files (:mod:`jzero.data.sources`).
      out: the folder to write: it must not exist, or be empty.
      vocab_size: train a byte-level BPE of at most this many ids on the sources.
      tokenizer: or use this ``tokenizer.json``, or a Hugging Face model folder's (it must have an
        end-of-document token, :data:`jzero.data.tokenizer.EOS_TOKENS`); it is copied.
      eval_fraction: the share of documents held out for validation, in (0, 1).
      progress: draw a bar per pass on stderr.

    Returns:
      The header written to ``out/tokens.json``.

    Raises:
      ConfigError: bad options, sources (none found, a JSONL without documents or ``text``), a bad
        tokenizer, an ``--out`` that holds something, that another prepare is writing, or that
        cannot be a folder (under a file, a NUL byte); nothing is left written then.
      OutputWriteError: the machine refused the writes (a full disk, a read-only folder); the same.
    """
    _check_options(vocab_size, tokenizer, eval_fraction)
    out = checked_path("--out", out)
    for source in sources:
        checked_path("SOURCES", source)
    _check_out(out)
    documents = Documents(sources)
    given = _given_tokenizer(checked_path("--tokenizer", tokenizer)) if tokenizer is not None else None
    _sweep(out)
    try:
        with _partial_folder(out) as partial, _Bar(progress) as bar:
            path = partial / TOKENIZER_FILE
            if given is None:
                trained = train_bpe(bar.track(documents, "training the tokenizer"), vocab_size)
                with open(path, "x", encoding="utf-8") as f:  # not trained.save: Rust's errors are no OSErrors
                    f.write(trained.to_str(pretty=True))
            else:
                shutil.copyfile(given.path, path)
            return _write_tokens(bar.track(documents, "tokenizing"), BpeTokenizer(path), partial, eval_fraction)
    except OSError as err:  # reading a source raises ConfigErrors: this is writing --out
        raise path_error("--out", out, err, "write") from None


def prepare_command(args: argparse.Namespace) -> int:
    """``jzero data prepare``: :func:`prepare` with the flags, then one summary line on stdout; returns 0.

    Raises:
      ConfigError: :func:`prepare`'s.
      OutputWriteError: :func:`prepare`'s.
    """
    t0 = time.perf_counter()
    header = prepare(
        args.sources,
        args.out,
        vocab_size=args.vocab_size,
        tokenizer=args.tokenizer,
        eval_fraction=args.eval_fraction,
        progress=not args.quiet,
    )
    train, held = header.splits["train"], header.splits["eval"]
    print(
        f"{train.documents + held.documents:,} documents, {train.tokens + held.tokens:,} tokens "
        f"(validation: {held.documents:,} documents, {held.tokens:,} tokens), vocabulary {header.vocab_size:,}, "
        f"{header.dtype}, {time.perf_counter() - t0:.1f} s -> {args.out}"
    )
    return 0
