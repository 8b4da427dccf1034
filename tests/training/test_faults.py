"""Faults and refusals around a run directory: restore racing a save, folders jzero did not write,
refusals before anything is written, metrics after a kill, and no library noise on any exit path.
Faults run as real subprocesses with real signals, and a real full disk where one can be mounted."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support.cli import jzero_cli, stderr_lines
from support.configs import ROOT, tiny_config
from support.disks import small_disk
from support.files import snapshot
from support.runs import cli_args, copy_run, host, jzero_process, run_config

from jzero.apps.sample import sample
from jzero.checkpoint.catalog import describe, verify_run
from jzero.checkpoint.export import export_checkpoint
from jzero.checkpoint.runs import CHECKPOINTS, RunCheckpoints
from jzero.cli.main import main
from jzero.training.job import build_job
from jzero.training.loop import train


def test_reading_a_run_while_it_rotates_never_reports_damage(devices, tmp_path):
    """A trainer saving every step and keeping one, while this process lists and verifies its
    checkpoints over and over, and exports and samples from the newest: a step deleted by the
    rotation meanwhile is left out or read afresh, never reported "damaged" or "written before
    manifests"."""
    proc = jzero_process(tmp_path, "train.steps=100000", "checkpoint.every=1", "checkpoint.keep=1")
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / CHECKPOINTS / "2").is_dir() and time.monotonic() < deadline:
            time.sleep(0.05)
        reads, seen = 0, set()
        while reads < 200 and time.monotonic() < deadline:
            verdicts = verify_run(tmp_path)
            assert all(isinstance(v, int) for _, v in verdicts), verdicts
            rows = describe(tmp_path)  # raises DamagedCheckpoint
            assert all(row.verified for row in rows if row.committed), rows
            if reads % 40 == 0:  # the readers that read tensors: they read the new newest instead
                export_checkpoint(tmp_path, tmp_path / f"params-{reads}.safetensors", warn=pytest.fail)
                sample(tmp_path, "a", max_tokens=2, warn=pytest.fail)
            reads, seen = reads + 1, seen | {s for s, _ in verdicts}
        assert reads == 200 and len(seen) >= 5, (reads, seen)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)


# ---------------------------------------------------------------------------------------------
# Restore never races a save


def test_save_then_restore_at_once_never_sets_anything_aside(devices, tmp_path):
    """The README's own-loop pattern with async saves (the default): save, then restore at once,
    20 rounds. Every restore waits for the write in flight and reads the step just saved."""
    s = build_job(tiny_config("zero.stage=3"))
    state = s.init_state()
    checkpoints = RunCheckpoints(tmp_path)
    warnings = []
    for step in range(1, 21):
        assert checkpoints.save(step, state)
        restored = checkpoints.restore_latest(s.abstract_state(), warn=warnings.append)
        assert restored.step == step and restored.skipped == []
        state = restored.state
    checkpoints.close()
    assert warnings == []
    assert sorted(p.name for p in (tmp_path / CHECKPOINTS).iterdir()) == ["18", "19", "20"]  # keep=3, nothing set aside
    for got, want in zip(host(state), host(s.init_state()), strict=True):
        assert np.array_equal(got, want)


def test_restore_of_a_step_being_written_waits_for_it(devices, tmp_path):
    s = build_job(tiny_config())
    checkpoints = RunCheckpoints(tmp_path)
    assert checkpoints.save(5, s.init_state())
    assert checkpoints.restore(5, s.abstract_state()).step == 5
    assert not any(".unreadable-" in p.name for p in (tmp_path / CHECKPOINTS).iterdir())
    checkpoints.close()


# ---------------------------------------------------------------------------------------------
# Folders jzero did not write


