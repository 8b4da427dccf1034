"""Orbax checkpoints: kill and resume bit-identically, restore onto other meshes and stages,
preemption, corruption fallback, failed writes, export and init_from."""

import json
import os
import random
import signal
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.configs import LR, tiny_config
from support.reference import optax_tx, reference_with_floor
from support.runs import cli_args, copy_run, host, jzero_process, run_config, shared_job

from jzero.checkpoint.catalog import describe
from jzero.checkpoint.export import restore_numpy
from jzero.checkpoint.runs import CHECKPOINTS, CheckpointWriteError, RunCheckpoints
from jzero.cli.main import main
from jzero.config.loading import ConfigError
from jzero.errors import CheckpointError
from jzero.training.data import text_batches
from jzero.training.job import build_job
from jzero.training.loop import train


def saved_state(run_dir, step):
    """Every array of a checkpoint's train state, as host arrays."""
    state_dir = Path(run_dir) / CHECKPOINTS / str(step) / "state"
    return restore_numpy(state_dir)


def assert_bit_identical(got: dict, want: dict):
    assert sorted(got) == sorted(want)
    for path in want:
        assert got[path].dtype == want[path].dtype and np.array_equal(got[path], want[path]), path


# ---------------------------------------------------------------------------------------------
# Kill, preempt, resume


def test_sigkill_at_random_moments_then_resume_is_bit_identical(devices, tmp_path):
    """Three SIGKILLs, two while a save is in flight and one at a random moment after the run has
    committed a new checkpoint; every rerun resumes from the latest committed step. The final
    state equals an uninterrupted run's bit for bit."""
    steps = ["train.steps=16"]
    train(run_config(tmp_path / "reference", *steps), progress=False)

    run = tmp_path / "killed"
    folder = run / CHECKPOINTS

    def committed():
        return {int(p.name) for p in folder.iterdir() if p.name.isdigit()} if folder.is_dir() else set()

    def in_flight():
        return {p.name for p in folder.iterdir() if not p.name.isdigit()} if folder.is_dir() else set()

    rng = random.Random(0)
    mid_save = 0
    for kind in ["save", "random", "save"]:
        before, writing = committed(), in_flight()
        proc = jzero_process(run, *steps)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if kind == "save" and in_flight() - writing:
                break
            if kind == "random" and committed() - before:
                time.sleep(rng.uniform(0, 0.3))
                break
            time.sleep(0.0005)
        assert proc.poll() is None, f"the run ended before it was killed: {proc.communicate()[1][-500:]}"
        mid_save += bool(in_flight())
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert mid_save >= 2, "no kill landed during a save"
    resumed_from = max(committed())
    proc = jzero_process(run, *steps)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert f"resumed from {folder / str(resumed_from)}" in err
    assert f"trained steps {resumed_from} -> 16" in out
    assert_bit_identical(saved_state(run, 16), saved_state(tmp_path / "reference", 16))


def test_sigterm_saves_at_the_step_boundary_and_exits_0(devices, tmp_path):
    proc = jzero_process(tmp_path, "train.steps=100000", "checkpoint.every=0")
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert "SIGTERM: saving at the next step boundary" in err
    (step,) = [r.step for r in describe(tmp_path) if r.committed]  # the one save: the preemption's
    assert step >= 4 and f"preempted by SIGTERM after steps 0 -> {step}; saved step {step}" in out
    result = train(run_config(tmp_path, f"train.steps={step + 2}"), progress=False)
    assert (result.start_step, result.final_step) == (step, step + 2)


def test_a_second_sigint_aborts_at_once(capsys):
    """The first SIGINT asks for a save at the step boundary; the second raises at once. Outside
    the context the previous handlers are back."""
    from jzero.training.preemption import Preemption

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), Preemption() as preemption:
        os.kill(os.getpid(), signal.SIGINT)
        assert preemption.signal == "SIGINT" and preemption.requested()
        os.kill(os.getpid(), signal.SIGTERM)  # ignored: a save is already asked for
        assert preemption.signal == "SIGINT"
        os.kill(os.getpid(), signal.SIGINT)
        pytest.fail("the second SIGINT did not abort")
    assert signal.getsignal(signal.SIGINT) is before
    assert "SIGINT: saving at the next step boundary" in capsys.readouterr().err


