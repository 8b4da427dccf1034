"""Never save what isn't trained: a run whose steps stay non-finite stops past
``train.max_skipped_in_a_row`` (one line, exit status 4), a state whose loss was not finite is never
checkpointed (so ``checkpoint.keep`` never rotates the last good one out), and token ids past the
model's vocabulary are refused when the data opens, before anything is trained or written."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.cli import one_line_error, sets
from support.configs import CONFIG, TINY
from support.files import snapshot
from support.runs import cli_args, run_config
from support.tokens import copy_folder

from jzero.checkpoint.runs import CHECKPOINTS
from jzero.cli.main import main
from jzero.config.loading import ConfigError, load_config
from jzero.data.tokens import read_header
from jzero.distributed.process import DIVERGED
from jzero.errors import TooManySkipped
from jzero.training.data import TextBatches, train_data
from jzero.training.job import build_job
from jzero.training.loop import train

# gpt-tiny warms the rate up over 20 steps: step 1 applies nothing, step 2 a 5e28 rate, then NaN.
DIVERGING = ["train.steps=30", "optimizer.learning_rate=1e30", "checkpoint.every=10", "run.log_every=1"]
STOPPED = ("jzero: train.max_skipped_in_a_row=5: steps {first} to {last} had a non-finite gradient (6 in a row) "
           "and applied nothing; stopped at step {stopped}, with no untrained step saved")  # fmt: skip


def committed(run) -> list[str]:
    folder = run / CHECKPOINTS
    return sorted(p.name for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def test_a_learning_rate_of_1e30_stops_past_the_limit_with_one_line_and_status_4(devices, tmp_path, capsys):
    run = tmp_path / "run"
    code = main(["train", "--quiet", *cli_args(run, *DIVERGING, "train.max_skipped_in_a_row=5")])
    out, err = capsys.readouterr()
    assert code == DIVERGED == 4 and "Traceback" not in out + err
    # The steps from the run's records; the line that names them is the command's answer.
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    first = next(r["step"] for r in logged if r["skipped_steps"])
    # logged every step: six skipped in a row, and it stops at the step that passes the limit
    assert [(r["step"], r["skipped_steps"]) for r in logged if r["step"] >= first] == [(first + i, i + 1) for i in range(6)]
    stopped = logged[-1]["step"]
    lines = err.splitlines()
    assert lines[-1] == STOPPED.format(first=first, last=stopped, stopped=stopped), lines
    assert all(line.startswith("jzero: warning: step 10: the loss was not finite") for line in lines[:-1]), lines
    assert committed(run) == []  # steps 1 and 2 were finite, but no save was due before the NaN


def test_without_a_loss_scale_the_default_limit_stops_a_nan_run_within_a_few_steps(devices, tmp_path, capsys):
    """The issue's run (float32, no loss scale, the default limit): NaN from step 3 on. It stops at
    the first step it reads past 3 in a row (logged every step here: step 6), with status 4, having
    saved nothing, and never says it trained."""
    run = tmp_path / "run"
    code = main(["train", "--quiet", *cli_args(run, *DIVERGING)])
    out, err = capsys.readouterr()
    assert code == DIVERGED and "trained" not in out and "Traceback" not in out + err
    assert err.splitlines()[-1].startswith("jzero: train.max_skipped_in_a_row=3: steps 3 to 6 "), err
    assert committed(run) == []


def test_a_run_whose_last_step_is_not_finite_never_ends_as_trained(devices, tmp_path, capsys):
    """Under a limit it never reaches, the same run ends on step 30 unsaved, status 4, one line."""
    run = tmp_path / "run"
    code = main(["train", "--quiet", *cli_args(run, *DIVERGING, "train.max_skipped_in_a_row=100")])
    out, err = capsys.readouterr()
    assert code == DIVERGED and "trained" not in out and "Traceback" not in out + err
    assert err.splitlines()[-1] == ("jzero: the run ended on a non-finite step: steps 3 to 30 (28 in a row) had a non-finite "
                                    "loss or gradient (the last loss nan) and applied nothing; no untrained step saved"), err
    assert committed(run) == []


def test_the_end_of_a_run_is_judged_by_its_last_step():
    """A skipped last step ends a run with no loss scale, not one whose fp16 scale it only tunes; a
    non-finite last loss ends either."""
    from jzero.errors import EndedNonFinite
    from jzero.training.nonfinite import NonFiniteSteps

    for scales_loss, rows, ends in [
        (False, [(1.0, 0), (1.0, 1)], True),  # the gradient overflowed: nothing changes before the next batch
        (True, [(1.0, 0), (1.0, 1)], False),  # the scale halved: the next step can apply
        (True, [(1.0, 0), (np.inf, 1)], True),
        (False, [(1.0, 1), (1.0, 1)], False),  # skipped once, then trained
    ]:
        watch = NonFiniteSteps(limit=100, skipped=0, scales_loss=scales_loss)
        _steps(watch, rows)
        if ends:
            with pytest.raises(EndedNonFinite, match=r"^the run ended on a non-finite step: step 2 "):
                watch.finish()
        else:
            watch.finish()


def test_a_nan_run_resumed_from_a_good_checkpoint_keeps_it(devices, tmp_path, capsys):
    """Ids past the vocabulary (given as batches, past the check at open) make every step NaN.
    Resumed from a good step 4 with ``checkpoint.keep: 1``, the save due at 6 is refused, so step 4
    is never rotated out, and at step 8 (4 in a row, over 3) the run stops instead of saving."""
    run = tmp_path / "run"
    good = run_config(run, "train.steps=4", "checkpoint.keep=1", "checkpoint.every=4")
    train(good, progress=False)
    before = snapshot(run / CHECKPOINTS)
    config = run_config(run, "train.steps=20", "checkpoint.keep=1", "train.max_skipped_in_a_row=3", "run.log_every=1")
    tokens = train_data(config).tokens
    bad = TextBatches(np.full(len(tokens), config.model.vocab_size + 44, np.int32), config.model.seq_len,
                      config.train.global_batch_size, config.seed)  # fmt: skip
    with pytest.raises(TooManySkipped) as stop:
        train(config, progress=False, data=bad)
    assert (stop.value.first, stop.value.last) == (5, 8)
    assert committed(run) == ["4"] and snapshot(run / CHECKPOINTS) == before
    warnings = [line for line in capsys.readouterr().err.splitlines() if "not checkpointed" in line]
    assert warnings == ["jzero: warning: step 6: the loss was not finite at step 5; not checkpointed "
                        "(the newest checkpoint stays step 4)"]  # fmt: skip
    assert train(good, progress=False).start_step == 4  # it restores (nothing left to do: no compile)


@pytest.mark.parametrize("split, overrides", [("tokens.bin", []), ("eval.bin", ["train.eval_every=1"])])
def test_ids_past_the_vocabulary_are_refused_when_the_data_opens(corpus, tmp_path, capsys, split, overrides):  # noqa: F811
    folder = copy_folder(corpus, tmp_path)
    assert read_header(folder).vocab_size == 300
    ids = np.fromfile(folder / split, np.uint16)
    ids[len(ids) // 2] = 600  # past the model's 512, the file's size unchanged
    ids.tofile(folder / split)
    run = tmp_path / "run"
    argv = ["train", CONFIG, *sets(*TINY, f"data.tokens={folder}", "model.vocab_size=512", f"run.dir={run}", *overrides)]
    line = f"data.tokens: {folder / split} holds token id 600, not below model.vocab_size=512"
    one_line_error(capsys, [*argv, "--quiet"], line)
    assert not run.exists()


def test_the_limit_is_validated():
    with pytest.raises(ConfigError, match=r"^train.max_skipped_in_a_row: must be positive and at most 2147483647, got 0$"):
        load_config(None, ["train.max_skipped_in_a_row=0"])
    assert load_config(None, []).train.max_skipped_in_a_row is None  # jzero.training.nonfinite.skip_limit decides


def test_the_default_limit_is_32_with_a_loss_scale_and_3_without():
    from jzero.training.nonfinite import skip_limit

    assert (skip_limit(None, True), skip_limit(None, False), skip_limit(7, True), skip_limit(7, False)) == (32, 3, 7, 7)


def _steps(watch, rows):
    """Feed ``(loss, skipped so far)`` rows as steps 1, 2, ... on the device."""
    import jax.numpy as jnp

    for step, (loss, skipped) in enumerate(rows, start=1):
        watch.add(step, {"loss": jnp.float32(loss), "skipped": jnp.int32(skipped)})


def test_skipped_steps_count_in_a_row_only_while_the_count_grows():
    from jzero.training.nonfinite import NonFiniteSteps

    watch = NonFiniteSteps(limit=2, skipped=0)
    _steps(watch, [(1.0, 1), (np.nan, 2), (1.0, 2), (1.0, 3), (1.0, 4)])  # 2 in a row, then a step applied, then 2
    watch.look()
    assert watch.in_a_row == 2 and watch.skipped == 4 and watch.pending == []
    watch.add(6, {"loss": np.float32(np.inf), "skipped": np.int32(5)})
    stopped = r"^train\.max_skipped_in_a_row=2: steps 4 to 6 .* \(3 in a row\) .* stopped at step 6,"
    with pytest.raises(TooManySkipped, match=stopped):
        watch.look()


def test_a_save_point_names_the_first_non_finite_loss_since_the_last_and_starts_afresh():
    from jzero.training.nonfinite import NonFiniteSteps

    watch = NonFiniteSteps(limit=100, skipped=7)  # a resumed run: 7 skipped before it, none in a row
    _steps(watch, [(1.0, 7), (np.nan, 8), (np.inf, 9), (1.0, 9)])
    assert watch.save_point() == 2
    assert watch.save_point() is None  # nothing added since: fit to save
    watch.add(5, {"loss": np.float32(2.0), "skipped": np.int32(9)})
    assert watch.save_point() is None and watch.in_a_row == 0


def test_an_infinite_loss_alone_is_not_fit_to_save():
    """+Inf and -Inf are not finite either: a save point after either (and no NaN) names its step."""
    from jzero.training.nonfinite import NonFiniteSteps

    for bad in (np.inf, -np.inf):
        watch = NonFiniteSteps(limit=100, skipped=0)
        _steps(watch, [(1.0, 0), (bad, 1), (1.0, 1)])
        assert watch.save_point() == 2 and watch.skipped == 1


# +Inf without NaN: a loss whose gradient is +Inf at every parameter (and the loss itself +Inf, when
# asked) on the steps whose batch holds a row of MARK only (bytes of UTF-8 text never hold 0xFF).
MARK = 255


@jax.custom_vjp
def _infinite_gradient(x, on):
    """0 forward; +Inf at every element of ``x`` backward where ``on``, else 0: no NaN anywhere."""
    return jnp.zeros((), jnp.float32)


def _infinite_gradient_fwd(x, on):
    return jnp.zeros((), jnp.float32), (x, on)


def _infinite_gradient_bwd(residuals, _):
    x, on = residuals
    return jnp.full_like(x, jnp.where(on, jnp.inf, 0.0)), None


_infinite_gradient.defvjp(_infinite_gradient_fwd, _infinite_gradient_bwd)


def _infinite_on_marked_batches(loss_fn, *, loss_too: bool):
    def loss(params, batch):
        on = jnp.any(jnp.all(batch == MARK, axis=-1))
        poke = sum(_infinite_gradient(x, on) for x in jax.tree.leaves(params))
        return loss_fn(params, batch) + poke + (jnp.where(on, jnp.inf, 0.0) if loss_too else 0.0)

    return loss


class _MarkedBatches(TextBatches):
    """The config's batches, with every row of the 0-based steps in ``marked`` all MARK."""

    def __init__(self, data: TextBatches, marked: set[int]):
        super().__init__(data.tokens, data.seq_len, data.global_batch_size, data.seed, data.key)
        self.marked = marked

    def rows(self, step, start=0, stop=None):
        rows = super().rows(step, start, stop)
        return np.full_like(rows, MARK) if step in self.marked else rows


