"""The validation loss: one device's at every stage and mesh, from the same batches every time,
and at stage 3 without ever holding the whole model gathered."""

import json
import sysconfig
from pathlib import Path

import jax
import numpy as np
import pytest
from support.configs import STDLIB_GLOB, tiny_config
from support.reference import assert_within_floor, loss_with_floor
from support.runs import run_config

from jzero.training.data import eval_data, load_bytes, resolve_files, stdlib_package_sources, stdlib_sources, train_data
from jzero.training.evaluation import Evaluator
from jzero.training.job import build_job
from jzero.training.loop import train

EVAL = ["train.eval_every=5", "train.eval_batches=2"]



@pytest.fixture(scope="module")
def trained_like():
    """Parameters away from the init (the init's logits are near uniform), on the host, and the eval batches."""
    one = build_job(tiny_config("mesh.axes.data=1", *EVAL), jax.devices()[:1])
    params = jax.tree.map(lambda x: 4 * np.asarray(x), jax.device_get(one.init_state().params))
    return one, params, eval_data(one.config)


@pytest.mark.parametrize("axes", ["{data: 8}", "{data: 4, model: 2}"])
def test_eval_loss_is_one_devices_at_every_stage(devices, trained_like, axes):
    """Within MARGIN x the floor of the same loss summed in 2-16 chunks, + 4 ulps. Measured with
    ``JZERO_FLOOR_LOG``: floor 2.4e-7, tolerance 5.9e-6; gaps 0 on data=8 and 2.4e-7 (0.04 of the
    tolerance) on data=4 x model=2, at every stage."""
    one, params, batches = trained_like
    want, floor = loss_with_floor(one.loss_fn, params, [batches.global_batch(i) for i in range(len(batches))])
    job = build_job(tiny_config(f"mesh.axes={axes}", *EVAL), devices)
    for stage in range(4):
        staged = job.replan(stage=stage)
        placed = jax.device_put(params, staged.plan.params)
        evaluator = Evaluator(staged, batches, every=5, last_step=10)
        evaluator.compile(placed)
        figures = evaluator.evaluate(placed)
        assert_within_floor(figures["eval_loss"], want, floor, f"stage {stage} on {axes}")
        assert figures["eval_perplexity"] == pytest.approx(np.exp(figures["eval_loss"]))  # float64 exp: rounding only
        assert evaluator.evaluate(placed) == figures  # the same batches, the same loss


def test_stage_3_eval_never_holds_the_whole_model(devices):
    job = build_job(tiny_config("zero.stage=3", "mesh.axes.data=8", *EVAL), devices)
    batch = jax.ShapeDtypeStruct(job.batch_shape, np.int32, sharding=job.plan.batch)
    compiled = job.compile(job.make_eval_step().lower(job.abstract_state().params, batch))
    whole = 4 * job.plan.num_params
    assert compiled.memory_analysis().temp_size_in_bytes < whole
    hlo = compiled.as_text()
    assert "all-gather" in hlo and "reduce-scatter" not in hlo  # gathers parameters, reduces no gradient


def test_eval_batches_never_come_from_training(devices):
    """The stdlib's top-level sources validate on its packages' sources, which training never reads;
    other bytes hold out their tail, and training reads only the rest."""
    config = tiny_config(*EVAL)
    held = eval_data(config)
    # The packages' sources, listed here by pathlib's glob (jzero prunes site-packages as it walks).
    root = Path(sysconfig.get_paths()["stdlib"])
    packages = sorted(p for p in root.glob("*/**/*.py") if "site-packages" not in p.relative_to(root).parts)
    assert stdlib_package_sources() == packages and not set(packages) & set(stdlib_sources())
    assert len(train_data(config).tokens) == config.data.max_bytes  # nothing held out of the training bytes
    np.testing.assert_array_equal(held.tokens, load_bytes(packages, len(held.tokens)))
    config = tiny_config(*EVAL, f"data.path={STDLIB_GLOB}")
    train, held = train_data(config), eval_data(config)
    full = load_bytes(resolve_files(config.data.path), config.data.max_bytes)
    split = len(full) - len(held.tokens)
    np.testing.assert_array_equal(held.tokens, full[split:])
    np.testing.assert_array_equal(train.tokens, full[:split])
    assert len(held.tokens) == len(held) * held.global_batch_size * held.seq_len + 1


def test_a_run_evaluates_at_every_multiple_and_at_its_last_step(devices, tmp_path):
    """train.steps 5, eval_every 2: eval rows at steps 2 and 4, and at 5, the last, which is no
    multiple of 2. (On a small text of its own: eval on the standard library's packages is slower.)"""
    text = tmp_path / "text.txt"
    text.write_text("def add(x, y):\n    return x + y\n" * 2000)
    sets = ["train.steps=5", "train.eval_every=2", "train.eval_batches=1", "run.log_every=1", "checkpoint.every=0"]
    result = train(run_config(tmp_path / "run", *sets, f"data.path={text}"), progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and rows == result.history
    assert [r["step"] for r in rows if "eval_loss" in r] == [2, 4, 5]
    assert all(np.isfinite(r["eval_loss"]) for r in rows if "eval_loss" in r)