def test_step_folders_jzero_did_not_write_are_refused_and_left_alone(devices, tmp_path, capsys):
    run = tmp_path / "theirs"
    for step in (1, 3, 5, 7):
        (run / CHECKPOINTS / str(step)).mkdir(parents=True)
        (run / CHECKPOINTS / str(step) / "weights.bin").write_bytes(b"not jzero's " * step)
    before = snapshot(run)
    code = main(["train", "--quiet", *cli_args(run)])
    err = stderr_lines(capsys.readouterr().err)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"jzero: error: {(run / CHECKPOINTS / '7').absolute()}: was not written by jzero")
    assert snapshot(run) == before  # nothing renamed, nothing added (no config.yaml either)


# ---------------------------------------------------------------------------------------------
# Every refusal comes before anything is written or drawn


@pytest.mark.parametrize(
    "change, key",
    [
        ("train.global_batch_size=32", "train.global_batch_size"),
        ("seed=1", "seed"),
        ("model.d_model=64", "checkpoints/2"),
        ("data.max_bytes=100000", "data.path"),
    ],
)
def test_a_refused_resume_is_one_line_and_changes_nothing(devices, two_steps, tmp_path, capsys, change, key):
    copy_run(two_steps, tmp_path)
    before = snapshot(tmp_path)
    capsys.readouterr()
    code = main(["train", *cli_args(tmp_path, "train.steps=4", change)])  # with the progress bar
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(stderr_lines(err)) == 1, err
    assert err.startswith("jzero: error: ") and key in err.splitlines()[0]
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "damage, what",
    [(lambda p: (p.unlink(), p.mkdir()), "is a directory, not a YAML file"),
     (lambda p: p.write_bytes(b"\xff\xfe"), "is not UTF-8 text (byte 0xff at offset 0)")],
    ids=["a-folder", "not-utf8"],
)  # fmt: skip
def test_an_unreadable_config_yaml_on_resume_is_one_line_and_changes_nothing(devices, two_steps, tmp_path, capsys, damage, what):
    """The run's own config.yaml (a resume compares it with its own config) that cannot be read: one
    line naming it (config files' own reader, tests/cli/test_bad_input.py), exit 2, nothing written."""
    copy_run(two_steps, tmp_path)
    damage(tmp_path / "config.yaml")
    before = snapshot(tmp_path)
    capsys.readouterr()
    code = main(["train", "--quiet", *cli_args(tmp_path, "train.steps=4")])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(stderr_lines(err)) == 1, err
    assert err == f"jzero: error: run.dir: {tmp_path / 'config.yaml'} {what}\n"
    assert snapshot(tmp_path) == before and (tmp_path / "config.yaml").exists()


def test_missing_init_from_writes_no_run_dir(devices, tmp_path, capsys):
    run, missing = tmp_path / "run", tmp_path / "nope.safetensors"
    code = main(["train", *cli_args(run, f"train.init_from={missing}")])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and stderr_lines(err) == [f"jzero: error: train.init_from: {missing} does not exist"]
    assert not run.exists()


