"""The ``jzero`` command line: train, plan --json, and one-line errors with exit status 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.configs import TINY
from support.xla import own_devices_env

from jzero.cli.main import main
from jzero.config.loading import load_config
from jzero.ledger.render import format_plan
from jzero.ledger.report import CheckedPlanReport
from jzero.records import from_json

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs/gpt-tiny.yaml")


def _sets(*extra):
    return [arg for kv in [*TINY, *extra] for arg in ("--set", kv)]


def _one_line_error(capsys, argv, key):
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(main(argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    assert err.startswith(f"jzero: error: {key}") if key else err.startswith("jzero")
    return err


def test_train_writes_metrics_and_resolved_config(tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["train", CONFIG, *_sets("train.steps=4", "run.log_every=2", f"run.dir={run_dir}"), "--quiet"]
    assert main(argv) == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4]
    for r in records:
        assert {"step", "loss", "tokens_per_sec", "grad_norm"} <= set(r)
        assert r["loss"] > 0 and r["tokens_per_sec"] > 0
    resolved = load_config(run_dir / "config.yaml")
    assert resolved.train.steps == 4 and resolved.mesh.axes == {"data": 8, "model": 1}
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["run"]["dir"] == str(run_dir)

    # The same run again resumes at its last step and has nothing to do; with --no-resume it is
    # refused. Either way the first run's files are untouched.
    before = (run_dir / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    assert main(argv) == 0
    assert "trained steps 4 -> 4" in capsys.readouterr().out
    err = _one_line_error(capsys, [*argv, "--no-resume"], "--no-resume")
    assert "already holds a run" in err
    assert (run_dir / "metrics.jsonl").read_bytes() == before


def test_plan_json_contract(capsys):
    assert main(["plan", CONFIG, *_sets("zero.stage=3"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["devices"] == 8 and report["mesh"] == {"data": 8, "model": 1} and report["stage"] == 3
    assert report["num_params"] > 0
    for key in ("per_device_bytes", "ideal_per_device_bytes"):
        assert set(report[key]) == {"params", "grads", "optimizer", "total"}
    for part in ("params", "grads", "optimizer", "total"):
        assert report["per_device_bytes"][part] == pytest.approx(report["ideal_per_device_bytes"][part], rel=0.02)
    psi = report["num_params"]
    assert report["ideal_per_device_bytes"]["params"] == pytest.approx(4 * psi / 8, rel=1e-6)
    assert set(report["compiled"]) == {"argument", "output", "temp", "peak"}
    assert report["compiled"]["peak"] >= report["compiled"]["argument"] + report["compiled"]["temp"]
    assert report["flops_per_device"] > 0
    assert all(v > 0 for v in report["compiled"].values())
    assert report["collectives"]["all-gather"]["count"] > 0
    assert all(set(v) == {"count", "bytes", "dtypes", "async", "overlapped"} for v in report["collectives"].values())
    assert report["backend"] == "cpu" and report["device_kind"] == "cpu" and report["hosts"] == 1
    # The CPU program's collectives are synchronous, in f32 (this config's dtype).
    assert all(v["async"] == v["overlapped"] == 0 and v["dtypes"] == ["f32"] for v in report["collectives"].values())
    assert set(report["communication"]["by_dtype"]) == set(report["communication"]["bytes_per_step"])
    # The paper-style table: fp32 Adam is 4 + 4 + K=8 bytes per parameter, split per stage.
    table = report["paper_table"]
    assert (table["k"], table["param_bytes"], table["n_d"]) == (8.0, 4.0, 8)
    want = [16 * psi, 8 * psi + 8 * psi / 8, 4 * psi + 12 * psi / 8, 16 * psi / 8]
    assert [row["bytes"] for row in table["rows"]] == pytest.approx(want, rel=1e-4)


def test_plan_text_shows_specs_formula_and_collectives(capsys):
    assert main(["plan", CONFIG, *_sets("zero.stage=2")]) == 0
    out = capsys.readouterr().out
    assert "ZeRO stage 2 on mesh data=8 x model=1" in out
    assert "blocks/mlp_in/kernel" in out and "paper formula" in out
    assert "all-gather" in out and "temporaries" in out
    assert "the paper's table for this model" in out and "<- this plan" in out


@pytest.mark.parametrize(
    "extra, key",
    [
        (["zero.stage=4"], "zero.stage"),
        (["mesh.axes.data=3", "train.global_batch_size=24"], "mesh.axes"),
        (["mesh.axes.model=3"], "mesh.axes"),
        (["mesh.axes.data=-1", "mesh.axes.model=-1"], "mesh.axes"),
        (["model.nope=1"], "model.nope"),
        (["train.global_batch_size=20"], "train.global_batch_size"),
        (["data.path=/no/such/dir/*.txt"], "data.path"),
        (["train.steps=ten"], "train.steps"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, extra, key):
    run_dir = tmp_path / "run"
    _one_line_error(capsys, ["train", CONFIG, *_sets(*extra, f"run.dir={run_dir}")], key)
    assert not (run_dir / "metrics.jsonl").exists()


def test_missing_config_and_bad_flags(tmp_path, capsys):
    _one_line_error(capsys, ["train", str(tmp_path / "none.yaml")], "config")
    bad_mesh = tmp_path / "c.yaml"
    bad_mesh.write_text("mesh: nowhere.yaml\n")
    _one_line_error(capsys, ["plan", str(bad_mesh)], "mesh")
    for argv in (["train"], ["frobnicate"], ["plan", CONFIG, "--bogus"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_console_script_simulates_cpu_devices(tmp_path):
    """A fresh process with no device count in XLA_FLAGS gets runtime.cpu_devices simulated devices
    and, with no JAX_PLATFORMS either, prints nothing on stderr: with the gpu-target extra installed,
    JAX would log the CUDA plugin's failed check (a traceback) and its native code no-GPU notices."""
    from jzero.distributed.process import cuda_driver_present

    if cuda_driver_present():
        pytest.skip("this host has a CUDA driver: the case is a host without one")
    env = {k: v for k, v in own_devices_env().items() if k != "JAX_PLATFORMS"}  # the suite's compile speed only
    jzero = Path(sys.executable).with_name("jzero")
    cmd = [str(jzero)] if jzero.exists() else [sys.executable, "-m", "jzero.cli"]
    out = subprocess.run(
        [*cmd, "plan", CONFIG, *_sets("runtime.cpu_devices=4", "mesh.axes.data=-1", "zero.stage=1"), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    report = json.loads(out.stdout)
    assert report["devices"] == 4 and report["mesh"] == {"data": 4, "model": 1} and report["backend"] == "cpu"
    assert out.stderr == ""


def test_plan_all_stages_with_a_memory_verdict(devices, capsys):
    """--all-stages plans 0-3 in one run; each stage's bytes match the formula, fall with the stage,
    and the compiled peak is judged against --memory-per-device."""
    assert main(["plan", CONFIG, *_sets(), "--all-stages", "--json", "--memory-per-device", "1GB"]) == 0
    stages = json.loads(capsys.readouterr().out)["stages"]
    assert list(stages) == ["0", "1", "2", "3"]
    totals = [stages[s]["per_device_bytes"]["total"] for s in "0123"]
    assert totals == sorted(totals, reverse=True) and totals[3] == pytest.approx(totals[0] / 8, rel=0.02)
    for report in stages.values():
        assert report["per_device_bytes"]["total"] / report["ideal_per_device_bytes"]["total"] <= 1.02
        assert report["memory_per_device"] == 1e9 and report["fits"] is True
        assert report["largest"][0]["bytes"] >= report["largest"][-1]["bytes"]

    # One byte below stage 3's peak: the record's verdict, then that record as jzero plan prints it.
    peak = stages["3"]["compiled"]["peak"]
    assert main(["plan", CONFIG, *_sets(), "--json", "--memory-per-device", str(peak - 1)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["stage"] == 3 and report["compiled"]["peak"] == report["device_peak"] == peak
    assert report["memory_per_device"] == peak - 1 and report["fits"] is False
    text = format_plan(from_json(CheckedPlanReport, report))
    assert f"verdict: the compiled step does NOT fit in {(peak - 1) / 1e9:g} GB per device" in text
    assert "largest tensors (whole)" in text


def test_plan_flags_work_that_does_not_shrink_with_the_data_axis(devices, capsys):
    """With the batch's activations pinned replicated, every device computes the whole batch:
    the ledger flags FLOPs and temporaries that do not fall with N_d; the default rules are clean."""
    assert main(["plan", CONFIG, *_sets(), "--json"]) == 0
    clean = json.loads(capsys.readouterr().out)["scaling"]
    assert clean["flags"] == [] and clean["flops_ratio_to_predicted"] == pytest.approx(1.0, abs=0.05)
    replicated = "partitioning.rules=[[batch, null], [vocab, model], [heads, model], [mlp, model]]"
    assert main(["plan", CONFIG, *_sets(replicated), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    scaling = report["scaling"]
    ratio = scaling["flops_ratio_to_predicted"]
    assert scaling["batch_groups"] == 8 and ratio > 1.2
    flops_flag = f"per-device FLOPs are {ratio:.1f}x one batch group's / 8: work is replicated across data"
    assert flops_flag in scaling["flags"]
    # ...and jzero plan prints the flag (the record read back, as the text command renders it)
    assert f"FLAG: {flops_flag}" in format_plan(from_json(CheckedPlanReport, report)).splitlines()


def test_train_help_ends_with_two_examples_that_parse(capsys):
    with pytest.raises(SystemExit) as done:
        main(["train", "--help"])
    assert done.value.code == 0
    lines = capsys.readouterr().out.rstrip().splitlines()
    assert lines[-3] == "examples:"
    examples = [line.strip() for line in lines[-2:]]
    assert all(line.startswith("jzero train configs/") for line in examples)
    for line in examples:  # each names real config keys: loading it raises nothing
        words = line.split()[2:]
        load_config(words[0], [words[i + 1] for i, w in enumerate(words) if w == "--set"])


def test_version_names_jzero_and_its_stack(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"jzero {version('jzero')} (jax {version('jax')}, ") and "CUDA plugin: " in out


def test_verify_of_a_step_that_is_not_committed_is_one_line(tmp_path, capsys):
    (tmp_path / "checkpoints").mkdir()
    assert main(["checkpoint", "verify", str(tmp_path), "--step", "3"]) == 2
    assert capsys.readouterr().err.strip() == "jzero: error: --step: no committed checkpoint at step 3 (committed: none)"
    assert main(["checkpoint", "verify", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.strip() == f"jzero: error: {tmp_path / 'nothing'}: is not a run folder: no such folder"
    (tmp_path / "empty").mkdir()
    assert main(["checkpoint", "verify", str(tmp_path / "empty")]) == 2
    assert "holds no checkpoints" in capsys.readouterr().err
