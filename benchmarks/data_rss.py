"""The data pipeline's memory against the token file's size: peak RSS reading batches of a 20 MB and of
a 2 GB token folder.

    python benchmarks/data_rss.py [--tokens DIR] [--sizes 20e6 2e9] [--batches 200] [--warm] [--out benchmarks/results]

Each folder is the training ids of ``--tokens`` (a ``jzero data prepare`` folder of the standard
library's sources, docs/data.md; made from the stdlib's top-level files when it is missing) repeated
to the size: ``tokens.bin`` is written by streaming copies of the file, then its header. Before
each read, the file is dropped from the page cache (``posix_fadvise``), as a dataset larger than
memory would be (``--warm`` leaves it there, as a file just written is). A fresh Python process
then reads ``--batches`` global batches of gpt-tiny-bpe's shape (32 x 129) through
:func:`jzero.training.data.train_data` on the host (no devices: the same rows each process loads)
and reports its memory from ``/proc/self``: the RSS once the folder is open (JAX and grain
imported), the peak (VmHWM) after reading, and at the end the anonymous pages (RssAnon) and the
resident pages of the token file's mapping (``smaps``). Each file is read twice: as jzero reads it,
and without unmapping each window's pages (:func:`jzero.data.tokens.release_pages`), to show what
that release is for.

Each folder is deleted after its row.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPE = ["model.seq_len=128", "train.global_batch_size=32"]  # configs/gpt-tiny-bpe.yaml's


def _status(mapped: Path) -> dict[str, int]:
    """VmHWM, VmRSS and RssAnon of this process, and the resident pages of its mappings of ``mapped``, in bytes."""
    found = {"mapped": 0}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmHWM", "VmRSS", "RssAnon"):
                found[name] = int(value.split()[0]) * 1024
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            if "-" in line.split(" ", 1)[0]:  # a mapping's first line: range, perms, offset, dev, inode, path
                inside = line.rstrip("\n").endswith(str(mapped))
            elif inside and line.startswith("Rss:"):
                found["mapped"] += int(line.split()[1]) * 1024
    return found


def child(folder: str, batches: int, keep_pages: bool) -> None:
    """Read ``batches`` global batches of ``folder`` and print one JSON line of memory and time."""
    import jzero.training.data
    from jzero.config.loading import load_config
    from jzero.training.data import train_data

    if keep_pages:
        jzero.training.data.release_pages = lambda ids: None  # the release, switched off
    config = load_config(None, [*SHAPE, f"data.tokens={folder}", "model.vocab_size=65536"])
    data = train_data(config)
    mapped = (Path(folder) / "tokens.bin").resolve()
    before = _status(mapped)
    t0 = time.perf_counter()
    checksum = 0
    for step in range(batches):
        checksum += int(data.global_batch(step)[:, 0].sum())
    seconds = time.perf_counter() - t0
    got = {"before": before, "after": _status(mapped), "seconds": seconds, "windows": data.num_windows, "checksum": checksum}
    print(json.dumps(got))


def base_folder(tokens: Path, work: Path) -> Path:
    """``--tokens``, or a folder prepared now from the stdlib's top-level sources."""
    if tokens.is_dir():
        return tokens
    from jzero.data.prepare import prepare

    out = work / "base"
    print(f"{tokens} not found: preparing the stdlib's top-level .py files into {out}", flush=True)
    prepare([str(Path(sysconfig.get_paths()["stdlib"]) / "*.py")], out, vocab_size=4096, progress=False)
    return out