def test_run_dir_under_a_file_is_one_line(devices, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    code = main(["train", "--quiet", *cli_args(tmp_path / "notes.txt" / "run")])
    err = stderr_lines(capsys.readouterr().err)
    assert code == 2 and err == [f"jzero: error: run.dir: {tmp_path / 'notes.txt'} is a file, not a folder"]
    assert (tmp_path / "notes.txt").read_text() == "mine"


# ---------------------------------------------------------------------------------------------
# metrics.jsonl after a kill


@pytest.mark.parametrize(
    "case, expected",
    [
        ("a-file", "is a file, not a run folder"),
        ("dangling", "is not a run folder: it is a symbolic link to {gone}, which does not exist"),
    ],
)
def test_readers_say_what_a_run_path_is(tmp_path, capsys, case, expected):
    """A run path that is a file, or a link to nothing, is named as such by checkpoint info and
    sample (they read "holds no checkpoints (RUN/checkpoints does not exist)", as if a run folder
    had lost them, and "no such folder")."""
    run = tmp_path / "run"
    run.write_text("") if case == "a-file" else run.symlink_to(tmp_path / "gone")
    for command in (["checkpoint", "info", str(run)], ["sample", str(run), "--prompt", "a"]):
        assert main(command) == 2
        assert capsys.readouterr().err.strip() == f"jzero: error: {run}: " + expected.format(gone=tmp_path / "gone")


def test_metrics_hold_one_row_per_step_after_a_kill_and_a_resume(devices, tmp_path):
    steps = ["train.steps=40", "run.log_every=1", "checkpoint.every=4"]
    metrics, folder = tmp_path / "metrics.jsonl", tmp_path / CHECKPOINTS
    proc = jzero_process(tmp_path, *steps)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:  # kill once rows past a commit are logged
        committed = max((int(p.name) for p in folder.iterdir() if p.name.isdigit()), default=0) if folder.is_dir() else 0
        if committed and len(metrics.read_text().splitlines()) >= committed + 2:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    logged = [json.loads(line)["step"] for line in metrics.read_text().splitlines() if line.endswith("}")]
    committed = max(r.step for r in describe(tmp_path) if r.committed)
    assert max(logged) > committed, (logged, committed)  # steps past the checkpoint were logged
    with open(metrics, "a") as f:
        f.write('{"step": 99, "lo')  # and a line torn by the kill
    result = train(run_config(tmp_path, *steps), progress=False)
    assert result.start_step == committed
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == list(range(1, 41))


# ---------------------------------------------------------------------------------------------
# No library noise on any exit path


def damage(step_dir: Path, how: str) -> None:
    state = step_dir / "state"
    if how == "truncate-all-data":  # the case that printed thousands of tracebacks
        for f in state.rglob("d/*"):
            os.truncate(f, 100)
    elif how == "truncate-index":
        for f in (state / "d").iterdir():
            os.truncate(f, 20)
    elif how == "truncate-manifest":
        os.truncate(state / "manifest.ocdbt", 5)


@pytest.mark.parametrize("how", ["truncate-all-data", "truncate-index", "truncate-manifest"])
def test_resume_past_a_damaged_checkpoint_is_quiet(devices, four_steps, tmp_path, how):
    copy_run(four_steps, tmp_path)
    damage(tmp_path / CHECKPOINTS / "4", how)
    done = jzero_cli("train", "--quiet", *cli_args(tmp_path, "train.steps=6"))
    err = stderr_lines(done.stderr)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and len(err) <= 3, err
    assert err[0].startswith(f"jzero: warning: checkpoint {tmp_path / CHECKPOINTS / '4'} is damaged (state/")
    assert f"resumed from {tmp_path / CHECKPOINTS / '2'}" in err[1]


@pytest.mark.parametrize("how", ["truncate-index", "truncate-manifest", "truncate-all-data"])
def test_export_of_a_damaged_checkpoint_is_one_line(devices, two_steps, tmp_path, how):
    copy_run(two_steps, tmp_path)
    damage(tmp_path / CHECKPOINTS / "2", how)
    done = jzero_cli("checkpoint", "export", str(tmp_path), "--out", str(tmp_path / "p.safetensors"))
    assert done.returncode == 2 and len(stderr_lines(done.stderr)) == 1, done.stderr[-3000:]
    assert done.stderr.startswith(f"jzero: error: {tmp_path / CHECKPOINTS / '2'}")
    assert not (tmp_path / "p.safetensors").exists()


@pytest.mark.parametrize("size", ["300k", "8k"])
def test_a_full_disk_is_one_line(devices, tmp_path, size):
    """The run dir on a small tmpfs. 300 KiB: config, ledger and metrics fit, the first checkpoint
    does not. 8 KiB: the config fits, the start-up ledger does not."""
    with small_disk(tmp_path / "disk", size) as disk:
        run = disk / "run"
        done = jzero_cli("train", "--quiet", *cli_args(run, "train.steps=4"))
        err = stderr_lines(done.stderr)
        assert done.returncode == 1 and len(err) == 1, done.stderr[-3000:]
        if size == "300k":
            assert err[0].startswith(f"jzero: checkpoint: writing step 2 to {(run / CHECKPOINTS / '2').absolute()} failed")
            assert "RESOURCE_EXHAUSTED" in err[0] or "No space left" in err[0]
        else:
            assert err[0] == f"jzero: writing {run / 'ledger.json'} failed: No space left on device"
        assert not (run / CHECKPOINTS).exists() or not [r for r in describe(run) if r.committed]


def test_a_disk_that_fills_while_resumed_is_one_line_and_a_rerun_recovers(devices, tmp_path):
    """A resumed run on a disk with 48 KiB left: its logs fill it. One line from the loop's thread
    (tensorboardX's own writer thread printed a traceback here), exit 1, the committed step
    untouched; once the disk has room again the rerun resumes and logs each step once."""
    with small_disk(tmp_path / "disk", "40m") as disk:
        run = disk / "run"
        train(run_config(run, "train.steps=2", "run.log_every=1"), progress=False)
        committed = snapshot(run / CHECKPOINTS / "2")
        fill = disk / "fill"
        fill.write_bytes(b"\0" * (os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize - (48 << 10)))
        done = jzero_cli("train", "--quiet", *cli_args(run, "train.steps=100000", "checkpoint.every=0", "run.log_every=1"))
        err = stderr_lines(done.stderr)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
        logs = (run / "metrics.jsonl", run / "tensorboard")
        assert err[-1] in (f"jzero: writing {log} failed: No space left on device" for log in logs), err
        assert len(err) <= 2 and snapshot(run / CHECKPOINTS / "2") == committed, done.stderr[-3000:]
        fill.unlink()
        again = jzero_cli("train", "--quiet", *cli_args(run, "train.steps=6", "run.log_every=1"))
        assert again.returncode == 0, again.stderr[-3000:]
        steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert steps == list(range(1, 7)), steps


TENSORBOARD_ON_A_FULL_DISK = """
import sys
import threading
from jzero.errors import OutputWriteError
from jzero.training.hooks import TensorBoardHook

hook = TensorBoardHook(sys.argv[1])
try:
    for step in range(1 << 20):
        hook.log({"step": step, "loss": 1.0})
except OutputWriteError as err:
    print(err, file=sys.stderr)
assert threading.enumerate() == [threading.main_thread()], threading.enumerate()  # no writer thread
try:
    hook.close()
except OutputWriteError:
    pass
"""


def test_tensorboard_on_a_full_disk_fails_in_the_callers_thread(tmp_path):
    """The TensorBoard hook on a 64 KiB disk: the caller gets the failure, and no thread of its own
    can print a traceback (tensorboardX's writer thread did, at exit: ``OSError: handle is closed``)."""
    with small_disk(tmp_path / "disk", "64k") as disk:
        script = [sys.executable, "-c", TENSORBOARD_ON_A_FULL_DISK, str(disk / "tb")]
        done = subprocess.run(script, capture_output=True, text=True, timeout=300)
    want = [f"writing {disk / 'tb'} failed: No space left on device"]
    assert done.returncode == 0 and stderr_lines(done.stderr) == want, done.stderr[-3000:]


def test_sigterm_before_the_first_step_says_nothing_was_saved(devices, tmp_path):
    """SIGTERM while the step compiles: the run stops at its first step boundary and says it saved
    nothing (it said "after steps 0 -> 0 to DIR", as if it had)."""
    args = [sys.executable, "-m", "jzero.cli", "train", *cli_args(tmp_path, "train.steps=50")]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip())
        if line.startswith("compiling the train step"):
            proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, lines
    want = "jzero: preempted by SIGTERM before its first step; nothing was saved (there is no checkpoint)"
    assert want in lines and lines[-1] == "next: run the same command again to start the run", lines
    assert not (tmp_path / CHECKPOINTS).exists() or not list((tmp_path / CHECKPOINTS).iterdir())


