"""``compiler.xla_options``: merged over jzero's defaults and ``XLA_FLAGS`` (defaults < XLA_FLAGS <
config), shown by ``jzero plan``, taking effect in the compiled program, and a bad flag from either
place refused in one line with exit status 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import keyed_error
from support.configs import BF16, TINY, tiny_config

from jzero.cli.main import main
from jzero.compiler.options import GPU_COMPILER_OPTIONS, SLOP_FACTOR, compiler_options, xla_options
from jzero.ledger.targets import GPUS, scheduler_slop_factor

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs/gpt-tiny.yaml")
GATHER = "xla_gpu_all_gather_combine_threshold_bytes"


def _sets(*extra):
    return [arg for kv in [*TINY, *extra] for arg in ("--set", kv)]


def test_defaults_then_xla_flags_then_the_config(monkeypatch, h100x8, devices):
    """A flag XLA_FLAGS sets drops jzero's default (XLA has it already, so it is not given again);
    the config's value wins over both, and CPU compiles get the config's options too."""
    monkeypatch.setenv("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 --{GATHER}=0 --xla_dump_to=/tmp/d")
    mine = {"xla_gpu_enable_latency_hiding_scheduler": False}
    effect = xla_options(h100x8, options=mine)
    assert effect[GATHER] == {"value": "0", "from": "XLA_FLAGS"}
    assert effect["xla_dump_to"]["from"] == "XLA_FLAGS" and "xla_force_host_platform_device_count" not in effect
    assert effect["xla_gpu_enable_latency_hiding_scheduler"] == {"value": False, "from": "compiler.xla_options"}
    assert effect["xla_gpu_all_reduce_combine_threshold_bytes"]["from"] == "jzero"
    slop = scheduler_slop_factor(GPUS["h100"], 0)
    given = compiler_options(h100x8, options=mine, slop_factor=slop)
    assert given == {k: v for k, v in {**GPU_COMPILER_OPTIONS, SLOP_FACTOR: slop, **mine}.items() if k != GATHER}
    monkeypatch.setenv("XLA_FLAGS", f"--{GATHER}=0")
    assert compiler_options(h100x8, options={GATHER: 7})[GATHER] == 7
    assert compiler_options(devices, options=mine) == mine and compiler_options(devices) is None


def test_what_the_step_needs_wins_over_xla_flags_and_loses_to_the_config():
    """The gathering units' needs (carried by the step's jax.jit) sit between XLA_FLAGS and the config."""
    from jzero.compiler.xla_flags import in_effect

    needs = {GATHER: 1}
    assert in_effect({GATHER: 5}, needs, {}, {GATHER: "0"})[GATHER] == {"value": 1, "from": "jzero"}
    assert in_effect({GATHER: 5}, needs, {GATHER: 7}, {GATHER: "0"})[GATHER] == {"value": 7, "from": "compiler.xla_options"}


def _gathers(env_flags, *sets):
    """All-gather ops in the bf16 stage-3 tiny step on h100x8, compiled by ``jzero plan`` in a process
    started with ``env_flags`` as XLA_FLAGS (XLA reads it once, when the process starts)."""
    env = {**os.environ, "XLA_FLAGS": env_flags}
    argv = [sys.executable, "-m", "jzero.cli", "plan", CONFIG, "--target", "h100x8", "--json", *_sets(*BF16, *sets)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    return report["collectives"]["all-gather"]["count"], report["compiler"]["xla_options"][GATHER]


def test_each_source_of_a_threshold_takes_effect(capsys, h100x8):
    """jzero's threshold combines the gathers; XLA_FLAGS' 0 now reaches the program (jzero's default
    used to override it); the config's value wins over XLA_FLAGS' 0."""
    assert main(["plan", CONFIG, "--target", "h100x8", "--json", *_sets(*BF16)]) == 0
    report = json.loads(capsys.readouterr().out)
    combined, mine = report["collectives"]["all-gather"]["count"], report["compiler"]["xla_options"][GATHER]
    assert mine["from"] == "jzero"
    count, source = _gathers(f"--{GATHER}=0")
    assert count > 2 * combined and source == {"value": "0", "from": "XLA_FLAGS"}, (count, combined)
    count, source = _gathers(f"--{GATHER}=0", f"compiler.xla_options.{GATHER}={mine['value']}")
    assert count == combined and source["from"] == "compiler.xla_options"


def test_plan_prints_the_options_in_one_line(monkeypatch, capsys):
    monkeypatch.delenv("XLA_FLAGS")  # the suite's own (this process's XLA read them at its start)
    assert main(["plan", CONFIG, *_sets("compiler.xla_options.xla_cpu_enable_fast_math=false")]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("XLA options:")]
    assert lines == ["XLA options: xla_cpu_enable_fast_math=false (compiler.xla_options)"]


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("xla_no_such_flag=1", "unknown XLA flag"),
        ("xla_gpu_enable_latency_hiding_scheduler=3", "must be a bool value, got 3"),
        (f"{GATHER}=abc", "must be an int64 value, got 'abc'"),
    ],
)
def test_a_bad_flag_in_the_config_is_one_line(capsys, h100x8, option, message):
    name = option.partition("=")[0]
    for target in ([], ["--target", "h100x8"]):
        argv = ["plan", CONFIG, *target, *_sets(f"compiler.xla_options.{option}")]
        assert keyed_error(capsys, argv, f"compiler.xla_options.{name}").endswith(message)


def test_a_bad_flag_in_the_config_stops_train_before_it_writes(capsys, tmp_path):
    run = tmp_path / "run"
    argv = ["train", CONFIG, *_sets("train.steps=1", f"run.dir={run}", "compiler.xla_options.xla_no_such_flag=1")]
    assert keyed_error(capsys, [*argv, "--quiet"], "compiler.xla_options.xla_no_such_flag").endswith("unknown XLA flag")
    assert not run.exists()  # neither the folder, its config.yaml nor its checkpoints folder


def test_a_bad_flag_in_the_config_stops_the_search(capsys, h100x8):
    """One line and exit 2 before the first candidate, not a refusal in every candidate's row."""
    argv = ["plan", CONFIG, "--target", "h100x8", "--search", *_sets("compiler.xla_options.xla_no_such_flag=1")]
    assert keyed_error(capsys, argv, "compiler.xla_options.xla_no_such_flag").endswith("unknown XLA flag")


