"""What one CPU compile of the tests' tiny GPT train step costs (stage 3, ``data: 8``) under the suite's
XLA flags plus any given, in wall and process CPU seconds, the compilation cache off.

    python benchmarks/cpu_compile.py                                                  # the suite's flags
    python benchmarks/cpu_compile.py --xla_cpu_parallel_codegen_split_count=32        # and one more

Each compile is of another program, the step for another batch size (JAX hands back the executable
it has for a program it compiled before). On a shared machine compare runs made in one sitting,
alternated.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.xla import suite_flags  # noqa: E402  (imports nothing: JAX has not started)

os.environ["XLA_FLAGS"] = " ".join([suite_flags(), *sys.argv[1:]])  # a later flag wins over an earlier one
os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from support.configs import tiny_config  # noqa: E402

from jzero.training.job import build_job  # noqa: E402

COMPILES = 16


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _lowered(k: int):
    """The job and its step lowered for a global batch of ``8 k`` rows: a program of its own (JAX
    hands back the executable it already has for a program it compiled before, cache or not)."""
    job = build_job(tiny_config("zero.stage=3", f"train.global_batch_size={8 * k}"), devices=jax.devices())
    batch = jax.ShapeDtypeStruct(job.batch_shape, jnp.int32, sharding=job.plan.batch)
    return job, job.make_step().lower(job.abstract_state(), batch)


def main() -> None:
    job, lowered = _lowered(1)
    job.compile(lowered)  # the first pays one-time costs
    wall = cpu = 0.0
    for k in range(2, COMPILES + 2):
        job, lowered = _lowered(k)
        w0, c0 = time.perf_counter(), _cpu()
        job.compile(lowered)
        wall, cpu = wall + time.perf_counter() - w0, cpu + _cpu() - c0
    print(f"XLA_FLAGS={os.environ['XLA_FLAGS']}")
    print(f"{COMPILES} compiles: {wall / COMPILES:.3f} s wall, {cpu / COMPILES:.3f} CPU-s each")


if __name__ == "__main__":
    main()
