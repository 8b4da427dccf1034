"""Stages 0-3 on one config in one run: step time, model-state bytes per device, compiled temporaries,
and the largest model each stage fits in a per-device budget.

    python benchmarks/stages.py [CONFIG] [--set KEY=VALUE ...] [--rounds 5] [--steps 5]
                                [--budget 48MiB] [--out DIR]

Stages are timed in interleaved rounds (stage 0, 1, 2, 3, then again), so machine noise hits
them alike; each stage's time is its median step over the rounds. Ratios are against stage 0 in
the same run. On simulated CPU devices, step times measure CPU work, not GPU behaviour.

The largest model: for each stage, the deepest GPT of the config's width (``model.n_layers``
doubled, then bisected) whose compiled step fits ``--budget`` per device, counting everything XLA
places on a device (arguments, temporaries and unaliased outputs: the ledger's peak). Only
compiled, never run. It writes ``stages.json``, ``stages.md`` and ``stages.png`` (per-device model
states per stage, stacked as parameters, gradients and optimizer state, as in the paper's Figure 1,
beside the largest model per stage).
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
    parser.add_argument("--budget", default="48MiB", help="per-device memory for the largest-model search")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results"))
    args = parser.parse_args(argv)

    from jzero.config import load_config
    from jzero.mesh import simulate_cpu_devices
    from jzero.stages import STAGES
    from jzero.targets import import_jax, start_backends

    base = load_config(args.config, args.set)
    import_jax()  # on a host without a GPU, the CPU alone even with the gpu-target extra installed
    simulate_cpu_devices(base.runtime.cpu_devices)
    start_backends()

    import jax

    from jzero import ledger
    from jzero.build import setup
    from jzero.data import text_batches

    m, t = base.model, base.train
    data = text_batches(base.data.path, base.data.max_bytes, m.seq_len, t.global_batch_size, base.seed)
    runs = {}
    for stage in STAGES:
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

    from jzero.estimate import parse_memory

    budget = parse_memory(args.budget, "--budget")
    largest = {stage: largest_model(args.config, [*args.set, f"zero.stage={stage}"], budget) for stage in STAGES}
    for row in rows:
        row["largest_model"] = largest[row["stage"]]
        row["largest_params_ratio"] = largest[row["stage"]]["num_params"] / largest[0]["num_params"]

    s0 = runs[0]["setup"]
    result = {
        "command": " ".join(["python benchmarks/stages.py", *sys.argv[1:]]) if argv is None else None,
        "config": args.config,
        "mesh": {k: int(v) for k, v in s0.mesh.shape.items()},
        "num_params": s0.plan.num_params,
        "backend": jax.default_backend(),
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "budget_bytes": budget,
        "stages": rows,
    }
    table = markdown(result)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "stages.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "stages.md").write_text(table + "\n")
    chart(result, out / "stages.png")
    return result


def peak_bytes(config_path: str, overrides: list[str]) -> tuple[int, int]:
    """(parameters, compiled per-device peak) of a config, compiled from shapes only."""
    from jzero import ledger
    from jzero.build import setup
    from jzero.config import load_config

    s = setup(load_config(config_path, overrides))
    _, compiled = s.compile_step()
    return s.plan.num_params, ledger.compiled_memory(compiled)["peak"]


def largest_model(config_path: str, overrides: list[str], budget: float) -> dict:
    """The deepest model (n_layers) whose compiled step's peak fits ``budget``: double, then bisect."""
    tried = {}

    def fits(layers: int) -> bool:
        params, peak = peak_bytes(config_path, [*overrides, f"model.n_layers={layers}"])
        tried[layers] = (params, peak)
        return peak <= budget

    low, high = 0, 1
    while fits(high):
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    if low == 0:
        return {"n_layers": 0, "num_params": 0, "peak_bytes": None}
    params, peak = tried[low]
    return {"n_layers": low, "num_params": params, "peak_bytes": peak}


def chart(result: dict, path: Path) -> None:
    """Figure 1's bars (per-device model states by part, per stage) beside the largest model per stage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["stages"]
    stages = [str(r["stage"]) for r in rows]
    mib = 2**20
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    bottom = [0.0] * len(rows)
    for key, label, color in (("params_bytes", "parameters", "#4c72b0"), ("grads_bytes", "gradients", "#dd8452"),
                              ("optimizer_bytes", "optimizer state", "#55a868")):  # fmt: skip
        values = [r[key] / mib for r in rows]
        left.bar(stages, values, bottom=bottom, label=label, color=color)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    left.set(xlabel="ZeRO stage", ylabel="MiB per device", title=f"model states per device ({result['num_params']:,} params)")
    left.legend()
    sizes = [r["largest_model"]["num_params"] / 1e6 for r in rows]
    right.bar(stages, sizes, color="#8172b3")
    right.set_ylim(top=max(sizes) * 1.12)  # room for the labels
    for i, r in enumerate(rows):
        right.annotate(f"{r['largest_params_ratio']:.1f}x", (i, r["largest_model"]["num_params"] / 1e6), ha="center", va="bottom")
    right.set(xlabel="ZeRO stage", ylabel="million parameters",
              title=f"largest model in {result['budget_bytes'] / mib:.0f} MiB per device")  # fmt: skip
    from jzero.report import mesh_text

    mesh = mesh_text(result["mesh"])
    fig.suptitle(f"jzero on {mesh} ({result['backend']}), fp32 AdamW")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(result: dict) -> str:
    from jzero.report import mesh_text

    mesh = mesh_text(result["mesh"])
    lines = [
        f"{result['num_params']:,} parameters, mesh {mesh} ({result['backend']}), fp32 AdamW; "
        f"median of {result['rounds']} interleaved rounds of {result['steps_per_round']} steps; "
        f"largest model: deepest that compiles within {result['budget_bytes'] / 2**20:.0f} MiB per device (peak)",
        "",
        "| stage | step time vs stage 0 | model states / device | vs stage 0 | paper formula "
        "| temporaries / device | vs stage 0 | largest model in budget | vs stage 0 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["stages"]:
        lines.append(
            f"| {r['stage']} | {r['step_ratio']:.2f} | {r['model_state_bytes'] / 2**20:.2f} MiB | {r['model_state_ratio']:.3f} "
            f"| {r['formula_bytes'] / 2**20:.2f} MiB | {r['temp_bytes'] / 2**20:.2f} MiB | {r['temp_ratio']:.2f} "
            f"| {r['largest_model']['num_params'] / 1e6:.1f}M ({r['largest_model']['n_layers']} layers) "
            f"| {r['largest_params_ratio']:.1f}x |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
