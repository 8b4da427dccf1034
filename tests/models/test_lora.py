"""LoRA (``lora:``): adapters rest like their kernels, only they train, the ledger counts their
optimizer state alone, and a fine-tune leaves as a merged Llama that transformers loads, or as
adapters in PEFT's layout beside the untouched weights."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file
from support.cli import one_line_error, sets
from support.configs import LR, tiny_config
from support.hf_llama import SHAPE, hf_greedy, hf_logits, write_hf_llama, write_tokenizer
from support.reference import MARGIN, ULPS, assert_within_floor, frozen_tx, loss_with_floor, reference_with_floor
from support.runs import shared_job

from jzero.checkpoint.runs import RunCheckpoints
from jzero.cli.main import main
from jzero.config.loading import load_config
from jzero.config.run_folder import RunDir
from jzero.data.tokenizer import load_tokenizer
from jzero.errors import ConfigError
from jzero.models.lora import A, B, is_adapter
from jzero.step import activation_rules
from jzero.training.job import build_job
from jzero.training.loop import train
from jzero.trees import path_str, tree_paths

RANK = 4
LORA = [f"lora.rank={RANK}", "lora.alpha=8"]
STEPS = 5


def _params(state) -> dict[str, np.ndarray]:
    return {path: np.asarray(leaf) for path, leaf in tree_paths(jax.device_get(state.params)).items()}


def test_adapters_rest_like_their_kernels_and_the_model_starts_as_the_one_it_adapts(data):
    """On dp4-mp2 at stage 3: A carries its kernel's input axis, B its output axis (``model`` where
    the kernel has it), each then partitioned over ``data``. With the plain model's parameters as its
    base (B starts at zero), the first loss is the plain model's one-device loss within MARGIN x its
    reordering floor + 4 ulps (measured with ``JZERO_FLOOR_LOG``: gap 3.3e-6, floor 3.3e-6, 0.09 of
    the tolerance).
    (A fresh LoRA model's own base is another draw: Flax's scan gives an adapted kernel's module
    another key once it holds more parameters.)"""
    axes = ["zero.stage=3", "mesh.axes={data: 4, model: 2}"]
    s, plain = shared_job(*LORA, *axes), build_job(tiny_config(*axes))
    specs = {t.path: t.replicated_spec for t in s.plan.tensors}
    kernels = [p.removesuffix(A) + "kernel" for p in specs if p.endswith(A)]
    assert len(kernels) == 6  # query, key, value, attn_out, mlp_in, mlp_out: lora.targets' default, every kernel
    for kernel in kernels:
        layers, into, out = specs[kernel]
        base = kernel.removesuffix("kernel")
        assert (specs[base + A], specs[base + B]) == (jax.P(layers, into, None), jax.P(layers, None, out)), kernel
    assert any("model" in str(specs[k]) for k in kernels)
    # Model FLOPs: 6 per adapter weight, and every kernel (frozen) skips its weight gradient, 2 per weight.
    adapters = sum(math.prod(t.shape) for t in s.plan.tensors if is_adapter(t.path))
    weights = sum(math.prod(t.shape) for t in plain.plan.tensors if t.path.endswith("/kernel"))
    assert adapters == 2 * RANK * (4 * (32 + 32) + 2 * (32 + 128))  # TINY: 2 layers, d 32, MLP 128
    assert s.flops_per_token == plain.flops_per_token + 6 * adapters - 2 * weights
    state, start = s.init_state(), plain.init_state()
    mine, theirs = _params(state), tree_paths(start.params)
    assert sorted(p for p in mine if not is_adapter(p)) == sorted(theirs)
    assert not any(np.any(mine[p]) for p in mine if p.endswith(B))
    based = jax.tree_util.tree_map_with_path(lambda path, x: theirs.get(path_str(path), x), state.params)
    one = build_job(tiny_config("mesh.axes.data=1"), devices=jax.devices()[:1])
    want, floor = loss_with_floor(one.loss_fn, start.params, [data.global_batch(0)])
    got = s.make_eval_step()(based, data.device_batch(0, s.plan.batch))
    assert_within_floor([float(got)], [want], floor, "the first loss")


@pytest.fixture(scope="module")
def lora_reference(data):
    one = build_job(tiny_config(LR, *LORA, "mesh.axes.data=1"), devices=jax.devices()[:1])
    return reference_with_floor(one.init_fn, one.loss_fn, frozen_tx(one), one.rng, lambda k: data.global_batch(k), STEPS)


@pytest.mark.parametrize("stage, axes", [(1, "{data: 8}"), (3, "{data: 4, model: 2}")])
def test_only_the_adapters_train_like_one_device_and_hold_the_optimizer_state(stage, axes, data, lora_reference):
    """The adapters equal one device's optax (base frozen) within MARGIN x its reordering floor + 4
    ulps (measured with ``JZERO_FLOOR_LOG``: 62 leaf comparisons, every gap within 2.7x its floor, 0.26
    of the tolerance at most); the base parameters stay bit for bit. On dp8 the optimizer state is the
    adapters' alone: 8 bytes x Ψ_a / N_d, plus the two step counts, Ψ_a counted from the shapes: per
    layer r x (in + out) for each kernel."""
    s = shared_job(LR, *LORA, f"zero.stage={stage}", f"mesh.axes={axes}")
    state = s.init_state()
    initial = _params(state)
    step = s.make_step()
    for k in range(STEPS):
        state, _ = step(state, data.device_batch(k, s.plan.batch))
    lora_reference.check(params=state.params)
    final = _params(state)
    moved = [p for p in final if not np.array_equal(final[p], initial[p])]
    assert moved and all(is_adapter(p) for p in moved)
    if axes == "{data: 8}":
        d, mlp, layers = 32, 4 * 32, 2  # support.configs.TINY
        psi_a = layers * RANK * (4 * (d + d) + 2 * (d + mlp))
        counts = sum(leaf.nbytes for leaf in jax.tree.leaves(state.opt_state) if leaf.ndim == 0)
        assert s.plan.per_device_bytes().optimizer == 8 * psi_a // 8 + counts


def test_a_target_that_adapts_nothing_is_refused_by_name(capsys):
    nearest = "nearest kernel is 'blocks/query/kernel'"
    with pytest.raises(ConfigError, match=rf"^lora\.targets\[1\]: 'qury' matches no kernel .*{nearest}"):
        build_job(tiny_config("lora.rank=2", "lora.targets=['value', 'qury']"))
    with pytest.raises(ConfigError, match=rf"^lora\.targets\[0\]: 'qury' matches no kernel .*{nearest}"):
        build_job(tiny_config("lora.rank=2", "lora.targets=['qury']"))  # no adapter at all: the plan fails first
    with pytest.raises(ConfigError, match=r"^lora\.rank: adapters go on jzero's models' layers"):
        load_config(None, ["lora.rank=2", "model.name=own"])


def test_a_gpt_lora_run_exports_its_kernels_merged(devices, tmp_path, capsys):
    """``jzero checkpoint export --merge-lora`` (one safetensors file): the plain GPT's parameters,
    no adapters, each adapted kernel ``W + (alpha / r) A B`` within the float32 rounding bound of its
    (r + 2)-term sum, elementwise, against float64 (no reordering floor: the bound is the arithmetic's
    own, machine-independent; measured, the largest error was 0.16 of it); a run without adapters is
    refused in one line."""
    run, out = tmp_path / "run", tmp_path / "merged.safetensors"
    sets_ = [*LORA, f"run.dir={run}", "train.steps=3", "optimizer.learning_rate=0.01", "run.tensorboard=false"]
    train(tiny_config(*sets_), progress=False)
    capsys.readouterr()
    assert main(["checkpoint", "export", str(run), "--out", str(out), "--merge-lora"]) == 0
    merged, saved = load_file(out), _params_of(run, 3)
    assert sorted(merged) == sorted(p for p in saved if not is_adapter(p))
    assert sum(p.endswith(A) for p in saved) == 6  # every kernel of the blocks
    scale, eps = 8 / RANK, np.finfo(np.float32).eps
    for path, value in merged.items():
        if path.removesuffix("kernel") + A not in saved:  # not adapted (the head, biases, norms)
            np.testing.assert_array_equal(value, saved[path], strict=True)
            continue
        w, a, b = (saved[path.removesuffix("kernel") + part].astype(np.float64) for part in ("kernel", A, B))
        assert np.any(b)  # the adapters moved
        want = w + scale * np.einsum("lir,lro->lio", a, b)
        bound = (RANK + 2) * eps * (np.abs(w) + scale * np.einsum("lir,lro->lio", np.abs(a), np.abs(b)))
        assert np.all(np.abs(value - want) <= bound), path
    plain = tmp_path / "plain"
    train(tiny_config(f"run.dir={plain}", "train.steps=1", "run.tensorboard=false"), progress=False)
    one_line_error(capsys, ["checkpoint", "export", str(plain), "--out", str(tmp_path / "x.safetensors"), "--merge-lora"],
                   "--merge-lora: ")  # fmt: skip
    assert not (tmp_path / "x.safetensors").exists()


def _jzero_logits(run, step, tokens, axes: str):
    """jzero's logits, the adapters beside their kernels, from a run's step on the mesh ``axes``."""
    sets_ = [f"mesh.axes={axes}", f"train.global_batch_size={len(tokens)}"]
    job = build_job(load_config(RunDir(run).config, sets_), jax.devices()[: 1 if axes == "{data: 1}" else 8])
    params = RunCheckpoints(run).restore(step, job.abstract_state()).state.params
    with activation_rules(job.plan):
        return np.asarray(jax.jit(lambda p, t: job.model.apply({"params": p}, t))(params, jnp.asarray(tokens)))


def test_a_llama_fine_tune_leaves_merged_for_transformers_and_as_peft_adapters(devices, tmp_path, capsys):
    """A LoRA fine-tune of an imported Llama (stage 3 on dp4-mp2, adapters on three kernels):

    - the ledger's optimizer state is the adapters' alone;
    - ``--merge-lora``: transformers' logits of the export equal jzero's, the adapters applied beside
      their kernels on one device, within their floor (jzero's one-device logits against the
      training mesh's; measured: gap 9.5e-6, floor 7.2e-6, 0.13 of the tolerance), and greedy
      ``jzero sample`` of the run prints transformers' greedy tokens of the export;
    - without it: the weights are the original checkpoint's bit for bit (they were frozen), and
      ``lora/`` holds each layer's A and B transposed to PEFT's layout, bit for bit, and its config."""
    hf = write_hf_llama(tmp_path / "hf", seed=2, initializer_range=0.2)
    write_tokenizer(hf, SHAPE["vocab_size"])
    run, tuned = tmp_path / "run", tmp_path / "tuned"
    small = sets("train.global_batch_size=8", "data.max_bytes=200000")
    assert main(["checkpoint", "import", str(hf), "--out", str(run), *small]) == 0
    targets = "lora.targets=['q_proj', 'v_proj', 'down_proj']"
    steps = ["train.steps=4", "optimizer.learning_rate=0.01", "zero.stage=3", "mesh.axes={data: 4, model: 2}"]
    config = load_config(RunDir(run).config, [f"run.dir={tuned}", f"train.init_from={hf}", *LORA, targets, *steps])
    assert train(config, progress=False).final_step == 4
    ledger = json.loads((tuned / "ledger.json").read_text())
    psi_a = SHAPE["num_hidden_layers"] * RANK * (64 + 64 + 64 + 32 + 96 + 64)  # q, v (64 -> 64, 64 -> 32), down (96 -> 64)
    assert ledger["per_device_bytes"]["optimizer"] == 8 * psi_a // 8 + 2 * 4  # over N_d x N_m = 8; Adam's two int32 counts
    merged, plain = tmp_path / "merged", tmp_path / "plain"
    assert main(["checkpoint", "export", str(tuned), "--format", "hf", "--out", str(merged), "--merge-lora"]) == 0
    assert "LoRA's adapters merged" in capsys.readouterr().out and not (merged / "lora").exists()

    tokens = np.random.default_rng(0).integers(0, SHAPE["vocab_size"], (4, 16))
    one, mesh = _jzero_logits(tuned, 4, tokens, "{data: 1}"), _jzero_logits(tuned, 4, tokens, "{data: 4, model: 2}")
    want = hf_logits(merged, tokens)
    floor = float(np.max(np.abs(one - mesh)))
    gap = float(np.max(np.abs(one - want)))
    assert 0 < floor and gap <= MARGIN * floor + ULPS * np.finfo(np.float32).eps * float(np.max(np.abs(want))), (gap, floor)
    tokenizer, prompt = load_tokenizer(hf / "tokenizer.json"), "def wrap(text, width):"
    greedy = hf_greedy(merged, tokenizer.encode(prompt), 32, tokenizer.eos_id)
    assert main(["sample", str(tuned), "--prompt", prompt, "--temperature", "0", "--max-tokens", "32"]) == 0
    assert capsys.readouterr().out == tokenizer.decode(greedy) + "\n"

    assert main(["checkpoint", "export", str(tuned), "--format", "hf", "--out", str(plain)]) == 0
    assert "PEFT's layout" in capsys.readouterr().out
    original, exported = _weights(hf), _weights(plain)
    assert sorted(exported) == sorted(original)
    for name, value in original.items():
        np.testing.assert_array_equal(exported[name], value, strict=True, err_msg=name)
    saved = _params_of(tuned, 4)
    adapters = load_file(plain / "lora" / "adapter_model.safetensors")
    assert len(adapters) == 2 * 3 * SHAPE["num_hidden_layers"]
    for kernel, module in (("q_proj", "self_attn.q_proj"), ("v_proj", "self_attn.v_proj"), ("down_proj", "mlp.down_proj")):
        for layer in range(SHAPE["num_hidden_layers"]):
            name = f"base_model.model.model.layers.{layer}.{module}"
            np.testing.assert_array_equal(adapters[f"{name}.lora_A.weight"], saved[f"layers/{kernel}/{A}"][layer].T, strict=True)
            np.testing.assert_array_equal(adapters[f"{name}.lora_B.weight"], saved[f"layers/{kernel}/{B}"][layer].T, strict=True)
    peft = json.loads((plain / "lora" / "adapter_config.json").read_text())
    got = (peft["peft_type"], peft["r"], peft["lora_alpha"], peft["target_modules"])
    assert got == ("LORA", RANK, 8, ["down_proj", "q_proj", "v_proj"])
    one_line_error(capsys, ["checkpoint", "export", str(run), "--format", "hf", "--out", str(tmp_path / "x"), "--merge-lora"],
                   "--merge-lora: ")  # fmt: skip
    assert not (tmp_path / "x").exists()


def _weights(folder) -> dict[str, np.ndarray]:
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        out.update(load_file(path))
    return out


def _params_of(run, step) -> dict[str, np.ndarray]:
    from jzero.checkpoint.export import restore_numpy

    state = run / "checkpoints" / str(step) / "state"
    return {p.removeprefix("params/"): a for p, a in restore_numpy(state).items() if p.startswith("params/")}
