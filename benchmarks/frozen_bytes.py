"""Frozen parameters in bytes and on the wire: the tiny GPT with only some parameters training against
the same model with all of them training, at each stage on 8 simulated CPU devices.

    python benchmarks/frozen_bytes.py [--trainable 'blocks/(query|value)' ln_f]

For each stage, both configs are compiled (``Job.compile_step``); the rows give the plan's gradient
and optimizer bytes per device, the compiled step's argument bytes (the state it holds in flight),
and the collectives' bytes per step in the paper's accounting (an all-reduce counts twice), for
the frozen config and, in brackets, the whole model. tests/sharding/test_trainable.py asserts the
same figures against the formula (docs/lora.md quotes them).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

from jzero.distributed.process import import_jax  # noqa: E402

import_jax()

from support.configs import LR, tiny_config  # noqa: E402

from jzero.ledger import hlo  # noqa: E402
from jzero.sharding.stages import StateBytes  # noqa: E402
from jzero.training.job import build_job  # noqa: E402


def _row(*overrides: str) -> tuple[StateBytes, int, dict[str, int]]:
    job = build_job(tiny_config(LR, "mesh.axes.data=8", *overrides))
    _, compiled = job.compile_step()
    sent = hlo.communication_bytes(hlo.parse_collectives(compiled.as_text()))
    return job.plan.per_device_bytes(), compiled.memory_analysis().argument_size_in_bytes, sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainable", nargs="+", default=["blocks/(query|value)", "ln_f"])
    args = parser.parse_args()
    print(f"train.trainable={args.trainable}: frozen [all training]")
    for stage in range(4):
        (mine, args_mine, sent_mine), (theirs, args_theirs, sent_theirs) = (
            _row(f"zero.stage={stage}", f"train.trainable={args.trainable}"), _row(f"zero.stage={stage}")
        )
        sent = ", ".join(f"{k} {v:,} [{sent_theirs.get(k, 0):,}]" for k, v in sorted(sent_mine.items()))
        print(f"stage {stage}: grads {mine.grads:,} [{theirs.grads:,}] B, optimizer {mine.optimizer:,} "
              f"[{theirs.optimizer:,}] B, compiled arguments {args_mine:,} [{args_theirs:,}] B; sent: {sent}")  # fmt: skip


if __name__ == "__main__":
    main()
