"""Each family's logits through jzero's decoder against transformers': a tiny random model of each
(tests/support/hf_families.py, initializer_range 0.2), its weights placed at stage 3 on
``data: 4, model: 2`` of 8 simulated CPU devices, against ``transformers``' eager forward on 4 x 16
tokens; the floor is jzero's own logits on one device against the mesh's (another order of the sums).

    python benchmarks/family_logits.py

Prints, per family, the largest gap, the floor, and the gap as a share of the tests' tolerance (10 x
the floor + 4 float32 ulps of the largest logit, tests/support/reference.py); docs/families.md quotes it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"  # before JAX starts
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import json  # noqa: E402
import tempfile  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from support.hf_families import FAMILIES, hf_logits, write_hf  # noqa: E402

from jzero.checkpoint.hf import model_section, placed_params  # noqa: E402
from jzero.config.loading import load_config  # noqa: E402
from jzero.step import activation_rules  # noqa: E402
from jzero.training.job import build_job  # noqa: E402

TOKENS = np.random.default_rng(0).integers(0, 320, (4, 16))


def logits(folder: Path, *sets: str) -> np.ndarray:
    words = [f"model.{k}={json.dumps(v)}" for k, v in model_section(folder).items()] + ["model.seq_len=48", *sets]
    job = build_job(load_config(None, words), jax.devices()[: 1 if "mesh.axes={data: 1}" in sets else 8])
    with activation_rules(job.plan):
        params = placed_params(folder, job.plan)
        return np.asarray(jax.jit(lambda p, t: job.model.apply({"params": p}, t))(params, jnp.asarray(TOKENS)))


def main() -> None:
    for family in FAMILIES:
        folder = write_hf(Path(tempfile.mkdtemp()) / family, family, seed=2, initializer_range=0.2)
        want = hf_logits(folder, TOKENS)
        one = logits(folder, "mesh.axes={data: 1}", "train.global_batch_size=4")
        mesh = logits(folder, "zero.stage=3", "mesh.axes={data: 4, model: 2}", "train.global_batch_size=8")
        floor, gap = np.abs(one - mesh).max(), np.abs(mesh - want).max()
        tolerance = 10 * floor + 4 * np.finfo(np.float32).eps * np.abs(want).max()
        print(f"{family}: gap {gap:.2g}, floor {floor:.2g}, {gap / tolerance:.2f} of the tolerance")


if __name__ == "__main__":
    main()
