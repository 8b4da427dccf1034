"""Training quality under float8 matmuls (issue 54): gpt-tiny's loss with bf16 matmuls against float8's.

    python benchmarks/fp8_training.py [--steps 300] [--seeds 0 1 2] [--recipes none tensorwise rowwise]
        [--reuse PREVIOUS.json] [--out DIR]

Every run is ``jzero train configs/gpt-tiny.yaml`` on the 8 simulated CPU devices with bf16 compute
(``precision.compute_dtype=bfloat16``; the master parameters stay float32), one after another, each
recipe of ``precision.fp8`` (``none`` is the bf16 baseline) with each seed: the same seed gives the
same initialisation and data order, so the float8 recipe is the only difference between a seed's
runs. The training loss is logged at every step (the loss curve); a run's final figures are the mean
training loss of its last 20 steps and the validation loss after its last step, over the same 16
held-out batches for every run (``train.eval_batches``). The gap of a float8 run is its figure less
the bf16 run's of the same seed; the bf16 runs' spread over the seeds is the noise that
initialisation and data order alone give.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BF16 = ["precision.compute_dtype=bfloat16"]
LAST = 20  # the final training loss: the mean over the last LAST steps
CURVE_EVERY = 30  # the curve's table: the mean loss over each window of CURVE_EVERY steps


def train(steps: int, seed: int, recipe: str, folder: Path) -> dict:
    """One run: its loss at every step, the mean of the last ``LAST``, its final validation loss, its wall time."""
    run_dir = folder / f"{recipe}-seed{seed}"
    words = ["train", str(ROOT / "configs" / "gpt-tiny.yaml"), "--quiet"]
    for kv in [*BF16, f"precision.fp8={recipe}", f"seed={seed}", f"run.dir={run_dir}", f"train.steps={steps}",
               f"train.eval_every={steps}", "train.eval_batches=16", "run.tensorboard=false", "checkpoint.every=0",
               "run.log_every=1"]:  # fmt: skip
        words += ["--set", kv]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "jzero.cli", *words], capture_output=True, text=True, timeout=3600)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    curve = [[r["step"], r["loss"]] for r in rows if "loss" in r]
    evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
    last = [loss for _, loss in curve[-LAST:]]
    return {
        "seed": seed,
        "last20": sum(last) / len(last),
        "eval": evals[-1] if evals else None,
        "first_loss": curve[0][1],
        "seconds": time.perf_counter() - start,
        "curve": curve,
    }


def _reused(path: Path | None, steps: int) -> dict:
    """The runs of a previous record that trained the same number of steps, by recipe and seed."""
    if path is None:
        return {}
    record = json.loads(path.read_text())
    if record["steps"] != steps:
        raise SystemExit(f"{path}: {record['steps']} steps, not {steps}")
    return {recipe: {r["seed"]: r for r in runs} for recipe, runs in record["results"].items()}


def _spread(values: list[float]) -> dict:
    return {
        "min": min(values),
        "max": max(values),
        "range": max(values) - min(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
    }


def summarise(results: dict, seeds: list[int]) -> dict:
    """Per recipe: the gaps to bf16 (same seed) of both final figures, their mean and largest size;
    and the bf16 runs' own spread over the seeds."""
    base = {r["seed"]: r for r in results["none"]}
    out = {"bf16_spread": {k: _spread([base[s][k] for s in seeds]) for k in ("last20", "eval")}}
    for recipe, runs in results.items():
        if recipe == "none":
            continue
        gaps = {k: [r[k] - base[r["seed"]][k] for r in runs] for k in ("last20", "eval")}
        out[recipe] = {
            k: {"gaps": g, "mean_gap": sum(g) / len(g), "max_abs_gap": max(abs(x) for x in g)} for k, g in gaps.items()
        }
    return out


