"""Gathering units through a model wrapped in ``nn.jit``: what a stage-3 step holds gathered at
once and all-gathers, with units against without, and against the same model unwrapped.

The model is the tests' Llama-style decoder (``tests/support/llama.py``), 6 layers, d 32, its
``__call__`` wrapped in ``nn.jit`` as a library does so that ``apply`` is fast in notebooks. Each
row compiles one train step from shapes on the CPU's 8 simulated devices (``data=8``).

    python benchmarks/units_nn_jit.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the Llama-style test model

ROWS = [("nn.jit", "none"), ("nn.jit", "auto"), ("unwrapped", "auto")]  # (model, gather_units)


def row(model: str, units: str) -> dict:
    """One compile's figures over the whole parameters' bytes."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax
    from helpers.llama import Llama

    from jzero.config.loading import load_config
    from jzero.ledger import gathered
    from jzero.training.job import build_job

    llama = (nn.jit(Llama) if model == "nn.jit" else Llama)(d=32, layers=6, heads=4, kv_heads=2)

    def init_fn(key):
        return llama.init(key, jnp.zeros((1, 16), jnp.int32))["params"]

    def loss_fn(params, batch):
        logits = llama.apply({"params": params}, batch[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

    keys = ["model.seq_len=16", "train.global_batch_size=16", "zero.stage=3", f"zero.gather_units={units}"]
    s = build_job(load_config(None, keys), jax.devices()[:8], init_fn=init_fn, loss_fn=loss_fn)
    _, compiled = s.compile_step()
    whole = sum(t.nbytes for t in s.plan.tensors)
    g = gathered.gathered_at_once(compiled, s.plan)
    sent = gathered.gathered_total(compiled.as_text()) / whole
    return {"model": model, "gather_units": units, "units": g.units, "at_once": g.share_of_params, "all_gather": sent}


def main() -> list[dict]:
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    rows = [row(*r) for r in ROWS]
    print("| model | gather_units | units in effect | gathered at once | all-gathered |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['gather_units']} | {r['units']} | {r['at_once']:.2f} | {r['all_gather']:.3f} |")
    return rows


if __name__ == "__main__":
    main()
