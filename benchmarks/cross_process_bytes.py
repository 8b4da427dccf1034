"""What really crosses between processes, against the ledger's cross-host bytes.

    python benchmarks/cross_process_bytes.py [--steps 4 24] [--set KEY=VALUE ...] [--out DIR]

Two ``jzero launch -n 2 --devices-per-process 4`` runs of the same job train for the two step
counts. Everything the two processes exchange (gloo's collectives, JAX's coordinator) goes over
loopback, so the bytes received on ``lo`` (``/proc/net/dev``) are read around each run. The
difference between the runs, over the difference in steps, is what one step moves between the
processes: start-up, compile and the final checkpoint cancel out.

The ledger (``ledger.json`` of the run) predicts, per device per step, the bytes of collectives whose
groups span the two processes (:mod:`jzero.ledger.levels`). In the paper's accounting each of the 8
devices sends that much. The wire carries what gloo's algorithm sends, so the table gives the
measured bytes over the ledger's figure for one device and for all 8.

Nothing else on the machine should use loopback during the runs. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from jzero.ledger.startup import StartupLedger
from jzero.records import from_json

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.d_model=64", "model.n_layers=2", "model.n_heads=2", "model.seq_len=64", "train.global_batch_size=16"]
DEVICES = 8


def loopback_bytes() -> int:
    """Bytes received on ``lo`` so far (every byte sent over loopback is received once)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, fields = line.partition(":")
        if name.strip() == "lo":
            return int(fields.split()[0])
    raise SystemExit("no lo interface in /proc/net/dev")


def run(steps: int, sets: list[str], folder: Path, processes: int = 2) -> tuple[int, dict]:
    """One run of ``steps`` steps on 8 devices in ``processes`` processes (1 or 2): the loopback bytes
    around it and its ledger's communication."""
    run_dir = folder / f"run-{steps}"
    words = ["train", str(ROOT / "configs" / "gpt-tiny.yaml"), "--quiet"]
    for kv in [*TINY, f"run.dir={run_dir}", f"train.steps={steps}", "run.tensorboard=false", "checkpoint.every=0",
               "train.eval_every=0", *sets]:  # fmt: skip
        words += ["--set", kv]
    launch = ["launch", "-n", "2", "--devices-per-process", "4", "--"] if processes == 2 else []
    cmd = [sys.executable, "-m", "jzero.cli", *launch, *words]
    before = loopback_bytes()
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "XLA_FLAGS": ""}, timeout=900)
    after = loopback_bytes()
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return after - before, from_json(StartupLedger, json.loads((run_dir / "ledger.json").read_text())).communication


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs=2, default=[4, 24])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--processes", type=int, choices=(1, 2), default=2, help="1: the same job in one process")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    low, high = args.steps
    with tempfile.TemporaryDirectory() as tmp:
        (low_bytes, comm), (high_bytes, _) = (run(n, args.set, Path(tmp), args.processes) for n in (low, high))
    per_step = (high_bytes - low_bytes) / (high - low)
    cross = comm.cross_host_bytes
    result = {
        "processes": args.processes,
        "steps": [low, high],
        "sets": args.set,
        "loopback_bytes": [low_bytes, high_bytes],
        "measured_per_step": per_step,
        "ledger_cross_host_per_device": cross,
        "ledger_within_host_per_device": comm.within_host_bytes,
        "ledger_by_kind": comm.bytes_per_step,
        "measured_over_one_device": per_step / cross if cross else None,
        "measured_over_all_devices": per_step / (DEVICES * cross) if cross else None,
    }
    rows = [
        "| measured per step | ledger cross-host per device | measured ÷ 1 device | measured ÷ 8 devices |",
        "|---|---|---|---|",
        f"| {per_step:,.0f} B | {cross:,} B | {_ratio(result['measured_over_one_device'])} "
        f"| {_ratio(result['measured_over_all_devices'])} |",
    ]
    print("\n".join(rows))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "_".join(["cross_process_bytes", *(s.replace("=", "-") for s in args.set), f"p{args.processes}"])
    name = "".join(c if c.isalnum() or c in "-_." else "" for c in name)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))
    (out / f"{name}.md").write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