def test_config_values_xla_cannot_take_are_refused_when_loaded(capsys):
    plan, key = ["plan", CONFIG], "compiler.xla_options"
    assert "not an XLA flag name" in keyed_error(capsys, [*plan, "--set", f"{key}.foo=1"], f"{key}.foo")
    err = keyed_error(capsys, [*plan, "--set", "compiler.xla_options.xla_foo=[1]"], "compiler.xla_options.xla_foo")
    assert "must be true, false, a number or a string" in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ("--xla_no_such_flag=1", "XLA_FLAGS: --xla_no_such_flag=1: unknown XLA flag"),
        (f"--{GATHER}=abc", f"XLA_FLAGS: --{GATHER}=abc: not a valid value for this XLA flag"),
        ("--xla_gpu_enable_latency_hiding_scheduler=3", "not a valid value for this XLA flag"),
    ],
)
def test_a_bad_xla_flags_is_one_line(monkeypatch, capsys, tmp_path, flags, message):
    """Checked before JAX's backends start, where XLA would abort the process (here they have
    started; the check reads XLA_FLAGS as a new process would)."""
    monkeypatch.setenv("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {flags}")
    for argv in (["plan", CONFIG], ["plan", CONFIG, "--target", "h100x8"], ["train", CONFIG, "--set", f"run.dir={tmp_path}"]):
        assert message in keyed_error(capsys, argv, "XLA_FLAGS")


def test_a_bad_xla_flags_in_a_new_process():
    """What a user sees: XLA would abort with exit status 1 and, behind jzero's quiet start, say nothing."""
    env = {**os.environ, "XLA_FLAGS": "--xla_no_such_flag=1"}
    proc = subprocess.run([sys.executable, "-m", "jzero.cli", "plan", CONFIG], env=env, capture_output=True, text=True, cwd=ROOT)
    line = "jzero: error: XLA_FLAGS: --xla_no_such_flag=1: unknown XLA flag\n"
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", line)


def test_a_gpu_step_combines_one_layer_per_gather_never_two(h100x8):
    """jzero's GPU thresholds follow the layer: each all-gather and reduce-scatter of a scanned
    stage-3 step holds under two layers' bytes. At a fixed 1 GiB, XLA merged the forward's first
    layer with the backward's first into one gather, held through the whole forward."""
    from jzero.ledger import hlo
    from jzero.training.job import build_job

    def largest(*sets):
        s = build_job(tiny_config("zero.stage=3", "model.n_layers=4", *BF16, *sets), h100x8)
        layer = s.plan.layer_bytes(s.precision.compute_dtype)
        ops = hlo.parse_collectives(s.compile_step()[1].as_text())
        return max(op.bytes for op in ops if op.kind in ("all-gather", "reduce-scatter")) / layer, layer

    ratio, layer = largest()
    # Not a tolerance but the property itself: the largest op holds a whole layer (>= 1) and never two
    # (< 2); exact byte counts, so nothing depends on the order of sums.
    assert 1 <= ratio < 2, ratio
    assert layer <= xla_options(h100x8, layer_bytes=layer)[GATHER]["value"] < 2 * layer
    fixed = [f"compiler.xla_options.{k}={2**30}" for k in (GATHER, "xla_gpu_reduce_scatter_combine_threshold_bytes")]
    assert largest(*fixed)[0] >= 2