def test_a_run_dir_the_system_refuses_is_the_machines_fault_and_a_dangling_link_the_inputs(devices, tmp_path, capsys):
    """A read-only file system: one line, exit 1 (it was an Orbax traceback). A symbolic link to
    nothing: exit 2, naming the link (the system's word for it was "File exists")."""
    with small_disk(tmp_path / "disk", "1m") as disk:
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        done = jzero_cli("train", "--quiet", *cli_args(disk / "run", "train.steps=2"))
        assert done.returncode == 1, done.stderr[-3000:]
        assert stderr_lines(done.stderr) == [f"jzero: run.dir: cannot create {disk / 'run'}: Read-only file system"]
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "gone" / "run")
    assert main(["train", "--quiet", *cli_args(link, "train.steps=2")]) == 2
    err = capsys.readouterr().err.strip()
    gone = tmp_path / "gone" / "run"
    assert err == f"jzero: error: run.dir: cannot create {link}: {link} is a symbolic link to {gone}, which does not exist"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disk", "link"]


def _wait_for_jax(proc: subprocess.Popen) -> None:
    """Until ``proc`` has loaded jaxlib (so the command's own SIGINT handler is in place), or ended."""
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if "jaxlib" in Path(f"/proc/{proc.pid}/maps").read_text():
                return
        time.sleep(0.01)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "sigkill"])
