"""The Python snippets of README.md and docs/*.md, run as written: each page's snippets in order, in
one namespace, by the test that SNIPPETS names for that page."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from support.configs import tiny_config
from support.examples import load_example
from support.xla import USERS_EMITTERS

import jzero
from jzero.checkpoint.runs import RunCheckpoints
from jzero.training.job import build_job

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Every page with Python snippets: the test that runs them and how many it runs. A snippet added to
# any page fails test_every_snippet_is_run until a test runs it and this table says so.
SNIPPETS = {
    "README.md": ("test_readme_own_loop_and_its_checkpoints", 3),
    "docs/checkpoints.md": ("test_checkpoints_page_plain_orbax", 1),
    "docs/families.md": ("test_families_page_peft_loads_the_unmerged_export", 1),
    "docs/own-loop.md": ("test_own_model_page_example_resume_and_own_loop", 5),
    "docs/sampling.md": ("test_sampling_page_sample_and_decode_loop", 2),
}


def python_blocks(page: str | Path) -> list[str]:
    return re.findall(r"^```(?:python|py)\n(.*?)^```", (ROOT / page).read_text(), re.S | re.M)


def test_every_snippet_is_run():
    found = {str(p.relative_to(ROOT)): len(python_blocks(p)) for p in PAGES if python_blocks(p)}
    assert found == {page: count for page, (_, count) in SNIPPETS.items()}
    for test, _ in SNIPPETS.values():
        assert callable(globals().get(test)), f"SNIPPETS names {test}, which is not a test here"


def test_readme_own_loop_and_its_checkpoints(devices, tmp_path, monkeypatch):
    own_loop, save, restore = python_blocks("README.md")
    monkeypatch.chdir(tmp_path)  # the snippets write under runs/
    example = load_example("zero3_loop")
    batches = [example.make_batch(k) for k in range(3)]
    namespace = {"training_parts": example.training_parts, "batches": batches}  # the user's own pieces

    exec(own_loop, namespace)
    assert namespace["step"] == 2 and int(namespace["state"].step) == 3 and namespace["mesh"].size == 8
    trained = [np.asarray(x) for x in jax.tree.leaves(namespace["state"])]

    exec(save + restore, namespace)  # save, then restore at once: waits for the async write
    assert namespace["restored"].step == 2 and namespace["restored"].skipped == []
    for got, want in zip(jax.tree.leaves(namespace["state"]), trained, strict=True):
        assert np.array_equal(np.asarray(got), want)


# What a user writes before the README's blocks: their own pieces, defined, no JAX operation run yet.
_USERS_OWN = """
import flax.linen as nn, jax, jax.numpy as jnp, numpy as np, optax

def training_parts():
    model = nn.Dense(16)
    init_fn = lambda key: model.init(key, jnp.zeros((1, 16)))["params"]
    loss_fn = lambda params, batch: jnp.mean((model.apply({"params": params}, batch) - 1.0) ** 2)
    return init_fn, loss_fn, optax.adam(1e-2), jax.random.key(0)

batches = [np.random.default_rng(k).standard_normal((64, 16), np.float32) for k in range(3)]
"""


def _fresh_python(script: str, cwd: Path) -> subprocess.CompletedProcess:
    """``script`` in a new process with no device or platform settings of the tests'."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS", "JAX_NUM_CPU_DEVICES")}
    return subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_readme_blocks_as_two_scripts_commit_and_restore(tmp_path):
    """The acceptance of the README's own loop: a script that trains and ends right after
    ``checkpoints.save(...)`` exits 0, quietly, with the step committed, on 8 devices of a CPU-only
    host; a second process restores that step, equal to the state it trains the same way."""
    own_loop, save, restore = python_blocks("README.md")
    first = _fresh_python(_USERS_OWN + own_loop + save, tmp_path)
    assert (first.returncode, first.stderr) == (0, "")
    assert sorted(p.name for p in (tmp_path / "runs" / "mine" / "checkpoints").iterdir()) == ["2"]

    check = """
assert mesh.size == 8, mesh
assert step == 2 and int(state.step) == 3, (step, state.step)
print("restored", step)
"""
    trained_again = "\ntrained = [np.asarray(x) for x in jax.tree.leaves(state)]\n"
    equal = "\nassert all(np.array_equal(np.asarray(a), b) for a, b in zip(jax.tree.leaves(state), trained, strict=True))\n"
    second = _fresh_python(_USERS_OWN + own_loop + trained_again + restore + check + equal, tmp_path)
    assert (second.returncode, second.stderr, second.stdout) == (0, "", "restored 2\n")


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


