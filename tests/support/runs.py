"""A training run of the tiny model: its config, its ``jzero train`` words, as a process, compiled."""

import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np

from jzero.config.loading import dump_config, load_config
from jzero.training.job import build_job
from support.configs import ROOT, TINY, tiny_config

RUN = [*TINY, "mesh.axes.data=8", "zero.stage=3", "checkpoint.every=2", "run.log_every=4"]


def run_config(run_dir, *overrides):
    """The run :func:`cli_args` describes, for calling :func:`jzero.training.loop.train` in-process."""
    return load_config(ROOT / "configs/gpt-tiny.yaml", [*RUN, f"run.dir={run_dir}", *overrides])


def cli_args(run_dir, *overrides):
    """``jzero train`` arguments for the same run as :func:`run_config`."""
    return ["configs/gpt-tiny.yaml", *(f"--set={o}" for o in [*RUN, f"run.dir={run_dir}", *overrides])]


def jzero_process(run_dir, *overrides):
    args = [sys.executable, "-m", "jzero.cli", "train", "--quiet", *cli_args(run_dir, *overrides)]
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def host(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def compiled_step(config, devices):
    """A job built from ``config`` for ``devices``, and its compiled train step."""
    s = build_job(config, devices)
    _, compiled = s.compile_step()
    return s, compiled


def trained_run(folder, *overrides):
    """:func:`run_config`'s run trained in ``folder / "run"``, for tests to copy (:func:`copy_run`)
    rather than train again: ``(run_dir, overrides)``."""
    from jzero.training.loop import train

    run = Path(folder) / "run"
    train(run_config(run, *overrides), progress=False)
    return run, overrides


def copy_run(trained, run_dir):
    """A copy of a ``trained`` run at ``run_dir``, as ``train(run_config(run_dir, *overrides))`` would
    have left it there: every file copied, and ``config.yaml`` (which holds ``run.dir``) the one that
    run would have written. Returns ``run_dir``."""
    source, overrides = trained
    shutil.copytree(source, run_dir, dirs_exist_ok=True)
    (Path(run_dir) / "config.yaml").write_text(dump_config(run_config(run_dir, *overrides)))
    return run_dir


_JOBS = {}


def shared_job(*overrides: str):
    """``build_job(tiny_config(*overrides))``, built once in this process for every test whose config
    resolves the same (a job never changes, and its steps are traced once)."""
    config = tiny_config(*overrides)
    key = dump_config(config)
    if key not in _JOBS:
        _JOBS[key] = build_job(config)
    return _JOBS[key]
