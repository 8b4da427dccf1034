"""The README's Python snippets, run as written, in order, in one namespace."""

import importlib.util
import re
import sys
from pathlib import Path

import jax
import numpy as np
from conftest import tiny_config

from jzero.build import setup
from jzero.checkpoint import RunCheckpoints

ROOT = Path(__file__).resolve().parents[1]


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def _example():
    spec = importlib.util.spec_from_file_location("zero3_loop", ROOT / "examples" / "zero3_loop.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # Flax modules are dataclasses, which look themselves up here
    spec.loader.exec_module(module)
    return module


def test_readme_snippets_run_as_written(devices, tmp_path, monkeypatch):
    own_loop, checkpoints, plain_orbax = python_blocks()
    monkeypatch.chdir(tmp_path)  # the snippets write under runs/
    example = _example()
    init_fn, loss_fn, tx, key = example.training_parts()  # the user's own pieces
    batches = [example.make_batch(k) for k in range(3)]
    namespace = {"init_fn": init_fn, "loss_fn": loss_fn, "tx": tx, "key": key, "batches": batches}

    exec(own_loop, namespace)
    assert namespace["step"] == 2 and int(namespace["state"].step) == 3
    trained = [np.asarray(x) for x in jax.tree.leaves(namespace["state"])]

    exec(checkpoints, namespace)  # save, then restore at once: waits for the async write
    assert namespace["restored"].step == 2 and namespace["restored"].skipped == []
    for got, want in zip(jax.tree.leaves(namespace["state"]), trained, strict=True):
        assert np.array_equal(np.asarray(got), want)

    # Plain Orbax on a jzero GPT checkpoint at the path the snippet names.
    s = setup(tiny_config())
    state = s.init_state()
    gpt = RunCheckpoints(tmp_path / "runs" / "gpt-tiny")
    gpt.save(300, state)
    gpt.close()
    exec(plain_orbax, namespace)
    assert isinstance(namespace["state"]["params"]["lm_head"]["kernel"], np.ndarray)
    assert np.array_equal(namespace["state"]["params"]["lm_head"]["kernel"], np.asarray(state.params["lm_head"]["kernel"]))