def test_an_infinite_gradient_without_nan_is_skipped_bit_identically(devices, tmp_path):
    """Stage 3: a finite loss whose gradient is +Inf (its norm +Inf, not NaN) applies nothing:
    parameters and optimizer state stay bit-identical, and the step is counted as skipped."""
    config = run_config(tmp_path / "run", "optimizer.learning_rate=1e-3")
    base = build_job(config)
    job = build_job(config, init_fn=base.init_fn, loss_fn=_infinite_on_marked_batches(base.loss_fn, loss_too=False))
    data = _MarkedBatches(train_data(config), {0})
    state = job.init_state()
    before = jax.device_get((state.params, state.opt_state))
    state, metrics = job.make_step()(state, data.device_batch(0, job.plan.batch))
    metrics = jax.device_get(metrics)
    assert np.isfinite(metrics["loss"]) and metrics["grad_norm"] == np.inf  # +Inf, no NaN
    assert int(metrics["skipped"]) == 1 and int(state.skipped) == 1
    after = jax.device_get((state.params, state.opt_state))
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
        np.testing.assert_array_equal(a, b)


def test_an_infinite_loss_step_is_skipped_and_never_saved(devices, tmp_path, capsys):
    """A 4-step run saving every 2 whose step 3 has a +Inf loss and +Inf gradients (no NaN): step 3
    is counted as skipped, and the save due at step 4 is refused (the newest checkpoint stays step 2)."""
    run = tmp_path / "run"
    config = run_config(run, "train.steps=4", "checkpoint.every=2", "run.log_every=1")
    base = build_job(config)
    job = build_job(config, init_fn=base.init_fn, loss_fn=_infinite_on_marked_batches(base.loss_fn, loss_too=True))
    result = train(config, progress=False, job=job, data=_MarkedBatches(train_data(config), {2}))  # step 3's batch
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["skipped_steps"]) for r in rows] == [(1, 0), (2, 0), (3, 1), (4, 1)]
    assert rows[2]["loss"] == np.inf and all(np.isfinite(r["loss"]) for r in rows[:2] + rows[3:])
    assert result.saved == [2] and committed(run) == ["2"]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "not checkpointed" in line]
    assert warnings == ["jzero: warning: step 4: the loss was not finite at step 3; not checkpointed "
                        "(the newest checkpoint stays step 2)"]  # fmt: skip
