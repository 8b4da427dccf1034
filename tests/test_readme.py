"""The Python snippets of README.md and docs/*.md, run as written: each page's snippets in order, in
one namespace, by the test that SNIPPETS names for that page."""

import importlib.util
import re
import sys
from pathlib import Path

import jax
import numpy as np
from conftest import tiny_config

from jzero.checkpoint.runs import RunCheckpoints
from jzero.training.job import build_job

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Every page with Python snippets: the test that runs them and how many it runs. A snippet added to
# any page fails test_every_snippet_is_run until a test runs it and this table says so.
SNIPPETS = {
    "README.md": ("test_readme_own_loop_and_its_checkpoints", 2),
    "docs/checkpoints.md": ("test_checkpoints_page_plain_orbax", 1),
    "docs/sampling.md": ("test_sampling_page_sample_and_decode_loop", 2),
}


def python_blocks(page: str | Path) -> list[str]:
    return re.findall(r"^```(?:python|py)\n(.*?)^```", (ROOT / page).read_text(), re.S | re.M)


def test_every_snippet_is_run():
    found = {str(p.relative_to(ROOT)): len(python_blocks(p)) for p in PAGES if python_blocks(p)}
    assert found == {page: count for page, (_, count) in SNIPPETS.items()}
    for test, _ in SNIPPETS.values():
        assert callable(globals().get(test)), f"SNIPPETS names {test}, which is not a test here"


def _example():
    spec = importlib.util.spec_from_file_location("zero3_loop", ROOT / "examples" / "zero3_loop.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # Flax modules are dataclasses, which look themselves up here
    spec.loader.exec_module(module)
    return module


def test_readme_own_loop_and_its_checkpoints(devices, tmp_path, monkeypatch):
    own_loop, checkpoints = python_blocks("README.md")
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


def test_checkpoints_page_plain_orbax(devices, tmp_path, monkeypatch):
    (plain_orbax,) = python_blocks("docs/checkpoints.md")
    monkeypatch.chdir(tmp_path)
    # A jzero GPT checkpoint at the path the snippet names, read back with plain Orbax.
    s = build_job(tiny_config())
    state = s.init_state()
    gpt = RunCheckpoints(tmp_path / "runs" / "gpt-tiny")
    gpt.save(300, state)
    gpt.close()
    namespace = {}
    exec(plain_orbax, namespace)
    kernel = namespace["state"]["params"]["lm_head"]["kernel"]
    assert isinstance(kernel, np.ndarray)
    assert np.array_equal(kernel, np.asarray(state.params["lm_head"]["kernel"]))


def test_sampling_page_sample_and_decode_loop(devices, tmp_path, monkeypatch):
    """``sample`` on a run at the path the page names (one step of the tests' tiny GPT), then
    ``decode_loop`` with a model of one's own: token t is followed by t + 1 (mod 64)."""
    import jax.numpy as jnp

    from jzero.training.loop import train

    python_sample, own_model = python_blocks("docs/sampling.md")
    monkeypatch.chdir(tmp_path)
    train(tiny_config("run.dir=runs/gpt-tiny", "train.steps=1", "run.tensorboard=false"), progress=False)
    namespace = {}
    exec(python_sample, namespace)
    assert isinstance(namespace["text"], str) and namespace["text"]

    def prefill_fn(params, prompt, max_len):
        return params[prompt[:, -1]], jnp.zeros((prompt.shape[0], max_len), jnp.int32)

    def step_fn(params, token, cache, position):
        return params[token], cache

    table = jnp.where(jnp.arange(64)[None, :] == (jnp.arange(64)[:, None] + 1) % 64, 100.0, 0.0)  # others: e^-125 at T 0.8
    namespace = {"prefill_fn": prefill_fn, "step_fn": step_fn, "params": table, "prompt": jnp.array([[62]]),
                 "key": jax.random.key(0)}  # fmt: skip
    exec(own_model, namespace)
    assert int(namespace["count"]) == 50 and namespace["tokens"][0, :3].tolist() == [63, 0, 1]
