"""Cross-host bytes per device per step under ZeRO++'s knobs, from GPU programs compiled on this host.

    python benchmarks/zeropp_bytes.py [--config configs/gpt-7b.yaml] [--target h100x64] [--hosts N --gpus-per-host G]

Each case is ``jzero plan CONFIG --target T --json`` at stage 3 in bf16, with ``mesh.dcn`` across
the hosts: the baseline partitions over ``data`` (all devices), hpZ's cases over ``replica`` (the
hosts) x ``data`` (the GPUs of a host). qgZ's cases reduce gradients by quantized all-to-alls: one
over ``data`` when it is the only axis, two hops (within the host, then across) under hpZ. The
ledger splits every collective's bytes by level
(:mod:`jzero.ledger.levels`, ZeRO++'s accounting); the table gives them over the baseline's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from jzero.ledger.report import CheckedPlanReport
from jzero.records import from_json

ROOT = Path(__file__).resolve().parents[1]
BF16 = ["zero.stage=3", "precision.param_dtype=bfloat16", "precision.compute_dtype=bfloat16"]
QWZ = ["zero.quantized_weights=int8"]
HPZ = ["zero.hierarchical=hpz"]


def qgz(width: str) -> list[str]:
    return [f"zero.quantized_gradients={width}"]


def cases(hosts: int, per_host: int) -> dict[str, list[str]]:
    flat = [f"mesh.axes={{data: {hosts * per_host}}}", f"mesh.dcn.data={hosts}"]
    nested = [f"mesh.axes={{replica: {hosts}, data: {per_host}}}", f"mesh.dcn.replica={hosts}"]
    return {
        "ZeRO-3 (baseline)": flat,
        "+ qwZ": [*flat, *QWZ],
        "+ hpZ": [*nested, *HPZ],
        "+ qwZ + hpZ": [*nested, *QWZ, *HPZ],
        "+ qgZ int8": [*flat, *qgz("int8")],
        "+ qwZ + qgZ int8": [*flat, *QWZ, *qgz("int8")],
        "+ qwZ + hpZ + qgZ int8": [*nested, *QWZ, *HPZ, *qgz("int8")],
        "+ qwZ + hpZ + qgZ int4": [*nested, *QWZ, *HPZ, *qgz("int4")],
    }


def plan(config: str, target: list[str], sets: list[str]) -> tuple[CheckedPlanReport, float]:
    words = [sys.executable, "-m", "jzero.cli", "plan", config, *target, "--json"]
    for kv in [*BF16, *sets]:
        words += ["--set", kv]
    start = time.perf_counter()
    done = subprocess.run(words, capture_output=True, text=True, timeout=3600, cwd=ROOT)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return from_json(CheckedPlanReport, json.loads(done.stdout)), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/gpt-7b.yaml")
    parser.add_argument("--target", default="h100x64")
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--gpus-per-host", type=int, default=8)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    target = ["--target", args.target, "--hosts", str(args.hosts), "--gpus-per-host", str(args.gpus_per_host)]
    rows, base = {}, None
    for name, sets in cases(args.hosts, args.gpus_per_host).items():
        report, seconds = plan(args.config, target, sets)
        comm = report.communication
        base = base or comm
        rows[name] = {
            "cross_host_bytes": comm.cross_host_bytes,
            "within_host_bytes": comm.within_host_bytes,
            "total": comm.total,
            "cross_ratio": comm.cross_host_bytes / base.cross_host_bytes,
            "total_ratio": comm.total / base.total,
            "of_3psi": comm.cross_host_ratio,
            "peak": report.device_peak,
            "seconds": seconds,
        }
        print(name, json.dumps(rows[name]), flush=True)
    stem = f"zeropp_bytes_{Path(args.config).stem}_{args.hosts}x{args.gpus_per_host}"
    lines = [
        f"{args.config}, stage 3, bf16, {args.target} as {args.hosts} hosts x {args.gpus_per_host} GPUs "
        f"(`python benchmarks/zeropp_bytes.py --config {args.config} --target {args.target} --hosts {args.hosts} "
        f"--gpus-per-host {args.gpus_per_host}`)",
        "",
        "| config | cross-host GB per device per step | ÷ baseline | of 3Ψ | within-host GB | total ÷ baseline | peak GB |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['cross_host_bytes'] / 1e9:.3f} | {r['cross_ratio']:.3f} | {r['of_3psi']:.3f} | "
            f"{r['within_host_bytes'] / 1e9:.3f} | {r['total_ratio']:.3f} | {r['peak'] / 1e9:.2f} |"
        )
    text = "\n".join(lines)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.md").write_text(text + "\n")
    (args.out / f"{stem}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
