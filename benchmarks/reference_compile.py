"""Where the tests' one-device reference spends its time: ``reference_with_floor`` of the clipped
tiny GPT (five programs: the whole batch and 2, 4, 8, 16 chunks, 20 steps each), then single
``reference_run`` calls whose programs are already in JAX's persistent cache.

    JAX_ENABLE_COMPILATION_CACHE=false python benchmarks/reference_compile.py   # every compile cold
    python benchmarks/reference_compile.py                                      # a fresh cache folder

Prints seconds and the floors; on a shared machine compare runs made in one sitting.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import conftest  # noqa: E402, F401  (8 CPU devices, a fresh cache folder, before JAX starts)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from support.configs import tiny_config  # noqa: E402
from support.reference import reference_run, reference_with_floor  # noqa: E402

from jzero.training.data import text_batches  # noqa: E402
from jzero.training.job import build_job  # noqa: E402


def main() -> None:
    cfg = tiny_config()
    data = text_batches(None, cfg.data.max_bytes, cfg.model.seq_len, cfg.train.global_batch_size, cfg.seed)
    ref = build_job(tiny_config("optimizer.clip_norm=0.05", "mesh.axes.data=1"), devices=jax.devices()[:1])
    batches = lambda k: jnp.asarray(data.global_batch(k))  # noqa: E731
    start = time.perf_counter()
    floor = reference_with_floor(ref.init_fn, ref.loss_fn, ref.tx, ref.rng, batches).floor
    print(f"reference_with_floor: {time.perf_counter() - start:.1f} s")
    print(f"floors: params up to {max(float(x) for x in jax.tree.leaves(floor.params)):.3g}, "
          f"losses {floor.losses:.3g}, gradient norms {floor.grad_norms:.3g}")  # fmt: skip
    for chunks in (1, 2, 16):
        start = time.perf_counter()
        reference_run(ref.init_fn, ref.loss_fn, ref.tx, ref.rng, batches, 1, chunks=chunks)
        print(f"reference_run, {chunks} chunk(s), 1 step, again: {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
