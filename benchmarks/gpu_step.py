"""A ~1B GPT's training step on real GPUs, timed, beside the step-time model's prediction for it.

    python benchmarks/gpu_step.py [--steps 20] [--warmup 3] [--out gpu_step.json]
    python benchmarks/gpu_step.py --gpus 8 --stage 3 --trace /tmp/gpu-trace   # the overlap, traced
    python benchmarks/gpu_step.py --dry-run      # on a CPU host: a tiny model, the same code path

The model is MosaicML's MPT-1B shape (d_model 2048, 24 layers, 16 heads, a 50,368-token vocabulary,
seq 2048) in bf16, stage 0 on one device, ``--batch`` rows (default 8) with full remat. The step is
compiled once, run ``--warmup`` times, then ``--steps`` times, each finished (``block_until_ready``)
before the clock stops; the median step gives tokens/s and MFU (model FLOPs over the GPU's dense
bf16 peak). The prediction is ``jzero plan``'s for the same compiled program
(:mod:`jzero.ledger.prediction`), so the ratio measured / predicted checks the model's efficiency
factor on this GPU.

``--gpus N --stage S`` runs it at stage S on ``data: N``. ``--trace DIR`` traces the timed steps
with ``jax.profiler`` and reads from the trace how long NCCL's kernels ran under compute and how
long alone (:func:`jzero.training.profile.collective_overlap`), beside the prediction's
communication and exposed communication. On one GPU there are no collectives to read.

``--dry-run`` needs no GPU: a tiny GPT whose prediction comes from a deviceless compile for one
H100 (``--target``, the gpu-target extra), and whose steps run on the CPU to exercise the timing.
Its figures mean nothing; the tests run it.
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
sys.path.insert(0, str(ROOT))

ONE_B = ["model.vocab_size=50368", "model.d_model=2048", "model.n_layers=24", "model.n_heads=16", "model.seq_len=2048"]
TINY = ["model.vocab_size=256", "model.d_model=64", "model.n_layers=2", "model.n_heads=2", "model.seq_len=64"]
COMMON = ["model.remat=full", "precision.param_dtype=bfloat16", "precision.compute_dtype=bfloat16",
          "train.microbatches=1"]  # fmt: skip


def _config(shape: list[str], batch: int, gpus: int = 1, stage: int = 0):
    from jzero.config.loading import load_config

    mesh = [f"zero.stage={stage}", f"mesh.axes={{data: {gpus}}}"]
    return load_config(ROOT / "configs/gpt-7b.yaml", [*COMMON, *mesh, *shape, f"train.global_batch_size={batch}"])


def predicted_for(config, devices) -> dict:
    """The plan's prediction for ``config`` compiled for ``devices`` (a real GPU, or a target's)."""
    from jzero.records import to_json
    from jzero.training.job import build_job
    from jzero.training.report import plan_report

    job = build_job(config, devices)
    _, compiled = job.compile_step()
    report = to_json(plan_report(job, compiled))
    return {"predicted": report["predicted"], "device_kind": report["device_kind"], "model_flops": report["model_flops"]}


def timed_steps(config, devices, steps: int, warmup: int, trace: str | None = None) -> list[float]:
    """Seconds per step of ``config`` trained on ``devices``, each step finished before the next
    starts; the timed steps traced into ``trace`` when given."""
    import jax
    import numpy as np

    from jzero.training.job import build_job

    job = build_job(config, devices)
    step = job.make_step()
    state = job.init_state()
    rows, width = job.batch_shape
    tokens = np.random.default_rng(0).integers(0, config.model.vocab_size, (rows, width), dtype=np.int32)
    batch = jax.device_put(tokens, job.plan.batch)
    times = []
    for i in range(warmup + steps):
        if trace and i == warmup:
            jax.profiler.start_trace(trace, create_perfetto_trace=True)
        start = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready((state, metrics))
        if i >= warmup:
            times.append(time.perf_counter() - start)
    if trace:
        jax.profiler.stop_trace()
    return times


def traced_overlap(trace: str, predicted: dict) -> dict:
    """The trace's NCCL time under compute and alone, per timed step, beside the prediction's."""
    from jzero.training.profile import collective_overlap

    path = sorted(Path(trace).rglob("perfetto_trace.json.gz"))[-1]  # this run's: the newest folder
    found = collective_overlap(path)
    mine = {k: predicted[k] for k in ("communication_s", "exposed_communication_s")}
    return {"trace": str(path), "measured": found["total"], "devices": found["devices"], "predicted": mine}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--gpus", type=int, default=1, help="the data axis: this many of the local GPUs")
    parser.add_argument("--stage", type=int, default=0)
    parser.add_argument("--trace", default=None, metavar="DIR", help="trace the timed steps; read the collectives' overlap")
    parser.add_argument("--dry-run", action="store_true", help="no GPU: a tiny model, predicted for a deviceless H100")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.dry_run:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        if "device_count" not in os.environ.get("XLA_FLAGS", ""):  # --gpus CPU devices
            os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={args.gpus}"
    import jax

    from jzero.ledger.targets import target_devices

    config = _config(TINY if args.dry_run else ONE_B, 2 if args.dry_run else args.batch, args.gpus, args.stage)
    devices = jax.devices()[: args.gpus]
    device = devices[0]
    if not args.dry_run and device.platform != "gpu":
        raise SystemExit("gpu_step.py: no GPU here (JAX sees a " + device.platform + "); --dry-run runs on a CPU")
    if len(devices) < args.gpus:
        raise SystemExit(f"gpu_step.py: --gpus {args.gpus}, but JAX sees {len(devices)} devices")
    found = predicted_for(config, target_devices(f"h100x{args.gpus}") if args.dry_run else devices)
    times = timed_steps(config, devices, args.steps, args.warmup, args.trace)
    step_s = statistics.median(times)
    p, flops = found["predicted"], found["model_flops"]
    tokens = config.train.global_batch_size * config.model.seq_len
    peak = flops["peak_flops"]
    result = {
        "dry_run": args.dry_run,
        "device_kind": device.device_kind,
        "predicted_for": found["device_kind"],
        "shape": {k.split(".")[1]: int(v) for k, v in (kv.split("=") for kv in (TINY if args.dry_run else ONE_B))},
        "batch": config.train.global_batch_size,
        "gpus": args.gpus,
        "stage": args.stage,
        "steps": args.steps,
        "measured": {
            "step_time_s": step_s,
            "step_times_s": times,
            "tokens_per_sec": tokens / step_s,
            "mfu": flops["per_device_per_step"] / (step_s * peak) if peak and not args.dry_run else None,
        },
        "predicted": {k: p[k] for k in ("step_time_s", "tokens_per_sec", "mfu", "efficiency", "bound")},
        "measured_over_predicted_tokens_per_sec": (tokens / step_s) / p["tokens_per_sec"],
    }
    if args.trace:
        result["overlap"] = traced_overlap(args.trace, p)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
