"""Stages 0-3 on one config in one run: step time, model-state bytes per device, compiled temporaries.

    python benchmarks/stages.py [CONFIG] [--set KEY=VALUE ...] [--rounds 5] [--steps 5] [--out DIR]

Stages are timed in interleaved rounds (stage 0, 1, 2, 3, then again), so machine noise hits
them alike; each stage's time is its median step over the rounds. Ratios are against stage 0 in
the same run. On simulated CPU devices, step times measure CPU work, not GPU behaviour.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(ROOT / "configs/gpt-tiny.yaml"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per stage per round")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results"))
    args = parser.parse_args(argv)

    from jzero.config import load_config
    from jzero.mesh import simulate_cpu_devices

    base = load_config(args.config, args.set)
    simulate_cpu_devices(base.runtime.cpu_devices)

    import jax

    from jzero import ledger
    from jzero.data import text_batches
    from jzero.trainer import setup

    m, t = base.model, base.train
    data = text_batches(base.data.path, base.data.max_bytes, m.seq_len, t.global_batch_size, base.seed)
    runs = {}
    for stage in range(4):
        cfg = load_config(args.config, [*args.set, f"zero.stage={stage}"])
        s = setup(cfg)
        state = s.init_state()
        batch = data.device_batch(0, s.plan.batch)
        compiled = s.make_step().lower(state, batch).compile()
        for _ in range(2):  # warm up
            state, metrics = compiled(state, batch)
        jax.block_until_ready(state)
        runs[stage] = {
            "setup": s,
            "state": state,
            "step": compiled,
            "batch": batch,
            "times": [],
            "temp": ledger.compiled_memory(compiled)["temp"],
        }

    for _ in range(args.rounds):
        for run in runs.values():
            state = run["state"]
            start = time.perf_counter()
            for _ in range(args.steps):
                state, metrics = run["step"](state, run["batch"])
            jax.block_until_ready(state)
            run["times"].append((time.perf_counter() - start) / args.steps)
            run["state"] = state

    rows = []
    for stage, run in runs.items():
        s = run["setup"]
        live = {
            "params": ledger.live_bytes_per_device(run["state"].params),
            "optimizer": ledger.live_bytes_per_device(run["state"].opt_state),
        }
        planned = s.plan.per_device_bytes()
        rows.append(
            {
                "stage": stage,
                "step_s": statistics.median(run["times"]),
                "params_bytes": live["params"],
                "grads_bytes": planned["grads"],
                "optimizer_bytes": live["optimizer"],
                "model_state_bytes": live["params"] + planned["grads"] + live["optimizer"],
                "formula_bytes": s.plan.ideal_per_device_bytes()["total"],
                "temp_bytes": run["temp"],
            }
        )
    base_row = rows[0]
    for row in rows:
        row["step_ratio"] = row["step_s"] / base_row["step_s"]
        row["model_state_ratio"] = row["model_state_bytes"] / base_row["model_state_bytes"]
        row["temp_ratio"] = row["temp_bytes"] / base_row["temp_bytes"]

    s0 = runs[0]["setup"]
    result = {
        "command": " ".join(["python benchmarks/stages.py", *sys.argv[1:]]) if argv is None else None,
        "config": args.config,
        "mesh": {k: int(v) for k, v in s0.mesh.shape.items()},
        "num_params": s0.plan.num_params,
        "backend": jax.default_backend(),
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "stages": rows,
    }
    table = markdown(result)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "stages.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "stages.md").write_text(table + "\n")
    return result


def markdown(result: dict) -> str:
    mesh = " x ".join(f"{k}={v}" for k, v in result["mesh"].items())
    lines = [
        f"{result['num_params']:,} parameters, mesh {mesh} ({result['backend']}), fp32 AdamW; "
        f"median of {result['rounds']} interleaved rounds of {result['steps_per_round']} steps",
        "",
        "| stage | step time vs stage 0 | model states / device | vs stage 0 | paper formula "
        "| temporaries / device | vs stage 0 |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["stages"]:
        lines.append(
            f"| {r['stage']} | {r['step_ratio']:.2f} | {r['model_state_bytes'] / 2**20:.2f} MiB | {r['model_state_ratio']:.3f} "
            f"| {r['formula_bytes'] / 2**20:.2f} MiB | {r['temp_bytes'] / 2**20:.2f} MiB | {r['temp_ratio']:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