def table(results: dict, summary: dict, steps: int, seeds: list[int]) -> str:
    base = {r["seed"]: r for r in results["none"]}
    lines = [
        f"gpt-tiny, {steps} steps, bf16 compute (float32 master), stage 3, 8 CPU devices, seeds"
        f" {', '.join(map(str, seeds))} (`python benchmarks/fp8_training.py`)",
        "",
        f"| recipe | seed | validation loss at the end | gap to bf16 | train loss, mean of last {LAST} steps | gap to bf16 |"
        " seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for recipe, runs in results.items():
        for r in runs:
            b = base[r["seed"]]
            gap_eval = "" if recipe == "none" else f"{r['eval'] - b['eval']:+.4f}"
            gap_last = "" if recipe == "none" else f"{r['last20'] - b['last20']:+.4f}"
            lines.append(f"| {recipe} | {r['seed']} | {r['eval']:.4f} | {gap_eval} | {r['last20']:.4f} | {gap_last} |"
                         f" {r['seconds']:.0f} |")  # fmt: skip
    lines += [
        "",
        f"| recipe | mean validation loss | mean gap | largest gap | mean train loss (last {LAST}) | mean gap | largest gap |",
        "|---|---|---|---|---|---|---|",
    ]
    for recipe, runs in results.items():
        ev = sum(r["eval"] for r in runs) / len(runs)
        tr = sum(r["last20"] for r in runs) / len(runs)
        if recipe == "none":
            lines.append(f"| none (bf16) | {ev:.4f} | | | {tr:.4f} | | |")
        else:
            s = summary[recipe]
            lines.append(f"| {recipe} | {ev:.4f} | {s['eval']['mean_gap']:+.4f} | {s['eval']['max_abs_gap']:.4f} | {tr:.4f} |"
                         f" {s['last20']['mean_gap']:+.4f} | {s['last20']['max_abs_gap']:.4f} |")  # fmt: skip
    spread = summary["bf16_spread"]
    lines += [
        "",
        f"bf16 spread over the seeds: validation {spread['eval']['min']:.4f} to {spread['eval']['max']:.4f}"
        f" (range {spread['eval']['range']:.4f}, std {spread['eval']['std']:.4f}); train last {LAST}"
        f" {spread['last20']['min']:.4f} to {spread['last20']['max']:.4f} (range {spread['last20']['range']:.4f},"
        f" std {spread['last20']['std']:.4f})",
        "",
        "mean gap over the seeds in bf16 seed standard deviations (validation, train): "
        + "; ".join(
            f"{r} {summary[r]['eval']['mean_gap'] / spread['eval']['std']:+.2f}, "
            f"{summary[r]['last20']['mean_gap'] / spread['last20']['std']:+.2f}"
            for r in results
            if r != "none"
        ),
        "",
        f"Loss curve: the training loss averaged over each {CURVE_EVERY}-step window ending at the step, and over the seeds",
        "",
    ]
    ends = list(range(CURVE_EVERY, steps + 1, CURVE_EVERY))
    lines += ["| recipe | " + " | ".join(str(e) for e in ends) + " |", "|---" * (len(ends) + 1) + "|"]
    for recipe, runs in results.items():
        cells = []
        for end in ends:
            window = [loss for r in runs for step, loss in r["curve"] if end - CURVE_EVERY < step <= end]
            cells.append(f"{sum(window) / len(window):.3f}")
        lines.append(f"| {recipe} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--recipes", nargs="+", default=["none", "tensorwise", "rowwise"])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--reuse", type=Path, help="a previous fp8_training.json: its runs (same steps) are kept")
    args = parser.parse_args()
    if "none" not in args.recipes:
        raise SystemExit("--recipes: the bf16 baseline 'none' is what the gaps are measured against")
    reused = _reused(args.reuse, args.steps)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in args.recipes:
            results[recipe] = []
            for seed in args.seeds:
                run = reused.get(recipe, {}).get(seed) or train(args.steps, seed, recipe, Path(tmp))
                results[recipe].append(run)
                print(recipe, seed, {k: v for k, v in run.items() if k != "curve"}, flush=True)
    summary = summarise(results, args.seeds)
    text = table(results, summary, args.steps, args.seeds)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fp8_training.md").write_text(text + "\n")
    record = {"steps": args.steps, "seeds": args.seeds, "last": LAST, "summary": summary, "results": results}
    (args.out / "fp8_training.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
