"""What jzero's XLA options for GPUs change in a compiled program, measured on a GPU target.

Lowers one train step, then compiles it for the target with XLA's defaults, with jzero's
``GPU_COMPILER_OPTIONS``, with the latency-hiding scheduler off, and with the combining thresholds at
0; for each it prints the compiled temporaries, the bytes sent per step and, per collective kind,
the ops in the program text, how many are async and how many of those have compute scheduled under
them. Needs the ``gpu-target`` extra; runs on a CPU host.

    python benchmarks/gpu_options.py configs/gpt-7b.yaml --target h100x64
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(ROOT / "configs/gpt-7b.yaml"))
    parser.add_argument("--target", default="h100x64")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)

    from jzero.distributed.process import import_jax, start_backends
    from jzero.ledger.targets import GPU_COMPILER_OPTIONS, parse_target, target_devices

    import_jax(target=True)
    start_backends()
    import jax
    import jax.numpy as jnp

    from jzero.config.loading import load_config
    from jzero.ledger import hlo as ledger
    from jzero.training.job import build_job

    target = parse_target(args.target)
    s = build_job(load_config(args.config, args.set), target_devices(target))
    batch = jax.ShapeDtypeStruct(s.batch_shape, jnp.int32, sharding=s.plan.batch)
    lowered = s.make_step().lower(s.abstract_state(), batch)
    thresholds = {k: 0 for k in GPU_COMPILER_OPTIONS if k.endswith("threshold_bytes")}
    variants = {
        "XLA's defaults": {},
        "jzero's options": dict(GPU_COMPILER_OPTIONS),
        "jzero's, scheduler off": {**GPU_COMPILER_OPTIONS, "xla_gpu_enable_latency_hiding_scheduler": False},
        "jzero's, thresholds 0": {**GPU_COMPILER_OPTIONS, **thresholds},
    }
    print(f"{args.config} stage {s.plan.stage} on {target.name}; per kind: ops (async, overlapped)")
    texts = {}
    for name, options in variants.items():
        compiled = lowered.compile(compiler_options=options or None)
        texts[name] = compiled.as_text().split("\n", 1)[1]  # the module header holds a fingerprint
        ops = ledger.parse_collectives(compiled.as_text())
        summary = sorted(ledger.summarize_collectives(ops).items())
        kinds = ", ".join(f"{k} {v['count']} ({v['async']}, {v['overlapped']})" for k, v in summary)
        temp = compiled.memory_analysis().temp_size_in_bytes / 2**30
        sent = sum(ledger.communication_bytes(ops).values()) / 2**30
        print(f"  {name:<24} temporaries {temp:.3f} GiB, sent {sent:.3f} GiB; {kinds}", flush=True)
    same = texts["jzero's options"] == texts["jzero's, scheduler off"]
    print(f"  the program with the scheduler off is {'byte-identical to' if same else 'different from'} jzero's")


if __name__ == "__main__":
    sys.exit(main())
