"""What the check for ids past the vocabulary costs when the data opens: one pass of
:func:`jzero.data.tokens.largest_id` over ``tokens.bin``, against the first epoch's read of the same
file (every window once, as the training batches read them).

    python benchmarks/id_scan.py DIR [--seq-len 128]

``DIR`` is a ``jzero data prepare`` folder (docs/data.md makes one of the standard library). Before
each cold read the file is dropped from the page cache (``posix_fadvise``); the warm scan reads it
again at once.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from jzero.data.tokens import largest_id, open_split, read_header, token_dtype
from jzero.training.data import TextBatches


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    header = read_header(args.folder)
    path, dtype = args.folder / header.splits["train"].file, token_dtype(header.vocab_size)
    evict(path)
    cold = timed(lambda: largest_id(path, dtype))
    warm = timed(lambda: largest_id(path, dtype))
    batches = TextBatches(open_split(args.folder, "train"), args.seq_len, 1, 0, key="data.tokens")
    evict(path)
    epoch = timed(lambda: [batches.dataset[i] for i in range(batches.num_windows)])
    mib = path.stat().st_size / 2**20
    print(f"{path}: {mib:.1f} MiB, largest id {largest_id(path, dtype)} (vocabulary {header.vocab_size})")
    print(f"scan: {cold * 1e3:.0f} ms cold, {warm * 1e3:.0f} ms warm; first epoch's read "
          f"({batches.num_windows:,} windows, cold): {epoch:.1f} s; scan / epoch {cold / epoch:.2%}")  # fmt: skip


if __name__ == "__main__":
    main()