def test_families_page_peft_loads_the_unmerged_export(devices, tmp_path, monkeypatch):
    """The page's PEFT snippet on a Qwen2 export at the path it names (the tests' tiny Qwen2, two LoRA
    steps): the adapters are PEFT's, and they change the base model's logits."""
    import torch
    from support.cli import sets
    from support.hf_families import hf_logits, write_hf

    from jzero.cli.main import main

    (snippet,) = python_blocks("docs/families.md")
    monkeypatch.chdir(tmp_path)
    hf = write_hf(tmp_path / "qwen", "qwen2", seed=2, initializer_range=0.2)
    lora = ["lora.rank=4", "lora.targets=['q_proj', 'v_proj']", "train.steps=2", "optimizer.learning_rate=0.05"]
    small = ["train.global_batch_size=8", "data.max_bytes=200000", "model.seq_len=16", "run.dir=runs/qwen-lora", *lora]
    assert main(["checkpoint", "import", str(hf), "--out", "runs/qwen", *sets(*small[:3])]) == 0
    assert main(["train", "runs/qwen/config.yaml", *sets(*small)]) == 0
    assert main(["checkpoint", "export", "runs/qwen-lora", "--format", "hf", "--out", "exported/qwen-lora"]) == 0
    namespace = {}
    exec(snippet, namespace)
    tokens = np.random.default_rng(0).integers(0, 320, (2, 16))
    with torch.no_grad():
        tuned = namespace["model"](torch.as_tensor(tokens)).logits.float().numpy()
    assert type(namespace["model"]).__name__ == "PeftModelForCausalLM"
    assert np.abs(tuned - hf_logits(hf, tokens)).max() > 1e-3  # the adapters act on the base weights


# The own-model page's example at the tests' size: 16-token windows, 20 steps then 10 more.
OWN_MODEL = ["model.seq_len=16", "data.max_bytes=200000", "train.eval_every=20", "checkpoint.every=20", "run.log_every=10",
             USERS_EMITTERS]  # what is gathered at once is read below: users' program  # fmt: skip


def test_own_model_page_example_resume_and_own_loop(devices, tmp_path, monkeypatch, capsys):
    """The page's example, quoted from examples/own_model.py, trains (loss falls, eval logged, units
    as the page names them), resumes, and its own-loop snippets run: 16-bit with the fp32 master at
    ``state.opt_state.master``, what is gathered at once, a checkpoint and its export."""
    from safetensors.numpy import load_file

    model, parts, precision, gathered, export = python_blocks("docs/own-loop.md")
    example = (ROOT / "examples" / "own_model.py").read_text()
    assert model in example and parts in example  # the page quotes the example as it is
    (config_section,) = [b for b in re.findall(r"^```yaml\n(.*?)^```", (ROOT / "docs/own-loop.md").read_text(), re.S | re.M)
                         if b.startswith("model:")]  # fmt: skip
    assert config_section in (ROOT / "configs" / "own-model.yaml").read_text()
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "own_model_page"}
    exec(model, namespace)
    exec(parts, namespace)
    config = str(ROOT / "configs" / "own-model.yaml")

    result, hook = namespace["main"](config, [*OWN_MODEL, "train.steps=20"], progress=False)
    printed = capsys.readouterr().out
    assert "unit h/0: 12 tensors" in printed and "unit wte/embedding: 1 tensors" in printed
    assert result.saved == [20] and [r["step"] for r in hook.records] == [10, 20]
    assert "eval_loss" in hook.records[-1] and f"eval loss {hook.records[-1]['eval_loss']:.3f}" in printed
    assert hook.records[-1]["loss"] < hook.records[0]["loss"] < 5.0  # ln 256 = 5.5 at the start
    ledger = json.loads((tmp_path / "runs" / "own-model" / "ledger.json").read_text())
    units = ledger["gathered"]["unit_tensors"]
    assert list(units) == ["h/0", "h/1", "lm_head/kernel", "ln_f/bias", "ln_f/scale", "wpe/embedding", "wte/embedding"]
    assert len(units["h/0"]) == len(units["h/1"]) == 12 and ledger["gathered"]["layers"] < 2  # one block and a tensor alone

    resumed, _ = namespace["main"](config, [*OWN_MODEL, "train.steps=30"], progress=False)
    assert (resumed.start_step, resumed.final_step, resumed.saved) == (20, 30, [30])

    example_loop = load_example("zero3_loop")  # the README's loop: init_fn, loss_fn, tx, key, mesh and batches
    init_fn, loss_fn, tx, key = example_loop.training_parts()
    namespace.update(init_fn=init_fn, loss_fn=loss_fn, tx=tx, key=key, mesh=jzero.make_mesh({"data": -1}),
                     batches=[example_loop.make_batch(k) for k in range(2)])  # fmt: skip
    exec(precision, namespace)
    kernel = namespace["state"].params["Dense_0"]["kernel"]
    assert kernel.dtype == jnp.bfloat16 and namespace["master"]["Dense_0"]["kernel"].dtype == jnp.float32
    assert namespace["master"]["Dense_0"]["kernel"].sharding.spec == kernel.sharding.spec  # stage 3: both on data

    exec(gathered, namespace)
    g, plan = namespace["gathered"], namespace["plan"]
    assert plan.unit_tensors["Dense_0"] == ["Dense_0/bias", "Dense_0/kernel"]
    assert g.peak_bytes > 0 and g.layers == g.peak_bytes / plan.layer_bytes() and g.units == 3

    exec(export, namespace)
    params = load_file(tmp_path / "runs" / "mine" / "model.safetensors")
    assert namespace["done"]["step"] == 1 and set(params) == {t.path for t in plan.tensors}
    got = params["Dense_0/kernel"]
    assert np.array_equal(got, np.asarray(namespace["state"].params["Dense_0"]["kernel"]))