def test_export_stopped_at_random_moments_leaves_nothing_partial(devices, two_steps, tmp_path, sig):
    """``jzero checkpoint export`` sent SIGINT or SIGKILL at three random moments once JAX has
    loaded: ``--out`` is either absent or the whole file, byte for byte; Ctrl-C also removes the
    hidden temporary."""
    run = copy_run(two_steps, tmp_path / "run")
    whole = tmp_path / "whole.safetensors"
    export_checkpoint(run, whole, warn=pytest.fail)
    rng = np.random.default_rng(sig)
    for trial in range(3):
        out = tmp_path / f"t{trial}" / "params.safetensors"
        out.parent.mkdir()
        args = [sys.executable, "-m", "jzero.cli", "checkpoint", "export", str(run), "--out", str(out)]
        proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_for_jax(proc)  # Ctrl-C during Python's own start-up is tests/cli/test_bad_input.py's case
        time.sleep(rng.uniform(0.0, 2.0))
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        assert not out.exists() or out.read_bytes() == whole.read_bytes(), trial
        if sig == signal.SIGINT:
            assert proc.returncode in (0, 130) and "Traceback" not in err, err[-3000:]
            assert [p.name for p in out.parent.iterdir()] == ([out.name] if out.exists() else []), trial
    assert main(["checkpoint", "export", str(run), "--out", str(tmp_path / "again.safetensors")]) == 0
    assert (tmp_path / "again.safetensors").read_bytes() == whole.read_bytes()


def test_two_ctrl_cs_abort_quietly_and_keep_the_last_commit(devices, tmp_path):
    """The first SIGINT asks for a save; a second one right after aborts it. One notice, one line
    for the abort, exit 130, no traceback; every committed step still reads back."""
    proc = jzero_process(tmp_path, "train.steps=100000", "checkpoint.every=2", "run.log_every=1")
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3) and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and stderr_lines(err)[-1] == "jzero: interrupted", err[-3000:]
    assert len(stderr_lines(err)) <= 2, err[-3000:]
    s = build_job(run_config(tmp_path))
    checkpoints = RunCheckpoints(tmp_path, read_only=True)
    for step in checkpoints.steps():
        assert int(checkpoints.restore(step, s.abstract_state()).state.step) == step
    checkpoints.close()


# A command whose work is done gets Ctrl-C while Python shuts down (an atexit callback sends it).
LATE_CTRL_C = """
import atexit, os, signal, sys
sys.argv = ["jzero", "--version"]
from jzero.cli.program import run
atexit.register(lambda: os.kill(os.getpid(), signal.SIGINT))
sys.exit(run())
"""


def test_ctrl_c_after_the_command_is_done_changes_nothing():
    """Its exit status and output stand: no 'interrupted', no death by the signal (Python restores
    SIGINT's default action while it shuts down; a finished export died so, status -2)."""
    done = subprocess.run([sys.executable, "-c", LATE_CTRL_C], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert (done.returncode, done.stderr) == (0, ""), (done.returncode, done.stderr[-2000:])
    assert done.stdout.startswith("jzero ")
