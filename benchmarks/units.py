"""ZeRO-3 gathering units on an unscanned model: what is gathered at once, the temporaries, the
traffic, and the step time, with units against without.

The model is the tests' Llama-style decoder (``tests/support/llama.py``: unannotated, its layers a
Python loop, grouped-query attention, RMSNorm, SwiGLU). Each row compiles one train step from
shapes: on the CPU's 8 simulated devices and, with the ``gpu-target`` extra, for an ``h100x8``
target. Then it times stage-3 steps on CPU with ``zero.gather_units`` auto against none, the two
alternating so that machine noise hits both alike. ``--scale`` adds a 7B Llama-shaped model (d
4096, 32 heads, 8 KV heads, MLP 11008, vocabulary 32000, 32 layers) in bf16 on ``h100x8`` at 48 x
2048 tokens, against an 80 GB H100.

    python benchmarks/units.py [--layers 6] [--d 128] [--steps 20] [--scale] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the Llama-style test model

ROWS = [  # (where, mesh, stage, gather_units)
    ("cpu", "data=8", 0, "none"),
    ("cpu", "data=8", 3, "none"),
    ("cpu", "data=8", 3, "auto"),
    ("cpu, XLA's CPU options", "data=8", 3, "auto"),  # cse_barrier_expander left on
    ("cpu", "data=4 model=2", 3, "none"),
    ("cpu", "data=4 model=2", 3, "auto"),
    ("h100x8", "data=8", 0, "none"),
    ("h100x8", "data=8", 3, "none"),
    ("h100x8", "data=8", 3, "auto"),
    ("h100x8", "data=4 model=2", 3, "none"),
    ("h100x8", "data=4 model=2", 3, "auto"),
]
SEVEN_B = {"d": 4096, "heads": 32, "kv_heads": 8, "mlp": 11008, "vocab": 32000}


def _setup(shape: dict, where: str, mesh: str, stage: int, units: str, extra: list[str]):
    import jax
    from helpers.llama import llama_parts

    from jzero.config.loading import load_config
    from jzero.ledger.targets import target_devices
    from jzero.training.job import build_job

    seq_len = extra_seq(extra)
    init_fn, loss_fn = llama_parts(seq_len, **shape)
    axes = [f"mesh.axes.{kv}" for kv in mesh.split()]
    cfg = load_config(None, [*extra, f"zero.stage={stage}", f"zero.gather_units={units}", *axes])
    devices = jax.devices() if where.startswith("cpu") else target_devices(where)
    return build_job(cfg, devices, init_fn=init_fn, loss_fn=loss_fn)


def extra_seq(extra: list[str]) -> int:
    return int(next(kv.split("=")[1] for kv in extra if kv.startswith("model.seq_len=")))


def row(shape: dict, where: str, mesh: str, stage: int, units: str, extra: list[str]) -> dict:
    """One compile's figures against the whole parameters' bytes (4Ψ for fp32)."""
    from jzero.records import to_json
    from jzero.training.report import plan_report

    s = _setup(shape, where, mesh, stage, units, extra)
    compiled = None
    if where != "cpu" and where.startswith("cpu"):  # the ablation: no CPU_UNIT_OPTIONS
        import jax
        import jax.numpy as jnp

        batch = jax.ShapeDtypeStruct(s.batch_shape, jnp.int32, sharding=s.plan.batch)
        compiled = s.make_step().lower(s.abstract_state(), batch).compile(compiler_options={"xla_disable_hlo_passes": ""})
    r = to_json(plan_report(s, compiled))
    whole = sum(t.nbytes for t in s.plan.tensors)
    g = r["gathered"]
    return {
        "where": where,
        "mesh": mesh,
        "stage": stage,
        "gather_units": units,
        "temp_over_params": r["compiled"]["temp"] / whole,
        "gathered_over_params": g["peak_bytes"] / whole,
        "gathered_layers": g["peak_bytes"] / max(s.plan.unit_bytes() or [_layer_bytes(s)]),
        "communication_ratio": r["communication"]["ratio"],
        "device_peak_gb": r["device_peak"] / 1e9,
    }


def _layer_bytes(s) -> int:
    from jzero.sharding.partition import shard_bytes

    layer = [t for t in s.plan.tensors if t.path.startswith("layers_0/")]
    return sum(shard_bytes(t.shape, t.dtype, t.replicated_spec, s.plan.mesh) for t in layer)


def timing(shape: dict, steps: int, extra: list[str]) -> dict:
    """Median stage-3 step time on CPU, units auto and none alternating step by step."""
    import jax

    runs = {}
    for units in ("auto", "none"):
        s = _setup(shape, "cpu", "data=8", 3, units, extra)
        state, step = s.init_state(), s.make_step()
        batch = jax.device_put(jax.random.randint(jax.random.key(0), s.batch_shape, 0, 256), s.plan.batch)
        state, metrics = step(state, batch)  # compile
        jax.block_until_ready(metrics)
        runs[units] = (state, step, batch)
    times = {"auto": [], "none": []}
    for _ in range(steps):
        for units, (state, step, batch) in runs.items():
            start = time.perf_counter()
            state, metrics = step(state, batch)
            jax.block_until_ready(metrics)
            times[units].append(time.perf_counter() - start)
            runs[units] = (state, step, batch)
    medians = {k: statistics.median(v) for k, v in times.items()}
    return {"median_s": medians, "ratio_auto_over_none": medians["auto"] / medians["none"], "steps": steps}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--scale", action="store_true", help="also the 7B-wide model in bf16 on h100x8")
    parser.add_argument("--scale-layers", type=int, default=32)
    parser.add_argument("--scale-batch", type=int, default=48)
    parser.add_argument("--out", default=None, help="write units.json and units.md here")
    args = parser.parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

    from jzero.distributed.process import import_jax, start_backends
    from jzero.ledger.targets import gpu_compiler_available

    gpu = gpu_compiler_available()
    import_jax(target=gpu)
    start_backends()

    shape = {"d": args.d, "layers": args.layers, "heads": 4, "kv_heads": 2}
    extra = ["model.seq_len=32", "train.global_batch_size=32"]
    rows = [row(shape, *r, extra) for r in ROWS if gpu or r[0].startswith("cpu")]
    result = {"shape": shape, "rows": rows, "timing": timing(shape, args.steps, extra)}
    if args.scale and gpu:
        import jax.numpy as jnp

        big = {**SEVEN_B, "layers": args.scale_layers, "dtype": jnp.bfloat16}
        bf16 = ["precision.param_dtype=bfloat16", "precision.compute_dtype=bfloat16", "model.seq_len=2048"]
        batch = [f"train.global_batch_size={args.scale_batch}"]
        result["scale"] = [row(big, "h100x8", "data=8", 3, units, [*bf16, *batch]) for units in ("none", "auto")]
        for r in result["scale"]:
            r["where"] = f"h100x8, 7B ({args.scale_layers} layers) bf16, {args.scale_batch} x 2048"
    text = render(result)
    print(text)
    if args.out:
        out = Path(args.out)
        (out / "units.json").write_text(json.dumps(result, indent=1) + "\n")
        (out / "units.md").write_text(text + "\n")
    return result


def render(result: dict) -> str:
    lines = [
        f"Llama-style unscanned model {result['shape']}; figures over the whole parameters' bytes",
        "",
        "| compile | mesh | stage | gather_units | temporaries | gathered at once | layers' worth | traffic ÷ paper |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"] + result.get("scale", []):
        lines.append(
            f"| {r['where']} | {r['mesh']} | {r['stage']} | {r['gather_units']} | {r['temp_over_params']:.2f} | "
            f"{r['gathered_over_params']:.2f} | {r['gathered_layers']:.2f} | {r['communication_ratio']:.3f} |"
        )
    t = result["timing"]
    ratio = t["ratio_auto_over_none"]
    lines += ["", f"CPU step time, stage 3 on data=8, units auto ÷ none: {ratio:.3f} (medians of {t['steps']})"]
    for r in result.get("scale", []):
        lines.append(f"7B-wide, bf16, h100x8, units {r['gather_units']}: device peak {r['device_peak_gb']:.2f} GB")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
