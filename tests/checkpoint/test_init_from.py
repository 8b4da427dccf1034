"""``train.init_from`` as users write it: a run folder (its newest committed step), a path relative to
the working folder, and ``~`` for the home folder, which the shell leaves alone in ``--set KEY=~/x``."""

from pathlib import Path

import numpy as np
from support.runs import run_config

from jzero.checkpoint.export import load_params
from jzero.config.loading import load_config
from jzero.training.loop import train


def test_a_run_folder_reads_as_its_newest_step_from_a_relative_path(devices, tmp_path, monkeypatch):
    train(run_config(tmp_path / "run", "train.steps=2", "checkpoint.every=1", "checkpoint.keep=2"), progress=False)
    newest = load_params(tmp_path / "run" / "checkpoints" / "2")
    first = load_params(tmp_path / "run" / "checkpoints" / "1")
    assert not np.array_equal(newest["blocks/query/kernel"], first["blocks/query/kernel"])  # the newest, not any
    monkeypatch.chdir(tmp_path)
    for given in ("run", "run/checkpoints/2"):  # Orbax read no metadata under a relative path
        got = load_params(given)
        assert set(got) == set(newest) and all(np.array_equal(got[p], newest[p]) for p in newest), given


def test_a_leading_tilde_in_a_path_is_the_home_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    config = load_config(None, ["train.init_from=~/models/x", "run.dir=~/runs/y", "data.path=a~b"])
    assert (config.train.init_from, config.run.dir) == (str(tmp_path / "models/x"), str(tmp_path / "runs/y"))
    assert config.data.path == "a~b" and Path(config.train.init_from).is_absolute()
