"""What jzero's XLA options for GPUs change in a compiled program, measured on a GPU target.

Lowers one train step, then compiles it for the target with XLA's defaults, with jzero's options
for it (``gpu_compiler_options``: thresholds at 1.25 layers), and with each of them changed in turn;
for each it prints the compiled temporaries, the bytes gathered at once, per collective kind the
ops in the program text, how many are async and how many of those have compute scheduled under
them, and the communication the step-time model finds exposed (``jzero plan``'s). Needs the
``gpu-target`` extra; runs on a CPU host.

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

    from jzero.compiler.options import gpu_compiler_options
    from jzero.distributed.process import import_jax, start_backends
    from jzero.ledger.targets import parse_target, target_devices

    import_jax(target=True)
    start_backends()
    import jax
    import jax.numpy as jnp

    from jzero.config.loading import load_config
    from jzero.ledger import gathered
    from jzero.ledger import hlo as ledger
    from jzero.records import to_json
    from jzero.training.job import build_job
    from jzero.training.report import plan_report

    target = parse_target(args.target)
    s = build_job(load_config(args.config, args.set), target_devices(target))
    batch = jax.ShapeDtypeStruct(s.batch_shape, jnp.int32, sharding=s.plan.batch)
    lowered = s.make_step().lower(s.abstract_state(), batch)
    mine = gpu_compiler_options(s.plan.layer_bytes(s.precision.compute_dtype))
    thresholds = {k: 0 for k in mine if k.endswith("threshold_bytes")}
    pipelined = {k: False for k in mine if "pipelined" in k}
    variants = {
        "XLA's defaults": {},
        "jzero's options": mine,
        "jzero's, scheduler off": {**mine, "xla_gpu_enable_latency_hiding_scheduler": False},
        "jzero's, not pipelined": {**mine, **pipelined},
        "jzero's, 256 MiB": {**mine, **{k: 256 * 2**20 for k in thresholds}},
        "jzero's, 1 GiB": {**mine, **{k: 2**30 for k in thresholds if "all_reduce" not in k}},
        "jzero's, thresholds 0": {**mine, **thresholds},
        "jzero's + double buffer": {**mine, "xla_gpu_enable_while_loop_double_buffering": True},
        "jzero's, priority off": {**mine, "xla_gpu_enable_highest_priority_async_stream": False},
    }
    print(f"{args.config} stage {s.plan.stage} on {target.name}; per kind: ops (async, overlapped); exposed communication")
    texts = {}
    for name, options in variants.items():
        compiled = lowered.compile(compiler_options=options or None)
        texts[name] = compiled.as_text().split("\n", 1)[1]  # the module header holds a fingerprint
        ops = ledger.parse_collectives(compiled.as_text())
        summary = sorted(ledger.summarize_collectives(ops).items())
        kinds = ", ".join(f"{k} {v['count']} ({v['async']}, {v['overlapped']})" for k, v in summary)
        temp = compiled.memory_analysis().temp_size_in_bytes / 2**30
        p = to_json(plan_report(s, compiled).predicted)
        exposed = f"{1e3 * p['exposed_communication_s']:.1f} of {1e3 * p['communication_s']:.1f} ms"
        held = gathered.gathered_at_once(compiled, s.plan, s.precision).layers
        memory = f"temporaries {temp:.3f} GiB; gathered at once {held:.2f} layers"
        print(f"  {name:<24} {memory}; {kinds}; exposed {exposed}", flush=True)
    for name in ("jzero's, scheduler off", "jzero's, priority off"):
        same = texts["jzero's options"] == texts[name]
        print(f"  the program with {name.split(', ')[1]} is {'byte-identical to' if same else 'different from'} jzero's")


if __name__ == "__main__":
    sys.exit(main())
