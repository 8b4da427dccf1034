"""Multi-process jobs on localhost: ``jzero launch``, checkpoints across process counts, a dead peer,
preemption, elastic restart, and the bad inputs of all that. Every process is a real ``jax.distributed``
process with gloo collectives."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.configs import TINY, tiny_config
from support.reference import optax_tx, reference_with_floor

from jzero.checkpoint.catalog import describe
from jzero.checkpoint.runs import RunCheckpoints
from jzero.data.prepare import prepare
from jzero.distributed.launch import fit_problem, free_port, process_env, shrunk_count
from jzero.training.data import stdlib_sources, text_batches, train_data
from jzero.training.job import build_job

ROOT = Path(__file__).resolve().parents[2]
HELPER = ROOT / "tests" / "support" / "state_digest.py"
TINY_GPT = str(ROOT / "configs" / "gpt-tiny.yaml")
HEARTBEAT_S = 15  # the dead-peer bound these runs set; the issue asks for an exit within 60 s
# The dead-peer test's own, shorter bound: the survivor's collective spins a core until it passes
# (docs/design.md); heartbeats come more often than every 3 s (a 40-step job at 3 s lived).
DEAD_PEER_HEARTBEAT_S = 6
STEPS = 6


def _train_words(run_dir: Path, *overrides: str) -> list[str]:
    """``jzero train`` on the defaults plus the tests' tiny model (an empty config file)."""
    empty = run_dir.parent / "empty.yaml"
    empty.write_text("{}\n")
    sets = [*TINY, f"run.dir={run_dir}", "run.log_every=1", "run.tensorboard=false", f"train.steps={STEPS}"]
    sets += [f"runtime.heartbeat_timeout_s={HEARTBEAT_S}", *overrides]
    return ["train", str(empty), "--quiet", *[w for s in sets for w in ("--set", s)]]


def _launch_cmd(n, k, words, *flags):
    return [sys.executable, "-m", "jzero.cli", "launch", "-n", str(n), "--devices-per-process", str(k), *flags, "--", *words]


