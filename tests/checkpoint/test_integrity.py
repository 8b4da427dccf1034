"""Checkpoints verify their own bytes: each kind of damage, ten times over, gives the same answer.

A run with checkpoints at steps 2 and 4 is trained once; each case copies it, damages step 4 as
the seed says (which file, where, how much), and asks every reader: ``verify`` names step 4,
``info`` and ``export`` give one line and exit 2, ``export --step 2`` still works, and a resume
sets step 4 aside (kept, renamed) and restores step 2. The seeds pick different files and offsets,
so a reader that only sometimes notices (as TensorStore's decompression did) fails some case.
"""

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from support.cli import jzero_cli, stderr_lines
from support.files import snapshot
from support.runs import cli_args, host, run_config

from jzero.checkpoint.integrity import MANIFEST, DamagedCheckpoint, Unverified, verify, write_manifest
from jzero.checkpoint.runs import RunCheckpoints
from jzero.checkpoint.verify import verify_step
from jzero.cli.main import main
from jzero.config.run_folder import CHECKPOINTS
from jzero.config.schema import CheckpointConfig
from jzero.training.job import build_job
from jzero.training.loop import train

KINDS = ("truncate-a-data-file", "flip-a-byte", "delete-a-file", "truncate-_METADATA")
SEEDS = range(10)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, devices):
    run = tmp_path_factory.mktemp("pristine")
    train(run_config(run, "train.steps=4", "run.tensorboard=false"), progress=False)
    return run


@pytest.fixture(scope="module")
def job(pristine):
    """The run's job, built once: a job does not depend on ``run.dir``, so it serves every run of
    ``run_config`` here (the pristine run, its copies, the runs tests write themselves)."""
    return build_job(run_config(pristine))


@pytest.fixture(scope="module")
def target(job):
    """The run's abstract state, to restore onto (the same for every copy of the run)."""
    return job.abstract_state()


def manifest_files(step_dir: Path) -> list[str]:
    return sorted(json.loads((step_dir / MANIFEST).read_text())["files"])


def damage(step_dir: Path, kind: str, seed: int) -> str:
    """Damage one file of ``step_dir`` as ``kind`` and ``seed`` say; returns its path in the step."""
    rng = random.Random(seed)
    data_files = [name for name in manifest_files(step_dir) if "/d/" in name or name.startswith("state/d/")]
    name = {
        "truncate-a-data-file": rng.choice(data_files),
        "flip-a-byte": rng.choice(data_files),
        "delete-a-file": rng.choice(manifest_files(step_dir)),
        "truncate-_METADATA": "state/_METADATA",
    }[kind]
    path = step_dir / name
    size = path.stat().st_size
    if kind == "flip-a-byte":
        raw = bytearray(path.read_bytes())
        raw[rng.randrange(size)] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(raw))
    elif kind == "delete-a-file":
        path.unlink()
    else:
        with open(path, "r+b") as f:
            f.truncate(rng.randrange(size))
    return name


def one_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", KINDS)
def test_every_reader_gives_the_documented_answer(pristine, target, tmp_path, capsys, kind, seed):
    run = tmp_path / "run"
    shutil.copytree(pristine, run)
    step4 = run / CHECKPOINTS / "4"
    name = damage(step4, kind, seed)
    capsys.readouterr()

    assert main(["checkpoint", "verify", str(run)]) == 2
    out = capsys.readouterr()
    assert out.out.splitlines()[0].startswith("step 2: ok, ") and out.out.splitlines()[1].startswith(f"step 4: damaged: {name} ")
    assert out.err.strip() == f"jzero: error: {run}: damaged checkpoint steps: 4"

    for argv in (["checkpoint", "info", str(run)], ["checkpoint", "export", str(run), "--out", str(tmp_path / "p.st")]):
        assert main(argv) == 2
        assert one_line(capsys).startswith(f"jzero: error: {step4}: checkpoint step 4 is damaged: {name} "), argv
    assert not (tmp_path / "p.st").exists()  # never exported silently
    assert main(["checkpoint", "export", str(run), "--step", "2", "--out", str(tmp_path / "p2.st")]) == 0
    assert (tmp_path / "p2.st").stat().st_size > 0

    before = snapshot(run / CHECKPOINTS / "2")
    warnings = []
    restored = RunCheckpoints(run).restore_latest(target, warn=warnings.append)
    assert restored.step == 2 and [step for step, _ in restored.skipped] == [4]
    assert len(warnings) == 1 and warnings[0].startswith(f"jzero: warning: checkpoint {step4} is damaged ({name} ")
    (aside,) = (run / CHECKPOINTS).glob("4.unreadable-*")  # kept, renamed
    assert warnings[0].endswith(f"moved to {aside.name}, trying the previous one")
    assert snapshot(run / CHECKPOINTS / "2") == before  # the intact step is untouched


@pytest.mark.parametrize("kind", ["flip-a-byte", "delete-a-file"])
def test_jzero_train_resumes_past_the_damage_in_three_lines(pristine, tmp_path, kind):
    """The command line end to end: exit 0, no traceback, at most 3 stderr lines, resumed from step 2.
    (Truncations: ``test_faults.test_resume_past_a_damaged_checkpoint_is_quiet``.)"""

    run = tmp_path / "run"
    shutil.copytree(pristine, run)
    damage(run / CHECKPOINTS / "4", kind, seed=0)
    done = jzero_cli("train", "--quiet", *cli_args(run, "train.steps=6", "run.tensorboard=false"))
    err = stderr_lines(done.stderr)
    assert done.returncode == 0 and "Traceback" not in done.stderr and len(err) <= 3, done.stderr[-3000:]
    assert err[0].startswith(f"jzero: warning: checkpoint {run / CHECKPOINTS / '4'} is damaged (")
    assert f"resumed from {run / CHECKPOINTS / '2'}" in err[1]
    assert "trained steps 2 -> 6" in done.stdout
    assert isinstance(verify(run / CHECKPOINTS / "6", expect_manifest=True), int)  # the new step is sealed too


