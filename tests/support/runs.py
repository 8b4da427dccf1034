"""A training run of the tiny model: its config, its ``jzero train`` words, as a process, compiled."""

import subprocess
import sys

import jax
import numpy as np

from jzero.config.loading import load_config
from jzero.training.job import build_job
from support.configs import ROOT, TINY

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
