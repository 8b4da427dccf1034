"""Stages 0-3 and their offload variants on one config in one run: step time, model-state bytes per
device, compiled temporaries, and the largest model each fits in a per-device budget.

    python benchmarks/stages.py [CONFIG] [--set KEY=VALUE ...] [--rounds 5] [--steps 5]
                                [--budget 48MiB] [--out DIR]

The variants are the four stages and three offloads (ZeRO-Offload and ZeRO-Infinity style):
``1+opt`` and ``3+opt`` (``zero.offload_optimizer``: optimizer state and master in pinned host memory,
streamed in the step) and ``3+opt+params`` (``zero.offload_params`` too: the parameters rest in host
memory and each block fetches its own). All are timed in interleaved rounds (0, 1, 1+opt, 2, 3,
3+opt, 3+opt+params, then again), so machine noise hits them alike; each variant's time is its
median step over the rounds. Ratios are against stage 0 in the same run, and an offload's overhead
is its step time over its own stage's without the offload, in the same run. On simulated CPU
devices, step times measure CPU work, not GPU behaviour (a host "transfer" is a copy in RAM).

The largest model: for each variant, the deepest GPT of the config's width (``model.n_layers``
doubled, then bisected) whose compiled step fits ``--budget`` per device, counting everything XLA
places in device memory (arguments, temporaries and unaliased outputs, less what rests in pinned host
memory: the ledger's ``device_peak``; without offload it equals ``peak``). Only compiled, never run.
It writes ``stages.json``, ``stages.md`` and ``stages.png`` (per-device model states per variant,
stacked as parameters, gradients and optimizer state as in the paper's Figure 1, with what rests in
host memory hatched above the device bars, beside the largest model per variant).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

OPT = "zero.offload_optimizer=true"
PARAMS = "zero.offload_params=true"
# name: (stage, offload overrides), in the order the rounds run them and the table lists them.
VARIANTS: dict[str, tuple[int, tuple[str, ...]]] = {
    "0": (0, ()),
    "1": (1, ()),
    "1+opt": (1, (OPT,)),
    "2": (2, ()),
    "3": (3, ()),
    "3+opt": (3, (OPT,)),
    "3+opt+params": (3, (OPT, PARAMS)),
}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(ROOT / "configs/gpt-tiny.yaml"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant per round")
    parser.add_argument("--budget", default="48MiB", help="per-device memory for the largest-model search")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results"))
    args = parser.parse_args(argv)

    from jzero.config.loading import load_config
    from jzero.distributed.process import import_jax, start_backends
    from jzero.sharding.mesh import simulate_cpu_devices

    base = load_config(args.config, args.set)
    import_jax()  # on a host without a GPU, the CPU alone even with the gpu-target extra installed
    simulate_cpu_devices(base.runtime.cpu_devices)
    start_backends()

    import jax

    from jzero.ledger import hlo as ledger
    from jzero.training.data import text_batches
    from jzero.training.job import build_job

    def overrides(name: str) -> list[str]:
        stage, offload = VARIANTS[name]
        return [*args.set, f"zero.stage={stage}", *offload]

    m, t = base.model, base.train
    data = text_batches(base.data.path, base.data.max_bytes, m.seq_len, t.global_batch_size, base.seed)
    runs = {}
    for name in VARIANTS:
        s = build_job(load_config(args.config, overrides(name)))
        state = s.init_state()
        batch = data.device_batch(0, s.plan.batch)
        compiled = s.make_step().lower(state, batch).compile()
        for _ in range(2):  # warm up
            state, metrics = compiled(state, batch)
        jax.block_until_ready(state)
        runs[name] = {
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
    for name, run in runs.items():
        s, state = run["setup"], run["state"]
        params, optimizer = split_by_memory(state.params), split_by_memory(state.opt_state)
        grads = s.plan.per_device_bytes().grads  # gradients always live in device memory
        rows.append(
            {
                "variant": name,
                "stage": VARIANTS[name][0],
                "offload_optimizer": OPT in VARIANTS[name][1],
                "offload_params": PARAMS in VARIANTS[name][1],
                "step_s": statistics.median(run["times"]),
                # device memory
                "params_bytes": params["device"],
                "grads_bytes": grads,
                "optimizer_bytes": optimizer["device"],
                "model_state_bytes": params["device"] + grads + optimizer["device"],
                # pinned host memory
                "params_host_bytes": params["host"],
                "optimizer_host_bytes": optimizer["host"],
                "host_state_bytes": params["host"] + optimizer["host"],
                "formula_bytes": s.plan.ideal_per_device_bytes().total,  # device + host
                "temp_bytes": run["temp"],
            }
        )
    by_name = {row["variant"]: row for row in rows}
    base_row = by_name["0"]
    for row in rows:
        row["step_ratio"] = row["step_s"] / base_row["step_s"]
        # an offload's cost: its step against its own stage's without offload, measured in the same rounds
        row["offload_overhead"] = row["step_s"] / by_name[str(row["stage"])]["step_s"] if VARIANTS[row["variant"]][1] else None
        row["model_state_ratio"] = row["model_state_bytes"] / base_row["model_state_bytes"]
        row["temp_ratio"] = row["temp_bytes"] / base_row["temp_bytes"]

    from jzero.ledger.estimate import parse_memory

    budget = parse_memory(args.budget, "--budget")
    for row in rows:
        row["largest_model"] = largest_model(args.config, overrides(row["variant"]), budget)
    for row in rows:
        size = row["largest_model"]["num_params"]
        row["largest_params_ratio"] = size / by_name["0"]["largest_model"]["num_params"]
        row["largest_vs_stage3"] = size / by_name["3"]["largest_model"]["num_params"]

    s0 = runs["0"]["setup"]
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


def split_by_memory(tree) -> dict[str, int]:
    """Bytes per device a live pytree holds in device memory and in pinned host memory."""
    from jzero.ledger import hlo as ledger
    from jzero.memory.offload import DEVICE, HOST

    return {"device": ledger.live_bytes_per_device(tree, DEVICE), "host": ledger.live_bytes_per_device(tree, HOST)}


def compiled_bytes(config_path: str, overrides: list[str]) -> tuple[int, dict[str, int]]:
    """(parameters, the ledger's compiled memory per device) of a config, compiled from shapes only."""
    from jzero.config.loading import load_config
    from jzero.ledger import hlo as ledger
    from jzero.training.job import build_job

    s = build_job(load_config(config_path, overrides))
    _, compiled = s.compile_step()
    return s.plan.num_params, ledger.compiled_memory(compiled)


def peak_bytes(config_path: str, overrides: list[str]) -> tuple[int, int]:
    """(parameters, compiled per-device peak in device memory: ``device_peak``) of a config."""
    params, memory = compiled_bytes(config_path, overrides)
    return params, memory["device_peak"]


def largest_model(config_path: str, overrides: list[str], budget: float) -> dict:
    """The deepest model (n_layers) whose compiled step's device peak fits ``budget``: double, then bisect.

    Keeps the ledger's breakdown at that depth, and the device peak one layer deeper (the first that
    does not fit), so the boundary can be read off the JSON.
    """
    tried = {}

    def fits(layers: int) -> bool:
        tried[layers] = compiled_bytes(config_path, [*overrides, f"model.n_layers={layers}"])
        return tried[layers][1]["device_peak"] <= budget

    low, high = 0, 1
    while fits(high):
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    over = tried[high][1]["device_peak"]  # bisection always ends having tried high = low + 1
    if low == 0:
        return {"n_layers": 0, "num_params": 0, "peak_bytes": None, "memory": None, "next_peak_bytes": over}
    params, memory = tried[low]
    return {"n_layers": low, "num_params": params, "peak_bytes": memory["device_peak"], "memory": memory,
            "next_peak_bytes": over}  # fmt: skip


COLORS = (("params", "parameters", "#4c72b0"), ("grads", "gradients", "#dd8452"), ("optimizer", "optimizer state", "#55a868"))


def chart(result: dict, path: Path) -> None:
    """Figure 1's bars (per-device model states by part, per variant; host memory hatched above the
    device bars) beside the largest model per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = result["stages"]
    names = [r["variant"] for r in rows]
    mib = 2**20
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    bottom = [0.0] * len(rows)
    for key, label, color in COLORS:
        values = [r[f"{key}_bytes"] / mib for r in rows]
        left.bar(names, values, bottom=bottom, label=label, color=color)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    left.axhline(0, color="black", linewidth=0.5)
    for key, _, color in COLORS:  # what rests in pinned host memory, stacked above the device bars
        values = [r.get(f"{key}_host_bytes", 0) / mib for r in rows]
        left.bar(names, values, bottom=bottom, color="white", edgecolor=color, hatch="///", linewidth=0)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    handles, _ = left.get_legend_handles_labels()
    handles.append(Patch(facecolor="white", edgecolor="gray", hatch="///", label="in pinned host memory"))
    left.legend(handles=handles)
    left.set(xlabel="ZeRO stage (+ offload)", ylabel="MiB per device",
             title=f"model states per device ({result['num_params']:,} params)")  # fmt: skip
    sizes = [r["largest_model"]["num_params"] / 1e6 for r in rows]
    right.bar(names, sizes, color=["#8172b3" if not (r["offload_optimizer"] or r["offload_params"]) else "#c4ad66" for r in rows])
    right.set_ylim(top=max(sizes) * 1.12)  # room for the labels
    for i, r in enumerate(rows):
        right.annotate(f"{r['largest_params_ratio']:.1f}x", (i, sizes[i]), ha="center", va="bottom")
    right.set(xlabel="ZeRO stage (+ offload)", ylabel="million parameters",
              title=f"largest model in {result['budget_bytes'] / mib:.0f} MiB of device memory per device")  # fmt: skip
    for axis in (left, right):
        axis.tick_params(axis="x", labelrotation=20)
    from jzero.sharding.axes import mesh_text

    mesh = mesh_text(result["mesh"])
    fig.suptitle(f"jzero on {mesh} ({result['backend']}), fp32 AdamW")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(result: dict) -> str:
    from jzero.sharding.axes import mesh_text

    mib = 2**20
    mesh = mesh_text(result["mesh"])
    lines = [
        f"{result['num_params']:,} parameters, mesh {mesh} ({result['backend']}), fp32 AdamW; "
        f"median of {result['rounds']} interleaved rounds of {result['steps_per_round']} steps; "
        f"+opt: optimizer state and master in pinned host memory, +params: parameters too; "
        f"largest model: deepest that compiles within {result['budget_bytes'] / mib:.0f} MiB per device "
        f"(device peak: what rests in host memory not counted)",
        "",
        "| stage | step time vs stage 0 | offload overhead | model states / device | vs stage 0 | in host memory "
        "| paper formula | temporaries / device | vs stage 0 | largest model in budget | vs stage 0 | vs stage 3 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["stages"]:
        overhead = "" if r["offload_overhead"] is None else f"{r['offload_overhead']:.2f} (vs {r['stage']})"
        largest = r["largest_model"]
        lines.append(
            f"| {r['variant']} | {r['step_ratio']:.2f} | {overhead} "
            f"| {r['model_state_bytes'] / mib:.2f} MiB | {r['model_state_ratio']:.3f} | {r['host_state_bytes'] / mib:.2f} MiB "
            f"| {r['formula_bytes'] / mib:.2f} MiB | {r['temp_bytes'] / mib:.2f} MiB | {r['temp_ratio']:.2f} "
            f"| {largest['num_params'] / 1e6:.1f}M ({largest['n_layers']} layers) "
            f"| {r['largest_params_ratio']:.1f}x | {r['largest_vs_stage3']:.2f}x |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
