"""One writer per run folder: a second ``jzero train`` on a folder in use is one line and exit 2,
and touches nothing; a SIGKILLed holder blocks no rerun; readers never take the lock. The holders
are real ``jzero train`` processes: a lock held by a process is what the kernel releases."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.configs import ROOT
from support.files import snapshot
from support.runs import cli_args, jzero_process, run_config

from jzero.checkpoint.runs import CHECKPOINTS
from jzero.cli.main import main
from jzero.config.run_folder import RunDir, RunLock, writer_may_be_live
from jzero.errors import ConfigError
from jzero.training.hooks import Hook
from jzero.training.loop import train

STEPS = "train.steps=8"  # RUN saves every 2 steps and logs every 4


def refusal(run: Path, pid: int) -> str:
    return (f"run.dir: {run} is being written by another jzero train (pid {pid} on host {socket.gethostname()}); "
            "wait for it to end, or choose another run.dir")  # fmt: skip


def wait_for_checkpoint(process: subprocess.Popen, run: Path) -> None:
    """Until ``process`` has committed a step (it holds the lock from before its first write)."""
    deadline = time.monotonic() + 120
    while not any(p.name.isdigit() for p in (run / CHECKPOINTS).glob("*")):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no checkpoint within 120 s"
        time.sleep(0.1)


def pause(process: subprocess.Popen) -> None:
    """SIGSTOP ``process`` and wait until it is stopped: the signal lands asynchronously, and a write
    it was making could otherwise finish after the caller looks (measured: a snapshot taken at once
    missed part of an in-flight save under load)."""
    process.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, "the process did not stop within 30 s"
        time.sleep(0.01)


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_second_trainer_is_refused_and_the_first_ends_intact(devices, tmp_path, capsys):
    """The first trainer is paused (SIGSTOP) once it has committed a step, so the second surely
    meets it mid-run: one line naming its pid and host, exit 2, nothing touched. Readers work
    meanwhile. The first then ends with each step logged once and every checkpoint verified."""
    run = tmp_path / "run"
    first = jzero_process(run, STEPS)
    try:
        wait_for_checkpoint(first, run)
        pause(first)
        before = snapshot(run)
        second = subprocess.Popen([sys.executable, "-m", "jzero.cli", "train", "--quiet", *cli_args(run, STEPS)],
                                  cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        out, err = second.communicate(timeout=120)
        assert second.returncode == 2 and out == ""
        assert err.splitlines() == [f"jzero: error: {refusal(run, first.pid)}"]
        for reader in (["checkpoint", "info", str(run)], ["checkpoint", "verify", str(run)]):
            assert main(reader) == 0, capsys.readouterr().err
        assert snapshot(run) == before  # neither the second trainer nor the readers changed a byte
        with pytest.raises(ConfigError, match="being written by another jzero train"):
            RunLock(run).acquire()  # still held after all that
    finally:
        first.send_signal(signal.SIGCONT)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert not RunDir(run).lock.exists()  # removed when the holder lets go
    assert [r["step"] for r in records(run)] == [4, 8]
    assert sorted(os.listdir(run / CHECKPOINTS)) == ["4", "6", "8"]  # keep: 3
    assert main(["checkpoint", "verify", str(run)]) == 0, capsys.readouterr().err


HOLD = ("import sys, time; from jzero.config.run_folder import RunLock; "
        "RunLock(sys.argv[1]).acquire(); print(flush=True); time.sleep(99)")


def test_a_sigkilled_holder_blocks_no_rerun(devices, tmp_path):
    """A process holding the lock (no JAX: it starts in a blink) refuses the run; SIGKILLed, it
    leaves its lock file behind, and the rerun takes it."""
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "\n"  # held
    with pytest.raises(ConfigError) as err:
        train(run_config(run, "train.steps=2"), progress=False)
    assert str(err.value) == refusal(run, holder.pid)
    holder.kill()
    holder.wait()
    assert RunDir(run).lock.exists()  # left behind, no longer held
    result = train(run_config(run, "train.steps=2"), progress=False)
    assert result.final_step == 2 and result.saved == [2]
    assert not RunDir(run).lock.exists()


class TrainAgain(Hook):
    """At step 1, a second :func:`train` on the same folder from inside the first."""

    def __init__(self, config):
        self.config, self.refused = config, None

    def step(self, step, state):
        if step == 1:
            try:
                train(self.config, progress=False)
            except ConfigError as err:
                self.refused = str(err)


def test_a_second_train_in_the_same_process_is_refused(devices, tmp_path):
    run = tmp_path / "run"
    config = run_config(run, "train.steps=2")
    again = TrainAgain(config)
    result = train(config, progress=False, hooks=[again])
    assert again.refused == refusal(run, os.getpid())
    assert result.final_step == 2 and result.saved == [2]
    assert not RunDir(run).lock.exists()


def test_a_refused_run_leaves_no_folder_and_no_lock(devices, tmp_path):
    """Locking creates ``run.dir``; a run refused after that (here: an ``init_from`` that is not
    there) removes what it made."""
    run = tmp_path / "new" / "run"
    with pytest.raises(ConfigError, match="train.init_from"):
        train(run_config(run, "train.steps=2", f"train.init_from={tmp_path / 'missing.safetensors'}"), progress=False)
    assert not (tmp_path / "new").exists()


def test_a_reader_tells_a_live_writer_from_a_dead_ones_lock_file(tmp_path):
    """Readers wait for a rotating step to vanish only while a trainer may be writing: a lock file
    naming an ended process of this host (left by a SIGKILL) is not one; one not yet named, or
    another host's, may be."""
    here = socket.gethostname()
    assert not writer_may_be_live(tmp_path)
    with RunLock(tmp_path).acquire():
        assert writer_may_be_live(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for text, live in [(f"pid {dead.stdout.strip()} on host {here}\n", False), ("", True), ("pid 1 on host elsewhere\n", True)]:
        RunDir(tmp_path).lock.write_text(text)
        assert writer_may_be_live(tmp_path) is live, text
