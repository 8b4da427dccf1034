"""Training quality under ZeRO++'s quantization: the final loss of gpt-tiny, bf16, stage 3.

    python benchmarks/zeropp_quality.py [--steps 300] [--seeds 0 1 2] [--case "NAME=KEY=VALUE;..."] [--all-seeds]
        [--reuse PREVIOUS.json] [--out DIR]

The plain run trains once per seed, for the spread that initialisation and data order alone give.
Each ZeRO++ case trains with the first seed (with ``--all-seeds``, with each). Every run is
``jzero train configs/gpt-tiny.yaml`` on the 8 simulated CPU devices. The table's loss is the
validation loss after the last step, over the same 16 held-out batches for every run (the standard
library's package sources, ``train.eval_batches``), then the mean training loss of the last 10
logged steps.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BF16 = ["precision.param_dtype=bfloat16", "precision.compute_dtype=bfloat16", "zero.stage=3"]
CASES = {
    "qwZ int8": ["zero.quantized_weights=int8"],
    "qwZ + qgZ int8": ["zero.quantized_weights=int8", "zero.quantized_gradients=int8"],
    "qgZ int4": ["zero.quantized_gradients=int4"],
}


def train(steps: int, seed: int, sets: list[str], folder: Path) -> dict:
    """One run; its final validation loss, the mean of its last 10 logged losses, and its wall time."""
    run_dir = folder / f"run-{len(list(folder.iterdir()))}"
    words = ["train", str(ROOT / "configs" / "gpt-tiny.yaml"), "--quiet"]
    for kv in [*BF16, f"seed={seed}", f"run.dir={run_dir}", f"train.steps={steps}", f"train.eval_every={steps}",
               "train.eval_batches=16", "run.tensorboard=false", "checkpoint.every=0", "run.log_every=10", *sets]:  # fmt: skip
        words += ["--set", kv]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "jzero.cli", *words], capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    final = [r["eval_loss"] for r in rows if "eval_loss" in r][-1]
    return {"final": final, "last10": sum(losses[-10:]) / len(losses[-10:]), "seconds": time.perf_counter() - start}


def _reused(path: Path | None, steps: int, seeds: list[int]) -> dict:
    """The runs of a previous table, when it trained the same steps on the same seeds."""
    if path is None:
        return {}
    record = json.loads(path.read_text())
    if record["steps"] != steps or record["seeds"] != seeds:
        raise SystemExit(f"{path}: {record['steps']} steps on seeds {record['seeds']}, not {steps} on {seeds}")
    return record["results"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--case", action="append", default=[], help="NAME=KEY=VALUE;KEY=VALUE (repeatable)")
    parser.add_argument("--all-seeds", action="store_true", help="train each case with every seed, not only the first")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--reuse", type=Path, help="a previous zeropp_quality.json: its runs (same steps, seeds) are kept")
    args = parser.parse_args()
    cases = dict(CASES)
    for text in args.case:
        name, _, sets = text.partition("=")
        cases[name] = sets.split(";")
    results = _reused(args.reuse, args.steps, args.seeds)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        case_seeds = args.seeds if args.all_seeds else args.seeds[:1]
        for name, sets in {"plain": [], **cases}.items():
            seeds = args.seeds if name == "plain" else case_seeds
            if len(results.get(name, [])) != len(seeds):
                results[name] = [train(args.steps, seed, sets, folder) for seed in seeds]
                print(name, results[name], flush=True)
    plain = [r["final"] for r in results["plain"]]
    lines = [
        f"gpt-tiny, {args.steps} steps, bf16, stage 3, 8 CPU devices (`python benchmarks/zeropp_quality.py`)",
        "",
        "| run | seeds | validation loss at the end | mean | train loss, mean of last 10 logged | against the plain spread |",
        "|---|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        finals = [r["final"] for r in runs]
        mean = sum(finals) / len(finals)
        where = "within" if min(plain) <= mean <= max(plain) else ("below" if mean < min(plain) else "above")
        seeds = ", ".join(map(str, args.seeds[: len(runs)]))
        final = " / ".join(f"{f:.4f}" for f in finals)
        last10 = " / ".join(f"{r['last10']:.4f}" for r in runs)
        lines.append(f"| {name} | {seeds} | {final} | {mean:.4f} | {last10} | {'' if name == 'plain' else where} |")
    lines.append("")
    lines.append(f"plain spread over the seeds: {min(plain):.4f} to {max(plain):.4f} ({max(plain) - min(plain):.4f})")
    text = "\n".join(lines)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "zeropp_quality.md").write_text(text + "\n")
    record = {"steps": args.steps, "seeds": args.seeds, "results": results}
    (args.out / "zeropp_quality.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
