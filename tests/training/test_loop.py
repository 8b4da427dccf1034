"""The training loop with a model of your own, hooks of your own, and TensorBoard."""

import json
import subprocess
import sys

import flax.linen as nn
import pytest
from support.lm import lm_parts
from support.runs import run_config
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from jzero.training.hooks import Hook
from jzero.training.job import build_job
from jzero.training.loop import train


class Bigram(nn.Module):
    """Not jzero's GPT: next-byte logits from the current byte alone."""

    @nn.compact
    def __call__(self, tokens):
        init = nn.initializers.normal(0.02)
        table = nn.Embed(256, 64, embedding_init=nn.with_logical_partitioning(init, ("vocab", "embed")))
        return nn.Dense(256, kernel_init=nn.with_logical_partitioning(init, ("embed", "vocab")))(table(tokens))


def bigram_parts():
    return lm_parts(Bigram())


class Recorder(Hook):
    def __init__(self):
        self.steps, self.records, self.ended, self.closed = [], [], None, False

    def step(self, step, state):
        self.steps.append(step)

    def log(self, record):
        self.records.append(record)

    def end(self, step, state, preempted):
        self.ended = (step, preempted)

    def close(self):
        self.closed = True


def test_a_second_model_trains_through_the_built_run(devices, tmp_path):
    """A model other than the GPT, through ``build_job(init_fn=..., loss_fn=...)`` and ``train(job=...)``:
    no monkeypatching. It is planned (stage 3 shards its two tensors), checkpointed and learns."""
    config = run_config(tmp_path, "train.steps=30", "run.log_every=5", "optimizer.learning_rate=1e-2", "checkpoint.every=10")
    init_fn, loss_fn = bigram_parts()
    built = build_job(config, init_fn=init_fn, loss_fn=loss_fn)
    assert [t.path for t in built.plan.tensors] == ["Dense_0/bias", "Dense_0/kernel", "Embed_0/embedding"]
    assert all("data" in str(t.param_spec) for t in built.plan.tensors if len(t.shape) == 2)
    recorder = Recorder()
    result = train(config, job=built, progress=False, hooks=[recorder])
    losses = [r["loss"] for r in result.history]
    assert losses[-1] < losses[0] - 1.0, losses  # a bigram table learns byte statistics fast
    assert result.saved == [10, 20, 30]
    assert recorder.steps == list(range(1, 31)) and [r["step"] for r in recorder.records] == [5, 10, 15, 20, 25, 30]
    assert recorder.ended == (30, None) and recorder.closed
    with pytest.raises(TypeError, match="both init_fn and loss_fn"):
        build_job(config, init_fn=init_fn)


def test_tensorboard_holds_what_metrics_jsonl_holds(devices, tmp_path):
    train(run_config(tmp_path, "train.steps=6", "run.log_every=2"), progress=False)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = {"loss", "grad_norm", "learning_rate", "tokens_per_sec", "model_flops_per_sec", "skipped_steps"}
    assert set(events.Tags()["scalars"]) == scalars
    for tag in ("loss", "grad_norm", "learning_rate", "skipped_steps"):
        logged = [(e.step, e.value) for e in events.Scalars(tag)]
        # TensorBoard stores float32: 2**-24 relative rounding of the JSON float64, no summation involved.
        assert logged == [(r["step"], pytest.approx(r[tag], rel=1e-6)) for r in records], tag
    assert [r["step"] for r in records] == [2, 4, 6]


def test_tensorboard_can_be_turned_off(devices, tmp_path):
    train(run_config(tmp_path, "train.steps=2", "run.tensorboard=false"), progress=False)
    assert not (tmp_path / "tensorboard").exists() and (tmp_path / "metrics.jsonl").exists()


@pytest.mark.parametrize("torch_first", [False, True])
def test_tensorboard_starts_without_importing_torch(tmp_path, torch_first):
    """tensorboardX's package imports torch where it is installed (the test extra has it): 1.2 s of
    every run's start-up. The hook leaves torch out, and one already imported stays as it was."""
    script = f"""
import sys
if {torch_first}:
    import torch
from jzero.training.hooks import TensorBoardHook
hook = TensorBoardHook(sys.argv[1])
hook.log({{"step": 3, "loss": 1.5}})
hook.close()
print("torch" in sys.modules, type(sys.modules.get("torch")).__name__)
"""
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, check=True).stdout
    assert out.split() == (["True", "module"] if torch_first else ["False", "NoneType"])
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(3, 1.5)]