def test_the_manifest_commits_with_the_step_sync_or_async(devices, job, tmp_path):
    state = job.init_state()
    for mode in (True, False):
        checkpoints = RunCheckpoints(tmp_path / str(mode), CheckpointConfig(every=1, keep=2, async_=mode))
        checkpoints.save(1, state)
        if not mode:  # a sync save returns committed, manifest and all
            assert (checkpoints.step_dir(1) / MANIFEST).exists()
        checkpoints.close()
        step_dir = checkpoints.step_dir(1)
        files = manifest_files(step_dir)
        assert "state/_METADATA" in files and "meta/metadata" in files and any("/d/" in f for f in files)
        assert not any(name.endswith(".orbax-checkpoint-tmp") for name in files)
        assert verify(step_dir) == sum((step_dir / name).stat().st_size for name in files)


def test_checkpoints_from_before_manifests_restore_with_one_line(devices, target, tmp_path, capsys):
    """An older jzero wrote no manifest and no ``manifest`` key in meta: read, and said so once."""
    train(run_config(tmp_path, "train.steps=2", "run.tensorboard=false"), progress=False)
    step_dir = tmp_path / CHECKPOINTS / "2"
    (step_dir / MANIFEST).unlink()
    meta = json.loads((step_dir / "meta" / "metadata").read_text())
    del meta["manifest"]
    (step_dir / "meta" / "metadata").write_text(json.dumps(meta))
    assert isinstance(verify(step_dir), Unverified)
    unverified = f"jzero: warning: checkpoint {step_dir} has no {MANIFEST} (written before jzero verified checkpoints)"
    said = []
    assert isinstance(verify_step(step_dir, said.append), Unverified)  # meta promised none: not damage, one line
    assert said == [f"{unverified}; read unverified"]

    warnings = []
    restored = RunCheckpoints(tmp_path).restore_latest(target, warn=warnings.append)
    assert restored.step == 2 and restored.skipped == []
    assert warnings == [f"{unverified}; read unverified"]
    capsys.readouterr()
    assert main(["checkpoint", "verify", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("step 2: not verifiable: no manifest")
    assert main(["checkpoint", "info", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["verified"] is False
    assert main(["checkpoint", "export", str(tmp_path), "--out", str(tmp_path / "p.st")]) == 0
    assert one_line(capsys).startswith(f"jzero: warning: checkpoint {step_dir} has no {MANIFEST}")


def test_a_missing_manifest_where_meta_promised_one_is_damage(pristine, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(pristine, run)
    (run / CHECKPOINTS / "4" / MANIFEST).unlink()
    with pytest.raises(DamagedCheckpoint, match=f"checkpoint step 4 is damaged: {MANIFEST} is missing"):
        verify(run / CHECKPOINTS / "4", expect_manifest=True)
    with pytest.raises(DamagedCheckpoint, match=f"checkpoint step 4 is damaged: {MANIFEST} is missing"):
        verify_step(run / CHECKPOINTS / "4")  # its meta says it was written with one
    assert main(["checkpoint", "verify", str(run)]) == 2


def test_processes_share_the_hashing_and_sizes_are_checked_by_all(pristine, tmp_path):
    """``part=(k, n)``: each file's checksum is read by one of n processes; a resized file by all."""
    step_dir = tmp_path / "4"
    shutil.copytree(pristine / CHECKPOINTS / "4", step_dir)
    names = manifest_files(step_dir)
    hashed = [verify(step_dir, part=(k, 3)) for k in range(3)]
    assert sum(hashed) == verify(step_dir)
    flipped = step_dir / names[4]
    raw = bytearray(flipped.read_bytes())
    raw[0] ^= 0xFF
    flipped.write_bytes(bytes(raw))
    found = []
    for k in range(3):
        try:
            verify(step_dir, part=(k, 3))
        except DamagedCheckpoint as err:
            found.append((k, err.file))
    assert found == [(4 % 3, names[4])]  # only the process that hashes it
    with open(flipped, "r+b") as f:
        f.truncate(1)
    for k in range(3):
        with pytest.raises(DamagedCheckpoint, match="bytes, .* when written"):
            verify(step_dir, part=(k, 3))


def test_a_rewritten_manifest_matches_and_restores_the_same_state(pristine, target, tmp_path):
    """Writing the manifest again over a committed step changes nothing, and the state reads back."""
    run = tmp_path / "run"
    shutil.copytree(pristine, run)
    step_dir = run / CHECKPOINTS / "4"
    before = (step_dir / MANIFEST).read_text()
    write_manifest(step_dir)
    assert json.loads((step_dir / MANIFEST).read_text()) == json.loads(before)
    a = RunCheckpoints(pristine).restore(4, target).state
    b = RunCheckpoints(run).restore(4, target).state
    for x, y in zip(host(a), host(b), strict=True):
        assert np.array_equal(x, y)