def _env():
    return {**os.environ, "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}


def _launch(n, k, words, *flags, timeout=240):
    return subprocess.run(_launch_cmd(n, k, words, *flags), capture_output=True, text=True, timeout=timeout, env=_env())


def _reference(steps, *overrides):
    """One device's plain optax run (:func:`optax_tx`) over the same batches (the config's data),
    with its reordering floor."""
    s = build_job(tiny_config("mesh.axes.data=1", *overrides), devices=jax.devices()[:1])
    data = train_data(s.config)
    batches = lambda k: jnp.asarray(data.global_batch(k))  # noqa: E731
    return s, reference_with_floor(s.init_fn, s.loss_fn, optax_tx(s.config), s.rng, batches, steps)


def _final_params(s, run_dir, step):
    restored = RunCheckpoints(run_dir).restore(step, s.abstract_state())
    return restored.state.params


@pytest.mark.parametrize("mesh,stage", [("dp8", 3), ("dp4-mp2", 1)])
def test_two_processes_train_like_one(tmp_path, devices, mesh, stage):
    """2 processes x 4 devices give one device's parameters, within the tolerance of the
    single-process equivalence tests; process 0 alone writes the run's files. Each mesh at one
    stage (the single-process tests take every stage on both): stage 3's gathers and reduce-scatters
    cross the processes on dp8, stage 1's partitioned optimizer beside tensor parallelism on
    dp4-mp2. On dp8 the data is a token folder: the processes read, each its own rows through the
    memory map, the sample order one process reads whole."""
    data = []
    if mesh == "dp8":
        tokens = tmp_path / "tokens"
        prepare([str(p) for p in stdlib_sources()[:12]], tokens, vocab_size=300, progress=False)
        data = [f"data.tokens={tokens}", "data.path=null", "model.vocab_size=300", "train.eval_every=3"]
    s, reference = _reference(STEPS, *data)
    axes = "mesh.axes={data: 8}" if mesh == "dp8" else "mesh.axes={data: 4, model: 2}"
    run = tmp_path / f"stage{stage}"
    done = _launch(2, 4, _train_words(run, axes, f"zero.stage={stage}", *data))
    assert done.returncode == 0, done.stderr[-3000:]
    reference.check(params=_final_params(s, run, STEPS))
    # Process 0 speaks for the job: one result line, and the ledger's per-process figures.
    (result,) = [line for line in done.stdout.splitlines() if "trained steps" in line]
    assert result.startswith(f"[0] trained steps 0 -> {STEPS}: loss ")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    if data:  # eval across the processes, each loading its own rows of the validation split
        assert [r["step"] for r in records if "eval_loss" in r] == [3, 6]
    ledger = json.loads((run / "ledger.json").read_text())
    processes = ledger["processes"]
    assert processes["count"] == 2 and processes["devices_per_process"] == 4
    planned = ledger["per_device_bytes"]["total"]
    assert processes["planned_model_state_bytes"] == {"per_process": 4 * planned, "global": 8 * planned}
    assert len(processes["live_bytes"]["per_process"]) == 2
    assert processes["live_bytes"]["global"] == sum(processes["live_bytes"]["per_process"])
    state_dir = run / "checkpoints" / str(STEPS) / "state"
    assert sorted(p.name for p in state_dir.glob("ocdbt.process_*")) == ["ocdbt.process_0", "ocdbt.process_1"]


def _spawn_job(n, args, timeout=240):
    """``n`` processes of the digest helper as one job, as jzero launch would start them."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(HELPER), *args], env=process_env(f"localhost:{port}", n, i, _env()), stderr=subprocess.PIPE
        )
        for i in range(n)
    ]
    try:
        errors = [p.communicate(timeout=timeout)[1].decode()[-2000:] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), errors


def _digest(state) -> dict[str, np.ndarray]:
    flat = jax.tree_util.tree_flatten_with_path(state)[0]
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in flat}


def _assert_identical(got: dict[str, np.ndarray], want_npz: Path) -> None:
    with np.load(want_npz) as want:
        assert sorted(got) == sorted(want.files)
        for name in want.files:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name, strict=True)


def test_checkpoints_restore_across_process_counts(tmp_path, devices):
    """Saved by 2 processes -> restored in 1; saved by 1 -> restored in 2: every leaf of the state
    bit-identical to what was saved. The 2-process save puts `replica` across the processes
    (`mesh.dcn`) and `data` inside each. (4 processes' checkpoint resumed by 2: the elastic restart.)"""
    base = [*TINY, "zero.stage=3", "mesh.axes={data: -1}"]
    two_saved, one_saved = tmp_path / "two", tmp_path / "one"
    dcn = ["mesh.axes={replica: 2, data: 4}", "mesh.dcn={replica: 2}"]
    _spawn_job(2, ["save", str(two_saved), "2", str(tmp_path / "two.npz"), *base, *dcn, "runtime.cpu_devices=4"])
    # Each replica group (a row of the mesh) lives in one process: only `replica` crosses processes.
    assert json.loads((tmp_path / "two.json").read_text())["grid_processes"] == [[0, 0, 0, 0], [1, 1, 1, 1]]

    # This process: 1 process x 8 devices. It restores the 2-process checkpoint onto dp4-mp2 at stage 1...
    s = build_job(tiny_config("zero.stage=1", "mesh.axes={data: 4, model: 2}"))
    _assert_identical(_digest(RunCheckpoints(two_saved).restore(2, s.abstract_state()).state), tmp_path / "two.npz")
    # ...and saves its own, which 2 processes restore onto dp4-mp2 at stage 1.
    own = build_job(tiny_config(*base[len(TINY) :]))
    data = text_batches(None, own.config.data.max_bytes, 16, 16, 0)
    state, step = own.init_state(), own.make_step()
    for k in range(2):
        state, _ = step(state, data.device_batch(k, own.plan.batch))
    saver = RunCheckpoints(one_saved)
    saver.save(2, state, data.state(2), {})
    saver.close()
    restores = [f"{one_saved}:2:{tmp_path / 'one-in-two.npz'}"]
    _spawn_job(2, ["restore", *restores, "--", *TINY, "zero.stage=1", "mesh.axes={data: 4, model: 2}", "runtime.cpu_devices=4"])
    _assert_identical(_digest(state), tmp_path / "one-in-two.npz")


class _Job:
    """A ``jzero launch`` in the background, its output collected, its processes' pids known."""

    def __init__(self, n, k, words, *flags):
        self.proc = subprocess.Popen(
            _launch_cmd(n, k, words, *flags), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()
        )
        self.err_lines: list[str] = []
        self.pids: list[int] = []
        for line in self.proc.stderr:
            self.err_lines.append(line)
            if (found := re.search(r"; pids ([\d ]+)$", line.rstrip())) is not None:
                self.pids = [int(p) for p in found.group(1).split()]
                break
        assert self.pids, "".join(self.err_lines)

    def wait_for_step(self, run_dir: Path, step: int, committed: int | None = None, timeout=180) -> None:
        """Until ``step`` is logged (and checkpoint ``committed`` is committed)."""
        deadline = time.monotonic() + timeout
        metrics = run_dir / "metrics.jsonl"
        while time.monotonic() < deadline:
            saved = committed is None or (run_dir / "checkpoints" / str(committed)).is_dir()
            if saved and metrics.exists() and len(metrics.read_text().splitlines()) >= step:
                return
            assert self.proc.poll() is None, f"the job ended before step {step}"
            time.sleep(0.1)
        raise AssertionError(f"no step {step} within {timeout}s")

    def finish(self, timeout=240) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, "".join(self.err_lines) + err


def test_a_dead_peer_ends_the_job_and_names_it(tmp_path, devices):
    run = tmp_path / "run"
    bound = f"runtime.heartbeat_timeout_s={DEAD_PEER_HEARTBEAT_S}"
    job = _Job(2, 4, _train_words(run, "train.steps=1000", "checkpoint.every=2", bound))
    job.wait_for_step(run, 3, committed=2)
    killed = time.monotonic()
    os.kill(job.pids[1], signal.SIGKILL)
    code, out, err = job.finish()
    assert time.monotonic() - killed < 60
    assert code != 0
    assert "[0] jzero: lost process 1 (no heartbeat for runtime.heartbeat_timeout_s)" in err, err[-3000:]
    assert "process 1 (pid" in err and "was killed by SIGKILL" in err
    assert "Traceback" not in err
    # The newest committed checkpoint restores; nothing half-written is taken for it.
    s = build_job(tiny_config())
    restored = RunCheckpoints(run).restore_latest(s.abstract_state())
    assert restored is not None and restored.step >= 2 and int(restored.state.step) == restored.step


def test_sigterm_to_one_process_saves_the_same_step_on_all_and_a_damaged_shard_sends_both_back(tmp_path, devices):
    """SIGTERM to process 1 of 2: both save the step they reached, each its own shards. Then one byte
    of a file of process 1's shards in that step is flipped, in a file whose checksum process 1 reads
    (the processes share the hashing). Relaunched, both processes set the step aside and resume from
    the one before: had they disagreed, their collectives would not meet. At stage 3, where each
    process holds its own part of the state: a replicated array this small is written whole by its
    first replica, on process 0 (jzero/checkpoint/slices.py)."""
    from jzero.checkpoint.integrity import MANIFEST

    run = tmp_path / "run"
    job = _Job(2, 4, _train_words(run, "train.steps=1000", "checkpoint.every=2", "zero.stage=3"))
    job.wait_for_step(run, 3, committed=2)
    os.kill(job.pids[1], signal.SIGTERM)
    code, out, err = job.finish()
    assert code == 0, err[-3000:]
    steps = sorted(int(p.name) for p in (run / "checkpoints").iterdir())
    assert [r.step for r in describe(run) if r.committed] == steps and len(steps) >= 2, steps
    saved = run / "checkpoints" / str(steps[-1])  # the newest: the preemption's save, beside the periodic ones
    assert f"[0] jzero: preempted by SIGTERM to process 1 after steps 0 -> {steps[-1]}; saved step {steps[-1]}" in out, out
    shards = sorted(p.name for p in (saved / "state").glob("ocdbt.process_*"))
    assert shards == ["ocdbt.process_0", "ocdbt.process_1"]

    names = sorted(json.loads((saved / MANIFEST).read_text())["files"])
    name = next(n for i, n in enumerate(names) if i % 2 == 1 and "ocdbt.process_1/d/" in n)
    raw = bytearray((saved / name).read_bytes())
    raw[len(raw) // 2] ^= 0x10
    (saved / name).write_bytes(bytes(raw))
    end = steps[-1] + 2
    again = _launch(2, 4, _train_words(run, "checkpoint.every=2", f"train.steps={end}", "zero.stage=3"))
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr[-3000:]
    assert f"checkpoint {saved} is damaged (a data file failed its checksum on process 1)" in again.stderr
    assert f"resumed from {run / 'checkpoints' / str(steps[-2])}" in again.stderr
    assert f"[0] trained steps {steps[-2]} -> {end}" in again.stdout
    assert len(list((run / "checkpoints").glob(f"{saved.name}.unreadable-*"))) == 1  # kept, once
    assert (run / "checkpoints" / str(end)).is_dir()


def test_elastic_restart_shrinks_and_matches_an_uninterrupted_run(tmp_path, devices):
    """SIGKILL one of 4 processes; --max-restarts 1 --shrink-on-failure finishes on 2 (the batch of
    16 does not split over 3 x 2 devices) from the newest checkpoint, and ends on one device's
    parameters, each step logged once."""
    steps = 8
    s, reference = _reference(steps)
    run = tmp_path / "run"
    words = _train_words(run, f"train.steps={steps}", "checkpoint.every=2", "mesh.axes={data: -1}", "zero.stage=3")
    job = _Job(4, 2, words, "--max-restarts", "1", "--shrink-on-failure")
    job.wait_for_step(run, 3, committed=2)
    os.kill(job.pids[2], signal.SIGKILL)
    code, out, err = job.finish(timeout=300)
    assert code == 0, err[-4000:]
    restart = re.search(r"jzero launch: restart 1 of 1: 2 processes x 2 devices, mesh data=4 x model=1 "
                        r"\(was 4 x 2, mesh data=8 x model=1\); resuming from step (\d+)", err)  # fmt: skip
    assert restart is not None, err[-4000:]
    assert f"[0] resumed from {run / 'checkpoints' / restart.group(1)}" in err
    reference.check(params=_final_params(s, run, steps))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    (last,) = [r for r in describe(run) if r.step == steps]
    assert (last.processes, last.devices, last.mesh) == (2, 4, {"data": 4, "model": 1})


def test_fit_and_shrink_rules():
    config = tiny_config("mesh.axes={data: -1}")  # global batch 16
    assert fit_problem(config, 4, 2) is None
    assert "not divisible" in fit_problem(config, 3, 2)
    assert shrunk_count(config, 4, 2) == 2
    fixed = tiny_config("mesh.axes={data: 4, model: 2}")
    assert "uses 8 of the 4 processes x 4 devices = 16" in fit_problem(fixed, 4, 4)
    assert shrunk_count(fixed, 4, 2) is None  # a fixed 8-device mesh has no smaller count


def _cli(*args, timeout=120):
    command = [sys.executable, "-m", "jzero.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=_env())


@pytest.mark.parametrize(
    "args, message",
    [
        (["-n", "0", "--", "train", TINY_GPT], "jzero: error: -n: must be at least 1 process, got 0"),
        (
            ["-n", "3", "--devices-per-process", "2", "--", "train", TINY_GPT],
            "jzero: error: mesh.axes: data=8 x model=1 = 8 devices does not divide the 6 available "
            "(3 processes x 2 devices = 6 launched)",
        ),
        (
            ["-n", "4", "--devices-per-process", "4", "--", "train", TINY_GPT, "--set", "mesh=mesh/dp4-mp2.yaml"],
            "jzero: error: mesh.axes: data=4 x model=2 uses 8 of the 4 processes x 4 devices = 16 devices launched; "
            "every process needs its part",
        ),
        (["-n", "2", "--", "estimate", "--params", "1B", "--devices", "8"], "jzero: error: launch: runs a jzero command"),
        (
            ["-n", "2", "--devices-per-process", "4", "--", "train", TINY_GPT, "--set", "runtime.distributed=off"],
            "jzero: error: runtime.distributed: must be auto under jzero launch",
        ),
        (["-n", "2", "--max-restarts", "-1", "--", "train", TINY_GPT], "jzero: error: --max-restarts: must be >= 0"),
    ],
)
def test_bad_launch_input_is_one_line(args, message):
    done = _cli("launch", *args)
    assert done.returncode == 2
    assert done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr
    assert done.stdout == ""


def test_an_unreachable_coordinator_fails_within_its_timeout():
    port = free_port()  # nothing serves it
    cluster = f"runtime.distributed={{coordinator: localhost:{port}, num_processes: 2, process_id: 1}}"
    started = time.monotonic()
    done = _cli("train", TINY_GPT, "--set", cluster, "--set", "runtime.initialization_timeout_s=3")
    took = time.monotonic() - started
    assert done.returncode == 2
    assert done.stderr.startswith(
        f"jzero: error: runtime.distributed.coordinator: localhost:{port} (runtime.distributed) did not answer within "
        "runtime.initialization_timeout_s=3s"
    ), done.stderr
    assert done.stderr.count("\n") == 1
    assert took < 30


def test_auto_finds_the_launchers_job_and_off_or_one_process_is_none(monkeypatch):
    from jzero.distributed.runtime import Cluster, find_cluster
    from jzero.errors import ConfigError

    for name in ("SLURM_JOB_ID", "OMPI_MCA_orte_hnp_uri", "KUBERNETES_SERVICE_HOST", "JAX_COORDINATOR_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    auto, off = tiny_config().runtime, tiny_config("runtime.distributed=off").runtime
    assert find_cluster(auto) is None  # no job around: one process
    for name, value in process_env("localhost:1234", 4, 3, {}).items():
        monkeypatch.setenv(name, value)
    assert find_cluster(auto) == Cluster("localhost:1234", 4, 3, source="jzero launch")
    assert find_cluster(off) is None
    explicit = tiny_config("runtime.distributed={coordinator: 'h:9', num_processes: 2, process_id: 1}").runtime
    assert find_cluster(explicit) == Cluster("h:9", 2, 1)  # the config wins over the environment
    monkeypatch.setenv("JZERO_NUM_PROCESSES", "1")
    monkeypatch.setenv("JZERO_PROCESS_ID", "0")
    assert find_cluster(auto) is None  # a job of one process is one process
    monkeypatch.setenv("JZERO_PROCESS_ID", "1")
    with pytest.raises(ConfigError, match=r"^JZERO_PROCESS_ID: must be in \[0, 0\] \(num_processes=1\), got 1$"):
        find_cluster(auto)
    monkeypatch.delenv("JZERO_COORDINATOR")
    with pytest.raises(ConfigError, match="^JZERO_COORDINATOR: is unset while"):
        find_cluster(auto)


def test_the_launcher_drops_only_the_runtimes_chatter():
    from jzero.distributed.launch import runtime_noise

    chatter = [
        b"[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1\n",
        b"[Gloo] Rank 0 is connected to [Gloo] Rank 1 is connected to 7 peer ranks. [Gloo] Rank 2[Gloo] Rank 3\n",  # threads
        b"7 peer ranks.  peer ranks. Expected number of connected peer ranks is : 7\n",
        b"W1129 20:35:40.095108 27332 coordination_service.cc:185] Using experimental recoverable task feature.\n",
    ]
    kept = [b"step 3  loss 5.2040  3,978 tok/s\n", b"Gloo AllGather failed: Connection closed by peer\n", b"\n"]
    assert all(runtime_noise(line) for line in chatter)
    assert not any(runtime_noise(line) for line in kept)
