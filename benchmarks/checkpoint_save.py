"""How long a checkpoint save blocks the training loop: asynchronous against synchronous.

    python benchmarks/checkpoint_save.py [CONFIG] [--set KEY=VALUE ...] [--rounds 3] [--out DIR]

The state is the config's full train state (by default gpt2-small: 123.7M parameters, fp32 AdamW:
1.48 GB), initialised sharded on the config's mesh, with random moments (as after some training;
zeros would compress to nothing). Each round saves it once synchronously
(the loop is blocked until the checkpoint is committed) and once asynchronously (the loop is
blocked only until ``save`` returns: the device-to-host copy; the write and commit run in the
background, and are timed too). Rounds alternate the two, so machine noise hits both alike; the
figures are medians, and the ratio is async over sync from the same run. It also times restoring
the checkpoint onto another mesh and stage (``data: 4, model: 2`` at stage 1).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def mid_training(state, shardings):
    """Fresh Adam moments are zeros, which compress to nothing on disk; give every float leaf
    random contents, as a state has after some training."""
    import jax
    import jax.numpy as jnp

    def fill(state):
        leaves, treedef = jax.tree.flatten(state)
        keys = jax.random.split(jax.random.key(0), len(leaves))
        noisy = [
            x + 1e-3 * jax.random.normal(k, x.shape, x.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
            for x, k in zip(leaves, keys, strict=True)
        ]
        return jax.tree.unflatten(treedef, noisy)

    return jax.jit(fill, out_shardings=shardings, donate_argnums=0)(state)


def arguments(doc: str) -> argparse.ArgumentParser:
    """The checkpoint benchmarks' flags: a config (gpt2-small by default), overrides, rounds, out."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(ROOT / "configs/gpt2-small.yaml"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results"))
    return parser


def trained_state(config_path: str, overrides: list[str]):
    """JAX started for the config, its :class:`~jzero.training.job.Job`, and a mid-training state."""
    from jzero.config.loading import load_config
    from jzero.distributed.process import import_jax, start_backends
    from jzero.sharding.mesh import simulate_cpu_devices

    config = load_config(config_path, overrides)
    import_jax()  # on a host without a GPU, the CPU alone even with the gpu-target extra installed
    simulate_cpu_devices(config.runtime.cpu_devices)
    start_backends()

    import jax

    from jzero.training.job import build_job

    s = build_job(config)
    return s, jax.block_until_ready(mid_training(s.init_state(), s.plan.state))


def main(argv: list[str] | None = None) -> dict:
    parser = arguments(__doc__)
    parser.add_argument("--tmp", default=None, help="where checkpoints are written (default: a temporary folder)")
    args = parser.parse_args(argv)
    s, state = trained_state(args.config, args.set)

    import jax

    from jzero.checkpoint.runs import RunCheckpoints
    from jzero.config.loading import load_config
    from jzero.config.schema import CheckpointConfig
    from jzero.ledger import hlo as ledger
    from jzero.sharding.mesh import mesh_shape
    from jzero.training.job import build_job

    state_bytes = sum(x.nbytes for x in jax.tree.leaves(state))
    per_device = ledger.live_bytes_per_device(state)
    root = Path(args.tmp or tempfile.mkdtemp(prefix="jzero-ckpt-bench-"))
    times: dict[str, list[float]] = {"sync": [], "async": [], "async_commit": []}
    for r in range(args.rounds):
        for mode in ("sync", "async"):
            folder = root / f"{mode}-{r}"
            ckpts = RunCheckpoints(folder, CheckpointConfig(every=1, keep=1, async_=mode == "async"))
            t0 = time.perf_counter()
            ckpts.save(1, state, {}, {})
            blocked = time.perf_counter() - t0
            ckpts.wait()
            committed = time.perf_counter() - t0
            ckpts.manager.close()
            times[mode].append(committed if mode == "sync" else blocked)
            if mode == "async":
                times["async_commit"].append(committed)
            print(f"round {r} {mode:5}: loop blocked {times[mode][-1]:.2f} s, committed after {committed:.2f} s", flush=True)
    last = root / f"async-{args.rounds - 1}"
    target = build_job(load_config(args.config, [*args.set, "mesh.axes.data=4", "mesh.axes.model=2", "zero.stage=1"]))
    t0 = time.perf_counter()
    restored = RunCheckpoints(last).restore(1, target.abstract_state()).state
    jax.block_until_ready(restored)
    restore_s = time.perf_counter() - t0
    on_disk = sum(f.stat().st_size for f in (last / "checkpoints" / "1").rglob("*") if f.is_file())
    shutil.rmtree(root, ignore_errors=True) if args.tmp is None else None

    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "config": args.config,
        "overrides": args.set,
        "num_params": s.plan.num_params,
        "mesh": mesh_shape(s.mesh),
        "stage": s.plan.stage,
        "backend": jax.default_backend(),
        "state_bytes": state_bytes,
        "state_bytes_per_device": per_device,
        "bytes_on_disk": on_disk,
        "rounds": args.rounds,
        "times_s": times,
        "median_s": med,
        "async_over_sync_blocking": med["async"] / med["sync"],
        "restore_onto_data4_model2_stage1_s": restore_s,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "checkpoint_save.json").write_text(json.dumps(result, indent=2))
    gb = 1e9
    md = [
        f"{s.plan.num_params:,} parameters, stage {s.plan.stage} on {mesh_shape(s.mesh)} ({jax.default_backend()}), "
        f"train state {state_bytes / gb:.2f} GB ({per_device / gb:.3f} GB per device), {on_disk / gb:.2f} GB on disk; "
        f"median of {args.rounds} alternating rounds",
        "",
        "| save | training loop blocked | ratio to sync | committed after |",
        "|---|---|---|---|",
        f"| sync | {med['sync']:.2f} s | 1.00 | {med['sync']:.2f} s |",
        f"| async | {med['async']:.2f} s | {result['async_over_sync_blocking']:.2f} | {med['async_commit']:.2f} s |",
        "",
        f"Restore onto data=4 x model=2 at stage 1: {restore_s:.2f} s.",
    ]
    (out / "checkpoint_save.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return result


if __name__ == "__main__":
    main()