def test_two_sigints_that_arrive_together_abort(capsys):
    """Two Ctrl-Cs while the main thread is inside native code (a JAX step) reach Python as one
    handler call; they still abort. The main thread blocks SIGINT, so both are delivered to a helper
    thread, each before its pthread_kill returns: Python runs the handler once, when unblocked."""
    import threading

    from jzero.training.preemption import Preemption

    go = threading.Event()

    def press_twice():
        go.wait()
        for _ in range(2):
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    helper = threading.Thread(target=press_twice)
    helper.start()  # before the mask, so the helper does not inherit it
    with pytest.raises(KeyboardInterrupt), Preemption() as preemption:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            go.set()
            helper.join()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        pytest.fail(f"two SIGINTs at once did not abort (signal {preemption.signal})")
    assert capsys.readouterr().err.count("SIGINT: saving at the next step boundary") == 1


def test_no_resume_refuses_a_run_with_checkpoints(devices, two_steps, tmp_path, capsys):
    copy_run(two_steps, tmp_path)
    before = sorted(p.name for p in (tmp_path / CHECKPOINTS).iterdir())
    code = main(["train", "--quiet", "--no-resume", *cli_args(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("jzero: error: --no-resume: ") and "already holds a run" in err
    assert len(err.splitlines()) == 1
    assert sorted(p.name for p in (tmp_path / CHECKPOINTS).iterdir()) == before


def test_finished_run_has_nothing_to_do(devices, two_steps, tmp_path):
    copy_run(two_steps, tmp_path)
    result = train(run_config(tmp_path, "train.steps=2"), progress=False)
    assert (result.start_step, result.final_step, result.saved) == (2, 2, [])


# ---------------------------------------------------------------------------------------------
# Resharding


def test_restore_onto_other_meshes_and_stages_is_bit_exact(devices, tmp_path):
    """dp8 stage 3 -> data 4 x model 2 stage 1 -> 1 device stage 0, each read straight into the
    target shardings; then one more step on 1 device equals the dp8 stage-3 run's next step."""
    data = text_batches(None, 200_000, 16, 16, 0)
    chain = [
        ([], None),
        (["mesh.axes.data=4", "mesh.axes.model=2", "zero.stage=1"], None),
        (["mesh.axes.data=1", "zero.stage=0"], jax.devices()[:1]),
    ]
    first = shared_job(LR, "zero.stage=3")
    state = first.init_state()
    step = first.make_step()
    for k in range(3):
        state, _ = step(state, data.device_batch(k, first.plan.batch))
    want = host(state)
    meta = {"mesh": {"data": 8}, "stage": 3}
    for i, (overrides, devs) in enumerate(chain[1:], start=1):
        ckpts = RunCheckpoints(tmp_path / str(i - 1))
        assert ckpts.save(3, state, data.state(3), meta)
        ckpts.wait()
        s = build_job(tiny_config(LR, *overrides), devices=devs)
        restored = ckpts.restore(3, s.abstract_state())
        for leaf, sharding in zip(jax.tree.leaves(restored.state), jax.tree.leaves(s.plan.state), strict=True):
            assert leaf.sharding == sharding
        for got, expected in zip(host(restored.state), want, strict=True):
            assert got.dtype == expected.dtype and np.array_equal(got, expected)
        state = restored.state
    start = jax.device_get((state.params, state.opt_state))  # the step below donates state
    after_one_device, _ = s.make_step()(state, data.device_batch(3, s.plan.batch))
    original = shared_job(LR, "zero.stage=3")  # the first job again: its step is traced once
    ckpts = RunCheckpoints(tmp_path / "0")
    restored = ckpts.restore(3, original.abstract_state()).state
    after_dp8, _ = original.make_step()(restored, data.device_batch(3, original.plan.batch))
    # Both equal one-device optax (the config's optimizer from optax alone) from the restored state,
    # within 10x its reordering floor.
    batch = lambda k: jnp.asarray(data.global_batch(3))  # noqa: E731
    reference = reference_with_floor(None, s.loss_fn, optax_tx(s.config), None, batch, 1, start=start)
    for after in (after_one_device, after_dp8):
        reference.check(params=after.params, opt_state=after.opt_state)


def test_resume_with_other_shapes_lists_the_paths(devices, two_steps, tmp_path, capsys):
    copy_run(two_steps, tmp_path)
    code = main(["train", "--quiet", *cli_args(tmp_path, "model.d_model=64")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"jzero: error: {tmp_path / CHECKPOINTS / '2'}: the model's shapes differ")
    assert "params/blocks/attn_out/kernel: shape [2, 32, 32] in the checkpoint, [2, 64, 64] now" in err[0]
    assert err[0].endswith(f"and 53 more; to train LoRA adapters or other parameters from these weights, use a new "
                           f"run.dir with train.init_from={tmp_path / CHECKPOINTS / '2'}")


def test_a_lora_asked_of_a_runs_own_folder_says_to_start_a_new_run_from_it(devices, two_steps, tmp_path, capsys):
    """The hint is what works: the same LoRA in a new run.dir, from the step the refusal names."""
    copy_run(two_steps, tmp_path / "run")
    lora = ["lora.rank=2", "train.steps=3"]
    assert main(["train", "--quiet", *cli_args(tmp_path / "run", *lora)]) == 2
    err = capsys.readouterr().err.strip()
    assert "lora_a: missing from the checkpoint" in err and "use a new run.dir with train.init_from=" in err, err
    init_from = err.rsplit("train.init_from=", 1)[1]
    assert main(["train", "--quiet", *cli_args(tmp_path / "lora", *lora, f"train.init_from={init_from}")]) == 0


def test_resume_with_another_batch_size_is_refused(devices, two_steps, tmp_path):
    copy_run(two_steps, tmp_path)
    with pytest.raises(ConfigError, match="train.global_batch_size: the checkpoint's sample order"):
        train(run_config(tmp_path, "train.steps=4", "train.global_batch_size=32"), progress=False)


# ---------------------------------------------------------------------------------------------
# Failures


@pytest.mark.parametrize("damage", ["truncate", "remove"])
def test_corrupted_latest_checkpoint_falls_back_to_the_previous(devices, four_steps, tmp_path, capsys, damage):
    copy_run(four_steps, tmp_path)
    files = sorted((tmp_path / CHECKPOINTS / "4" / "state").rglob("d/*"), key=lambda p: p.stat().st_size)
    if damage == "truncate":
        with open(files[-1], "r+b") as f:
            f.truncate(100)
    else:
        files[-1].unlink()
    capsys.readouterr()
    result = train(run_config(tmp_path, "train.steps=6"), progress=False)
    err = capsys.readouterr().err
    assert f"checkpoint {tmp_path / CHECKPOINTS / '4'} is damaged (state/" in err and "trying the previous one" in err
    assert (result.start_step, result.final_step) == (2, 6)


def test_no_readable_checkpoint_is_a_clear_error(devices, tmp_path):
    train(run_config(tmp_path, "train.steps=2", "checkpoint.keep=1"), progress=False)
    (tmp_path / CHECKPOINTS / "2" / "state" / "_METADATA").unlink()
    with pytest.raises(CheckpointError, match="no committed checkpoint could be read"):
        train(run_config(tmp_path, "train.steps=4"), progress=False)


def test_failed_async_write_is_raised_in_the_main_thread(devices, tmp_path, monkeypatch, capsys):
    from orbax.checkpoint._src.handlers import json_checkpoint_handler

    async def disk_full(self, x, directory):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(json_checkpoint_handler.JsonCheckpointHandler, "_save_fn", disk_full)
    with pytest.raises(CheckpointWriteError, match="writing step 2 to .* failed: OSError: .*No space left on device"):
        train(run_config(tmp_path / "a", "train.steps=6"), progress=False)
    code = main(["train", "--quiet", *cli_args(tmp_path / "b")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1].startswith("jzero: checkpoint: writing step 2") and "No space left" in err[-1]
    assert describe(tmp_path / "b") == [] or not any(r.committed for r in describe(tmp_path / "b"))


def test_python_api_in_a_users_own_loop(devices, tmp_path):
    """``jzero.RunCheckpoints`` in a loop that is not jzero's: save, then restore onto another stage."""
    import jzero

    s = shared_job("zero.stage=3")
    state = s.init_state()
    checkpoints = jzero.RunCheckpoints(tmp_path)
    assert checkpoints.save(7, state)
    checkpoints.close()
    stage1 = jzero.make_plan(s.abstract, s.mesh, stage=1)
    restored = jzero.RunCheckpoints(tmp_path).restore_latest(jzero.sharded_abstract(s.abstract, stage1))
    assert restored.step == 7
    for got, want in zip(host(restored.state), host(state), strict=True):
        assert np.array_equal(got, want)
    assert [x.sharding for x in jax.tree.leaves(restored.state)] == jax.tree.leaves(stage1.state)


def test_non_finite_state_is_never_checkpointed(devices, tmp_path):
    s = build_job(tiny_config())
    state = s.init_state()
    bad = state.replace(params=jax.tree.map(lambda x: x * np.nan, state.params))
    ckpts = RunCheckpoints(tmp_path)
    assert ckpts.save(1, bad, {}, {}) is False
    assert ckpts.save(2, state, {}, {}) is True
    ckpts.close()
    assert ckpts.steps() == [2]


# ---------------------------------------------------------------------------------------------
# Info, export, plain Orbax, init_from


def test_info_lists_steps_mesh_stage_size_and_commit(devices, four_steps, tmp_path, capsys):
    copy_run(four_steps, tmp_path)
    (tmp_path / CHECKPOINTS / "6.orbax-checkpoint-tmp").mkdir()  # a save that never finished
    assert main(["checkpoint", "info", str(tmp_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["step"], r["committed"]) for r in rows] == [(2, True), (4, True), (6, False)]
    assert rows[0]["mesh"] == {"data": 8, "model": 1} and rows[0]["stage"] == 3 and rows[0]["bytes"] > 100_000
    assert main(["checkpoint", "info", str(tmp_path)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].split()[:5] == ["2", "yes", "yes", "3", "8"] and table[3].split()[:3] == ["6", "no", "-"]
    assert [r["verified"] for r in rows] == [True, True, None]
    assert main(["checkpoint", "info", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.strip() == f"jzero: error: {tmp_path / 'nothing'}: is not a run folder: no such folder"
    (tmp_path / "empty").mkdir()
    assert main(["checkpoint", "info", str(tmp_path / "empty")]) == 2
    assert "holds no checkpoints" in capsys.readouterr().err


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_export_equals_the_live_parameters(devices, four_steps, tmp_path, capsys, precision):
    """With bf16 params the export is the fp32 master (zero_to_fp32's job)."""
    from safetensors.numpy import load_file

    bf16 = [f"precision.param_dtype={precision}"]
    if precision == "float32":  # the default: the shared run is this run (its config resolves the same)
        copy_run(four_steps, tmp_path)
    else:
        train(run_config(tmp_path, "train.steps=4", *bf16), progress=False)
    s = build_job(run_config(tmp_path, *bf16))
    live = RunCheckpoints(tmp_path).restore(4, s.abstract_state()).state
    source = live.opt_state.master if precision == "bfloat16" else live.params
    out = tmp_path / "model.safetensors"
    assert main(["checkpoint", "export", str(tmp_path), "--out", str(out)]) == 0
    assert f"exported step 4 ({'opt_state/master' if precision == 'bfloat16' else 'params'})" in capsys.readouterr().out
    exported = load_file(out)
    want = {t.path: np.asarray(x) for t, x in zip(s.plan.tensors, jax.tree.leaves(source), strict=True)}
    assert sorted(exported) == sorted(want)
    for name, value in want.items():
        assert exported[name].dtype == np.float32 and np.array_equal(exported[name], value), name
    assert main(["checkpoint", "export", str(tmp_path), "--out", str(out)]) == 2  # never overwritten
    assert "exists; not overwritten" in capsys.readouterr().err
    assert main(["checkpoint", "export", str(tmp_path), "--step", "3", "--out", str(tmp_path / "x.safetensors")]) == 2
    assert "--step: no committed checkpoint at step 3 (committed: 2, 4)" in capsys.readouterr().err
    assert not (tmp_path / "x.safetensors").exists()


def test_export_of_a_damaged_checkpoint_writes_nothing(devices, two_steps, tmp_path, capsys):
    copy_run(two_steps, tmp_path)
    for data_file in (tmp_path / CHECKPOINTS / "2" / "state").rglob("d/*"):
        with open(data_file, "r+b") as f:
            f.truncate(100)
    out = tmp_path / "model.safetensors"
    assert main(["checkpoint", "export", str(tmp_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"jzero: error: {tmp_path / CHECKPOINTS / '2'}: checkpoint step 2 is damaged: ")
    assert list(tmp_path.glob("model.safetensors*")) == []


def test_export_bfloat16_loads_with_safetensors(devices, two_steps, tmp_path):
    from safetensors.flax import load_file

    copy_run(two_steps, tmp_path)
    out = tmp_path / "half.safetensors"
    assert main(["checkpoint", "export", str(tmp_path), "--out", str(out), "--dtype", "bfloat16"]) == 0
    half = load_file(str(out))
    full = saved_state(tmp_path, 2)
    for name, value in half.items():
        assert value.dtype == jax.numpy.bfloat16
        np.testing.assert_array_equal(np.asarray(value), full["params/" + name].astype(jax.numpy.bfloat16))


def test_plain_orbax_reads_a_checkpoint(devices, two_steps, tmp_path):
    """The README's snippet: no jzero, only orbax-checkpoint."""
    copy_run(two_steps, tmp_path)
    import orbax.checkpoint as ocp

    path = (tmp_path / "checkpoints" / "2" / "state").absolute()
    ckptr = ocp.PyTreeCheckpointer()
    tree = ckptr.metadata(path).item_metadata.tree
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    state = ckptr.restore(path, args=ocp.args.PyTreeRestore(restore_args=restore_args))
    assert state["params"]["lm_head"]["kernel"].shape == (32, 256)
    assert int(state["step"]) == 2
    assert_bit_identical(
        {k: v for k, v in saved_state(tmp_path, 2).items()},
        {"/".join(map(str, k)): np.asarray(v) for k, v in _flatten(state).items()},
    )


def _flatten(tree, prefix=()):
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _flatten(sub, (*prefix, key)).items()}
    if isinstance(tree, list):
        return {k: v for i, sub in enumerate(tree) for k, v in _flatten(sub, (*prefix, i)).items()}
    return {} if tree is None else {prefix: tree}


@pytest.mark.parametrize("form", ["safetensors", "msgpack", "orbax"])
def test_init_from_exported_or_plain_flax_params(devices, two_steps, tmp_path, form):
    from flax import serialization

    copy_run(two_steps, tmp_path / "a")
    params = {k.removeprefix("params/"): v for k, v in saved_state(tmp_path / "a", 2).items() if k.startswith("params/")}
    nested = {}
    for path, value in params.items():
        node = nested
        *parents, leaf = path.split("/")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    if form == "safetensors":
        source = tmp_path / "p.safetensors"
        assert main(["checkpoint", "export", str(tmp_path / "a"), "--out", str(source)]) == 0
    elif form == "msgpack":
        source = tmp_path / "p.msgpack"
        source.write_bytes(serialization.to_bytes({"params": nested}))
    else:
        import orbax.checkpoint as ocp

        source = (tmp_path / "orbax_params").absolute()
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(source, nested)
        checkpointer.wait_until_finished()
    s = build_job(run_config(tmp_path / "b", f"train.init_from={source}"))
    from jzero.training.loop import initial_state

    state, start = initial_state(s, RunCheckpoints(tmp_path / "b"), text_batches(None, 200_000, 16, 16, 0), lambda _: None)
    assert start == 0 and int(state.step) == 0
    for t, leaf in zip(s.plan.tensors, jax.tree.leaves(state.params), strict=True):
        assert np.array_equal(np.asarray(leaf), params[t.path]), t.path
        assert leaf.sharding.spec == t.param_spec


def test_init_from_with_wrong_shapes_is_refused(devices, two_steps, tmp_path, capsys):
    copy_run(two_steps, tmp_path / "a")
    out = tmp_path / "p.safetensors"
    assert main(["checkpoint", "export", str(tmp_path / "a"), "--out", str(out)]) == 0
    code = main(["train", "--quiet", *cli_args(tmp_path / "b", f"train.init_from={out}", "model.n_layers=3")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith(f"jzero: error: train.init_from: {out} does not fit the model: ")
    assert "blocks/attn_out/kernel: shape [2, 32, 32], the model has [3, 32, 32]" in err[0]
    assert os.path.exists(out)
