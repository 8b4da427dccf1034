"""JAX's persistent compilation cache on the default config: the first and the second run of
``jzero train configs/gpt-tiny.yaml --set train.steps=20``, each in a new run folder, with a cache
folder that starts empty (a fresh ``XDG_CACHE_HOME``, so the default ``runtime.compilation_cache:
auto`` lands there).

    python benchmarks/compile_cache.py [--repeats 2] [--out benchmarks/results]

Reads each run's "compiled in N s" line (the train step's compile, or its read from the cache) and
its goodput line's wall time; reports each pair's ratio, first over second, as measured in one
sitting (the machine is shared, so ratios rather than seconds are the figures to quote).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ["jzero", "train", "configs/gpt-tiny.yaml", "--set", "train.steps=20"]


def _run(cache_home: Path, run_dir: Path) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(cache_home)
    argv = [sys.executable, "-m", "jzero.cli", *COMMAND[1:], "--set", f"run.dir={run_dir}"]
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    text = done.stdout + done.stderr
    compiled = float(re.search(r"^compiled in ([\d.]+) s", text, re.M).group(1))
    wall = float(re.search(r"^goodput [\d.]+ of ([\d.]+) s", text, re.M).group(1))
    return {"compile_s": compiled, "run_s": wall, "from_cache": "compilation cache" in text}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2, help="first/second pairs, each with an empty cache")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    pairs = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            first, second = (_run(Path(tmp) / "cache", Path(tmp) / f"run{i}") for i in (1, 2))
        pair = {"first": first, "second": second, "compile_ratio": first["compile_s"] / second["compile_s"],
                "run_ratio": first["run_s"] / second["run_s"]}  # fmt: skip
        pairs.append(pair)
        print(f"compile {first['compile_s']:.1f} s -> {second['compile_s']:.1f} s (x{pair['compile_ratio']:.1f}); "
              f"whole run {first['run_s']:.1f} s -> {second['run_s']:.1f} s (x{pair['run_ratio']:.2f})")  # fmt: skip
    result = {"command": " ".join(COMMAND), "pairs": pairs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compile_cache.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