def repeated_folder(base: Path, size: int, out: Path) -> Path:
    """A token folder whose ``tokens.bin`` is ``base``'s, repeated to ``size`` bytes (whole ids)."""
    from jzero.data.tokens import EVAL_FILE, HEADER_FILE, TOKENIZER_FILE, TOKENS_FILE, SplitInfo, open_split, read_header

    header = read_header(base)
    itemsize = 2 if header.dtype == "uint16" else 4
    out.mkdir()
    for name in (TOKENIZER_FILE, EVAL_FILE):
        shutil.copyfile(base / name, out / name)
    left = size - size % itemsize
    with open(out / TOKENS_FILE, "wb") as dst:
        while left > 0:
            with open(base / TOKENS_FILE, "rb") as src:
                while left > 0 and (chunk := src.read(min(left, 8 << 20))):
                    dst.write(chunk)
                    left -= len(chunk)
        dst.flush()
        os.fsync(dst.fileno())  # written back: dropping it from the page cache then works
    tokens = (out / TOKENS_FILE).stat().st_size // itemsize
    copies, rest = divmod(tokens, header.splits["train"].tokens)
    documents = copies * header.splits["train"].documents + int((open_split(base, "train")[:rest] == header.eos_id).sum())
    train = SplitInfo(TOKENS_FILE, documents, tokens)
    splits = {"train": train, "eval": header.splits["eval"]}
    new = type(header)(header.dtype, header.vocab_size, header.eos_id, header.tokenizer_hash, splits)
    (out / HEADER_FILE).write_text(new.to_json())
    return out


def measure(folder: Path, batches: int, keep_pages: bool, warm: bool) -> dict:
    if not warm:  # cold: as a file larger than memory is
        fd = os.open(folder / "tokens.bin", os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    argv = [sys.executable, __file__, "--child", str(folder), "--batches", str(batches)]
    argv += ["--keep-pages"] if keep_pages else []
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run(argv, capture_output=True, text=True, check=True, env=env, cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default=str(ROOT / "data/stdlib-bpe"), help="the token folder to repeat")
    parser.add_argument("--sizes", nargs="+", type=float, default=[20e6, 2e9], help="tokens.bin sizes, in bytes")
    parser.add_argument("--batches", type=int, default=200, help="global batches read per size")
    parser.add_argument("--keep-pages", action="store_true", help=argparse.SUPPRESS)  # the child's: no release
    parser.add_argument("--warm", action="store_true", help="leave the new file in the page cache, as just written")
    parser.add_argument("--work", default=None, help="where the folders are written (default: the system's temp)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results"))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> dict:
    args = arguments()
    if args.child:
        child(args.child, args.batches, args.keep_pages)
        return {}
    rows = []
    with tempfile.TemporaryDirectory(prefix="jzero-data-rss-", dir=args.work) as tmp:
        base = base_folder(Path(args.tokens), Path(tmp))
        for size in args.sizes:
            t0 = time.perf_counter()
            folder = repeated_folder(base, int(size), Path(tmp) / f"tokens-{int(size)}")
            written = time.perf_counter() - t0
            try:
                for keep in (False, True):
                    got = measure(folder, args.batches, keep, args.warm)
                    rows.append({"file_bytes": int(size), "write_s": written, "keep_pages": keep, **got})
                    print(_row(rows[-1], args.batches), flush=True)
            finally:
                shutil.rmtree(folder)
    return report(args, rows)


def _row(r: dict, batches: int) -> str:
    mib = [r["before"]["VmRSS"], r["after"]["VmHWM"], r["after"]["VmHWM"] - r["before"]["VmRSS"], r["after"]["RssAnon"]]
    cells = " | ".join(f"{v / 2**20:.0f}" for v in mib) + f" | {r['after']['mapped'] / 2**20:.1f}"
    pages = "kept mapped" if r["keep_pages"] else "released (jzero)"
    return f"| {r['file_bytes'] / 1e6:,.0f} MB | {pages} | {cells} | {r['seconds'] * 1e3 / batches:.2f} |"


def report(args: argparse.Namespace, rows: list[dict]) -> dict:
    name = "data_rss_warm" if args.warm else "data_rss"
    result = {"batches": args.batches, "shape": [32, 129], "warm": args.warm, "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [
        f"{args.batches} global batches of 32 x 129 ids read at random from a {'warm' if args.warm else 'cold'} token file; MiB",
        "",
        "| tokens.bin | each window's pages | RSS before reading | peak RSS (VmHWM) | growth while reading | "
        "anonymous at the end | token file mapped at the end | ms per batch |",
        "|---|---|---|---|---|---|---|---|",
        *(_row(r, args.batches) for r in rows),
    ]
    (out / f"{name}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return result


if __name__ == "__main__":
    main()
