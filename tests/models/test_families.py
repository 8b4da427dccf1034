"""Qwen2, Qwen3, Mistral, Gemma 2 and Gemma 3 through the one decoder, each from a tiny random model
written by ``transformers`` (PyTorch, sharded safetensors, its own ``tokenizer.json``), as a user
takes it: imported at stage 3 on ``data: 4, model: 2``, its logits against transformers', greedy
``jzero sample`` against transformers' ``generate``, exported back bit for bit, and a LoRA
fine-tune merged into a folder transformers loads with the same logits, or left apart as adapters
that PEFT loads onto the exported weights with the same logits again. (Llama's own tests:
tests/models/test_llama.py, tests/checkpoint/test_hf.py, tests/models/test_lora.py.)"""

import dataclasses
import functools
import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file
from support.cli import one_line_error, sets
from support.configs import LR, ROOT, tiny_config
from support.hf_families import FAMILIES, hf_greedy, hf_logits, peft_logits, write_hf
from support.hf_llama import write_tokenizer
from support.reference import MARGIN, ULPS, optax_tx, reference_with_floor, train_sharded

from jzero.checkpoint.hf import HFCheckpoint, hf_config, model_section
from jzero.checkpoint.runs import RunCheckpoints
from jzero.cli.main import main
from jzero.config.loading import load_config
from jzero.config.run_folder import RunDir
from jzero.data.tokenizer import load_tokenizer
from jzero.models.architectures import ARCHITECTURES, hf_names
from jzero.models.config import ModelConfig
from jzero.models.decoder import Decoder
from jzero.models.sizes import head_size, kv_heads, param_count, sliding_layers
from jzero.step import activation_rules
from jzero.training.job import build_job
from jzero.training.loop import train

MESH = ["zero.stage=3", "mesh.axes={data: 4, model: 2}"]
SMALL = ["train.global_batch_size=8", "data.max_bytes=200000", "model.seq_len=48"]
TOKENS = np.random.default_rng(0).integers(0, 320, (4, 16))  # longer than every family's window of 6
PROMPT = "def wrap(text, width):"


def _logits(run, step, axes: str) -> np.ndarray:
    """jzero's logits for TOKENS from a run's step, restored onto the mesh ``axes``."""
    words = [f"mesh.axes={axes}", f"train.global_batch_size={len(TOKENS)}"]
    job = build_job(load_config(RunDir(run).config, words), jax.devices()[: 1 if axes == "{data: 1}" else 8])
    params = RunCheckpoints(run).restore(step, job.abstract_state()).state.params
    with activation_rules(job.plan):
        return np.asarray(jax.jit(lambda p, t: job.model.apply({"params": p}, t))(params, jnp.asarray(TOKENS)))


def _assert_within_floor(run, step, want: np.ndarray) -> None:
    """The floor: jzero's one-device logits against the training mesh's (another order of the sums
    over model shards and batch rows); transformers' within MARGIN times it plus ULPS ulps."""
    one, mesh = _logits(run, step, "{data: 1}"), _logits(run, step, "{data: 4, model: 2}")
    floor, gap = float(np.max(np.abs(one - mesh))), float(np.max(np.abs(mesh - want)))
    assert gap <= MARGIN * floor + ULPS * np.finfo(np.float32).eps * float(np.max(np.abs(want))), (gap, floor)


def _tensors(folder) -> dict[str, np.ndarray]:
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        out.update(load_file(path))
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_family_imports_samples_exports_and_fine_tunes_as_transformers_computes_it(devices, tmp_path, capsys, family):
    hf, run, back = write_hf(tmp_path / "hf", family, seed=2, initializer_range=0.2), tmp_path / "run", tmp_path / "back"
    write_tokenizer(hf, 320)
    section = model_section(hf)
    assert section["name"] == family
    assert param_count(load_config(None, [f"model.{k}={json.dumps(v)}" for k, v in section.items()]).model) == sum(
        a.size for a in HFCheckpoint(hf).tensors.values()
    )  # the formula, exactly
    assert main(["checkpoint", "import", str(hf), "--out", str(run), *sets(*SMALL, *MESH)]) == 0
    assert "its tokenizer" in capsys.readouterr().out
    _assert_within_floor(run, 0, hf_logits(hf, TOKENS))

    tokenizer = load_tokenizer(hf / "tokenizer.json")
    want = hf_greedy(hf, tokenizer.encode(PROMPT), 32, tokenizer.eos_id)
    assert len(want) >= 8  # a continuation worth comparing, past the window
    assert main(["sample", str(run), "--prompt", PROMPT, "--temperature", "0", "--max-tokens", "32"]) == 0
    assert capsys.readouterr().out == tokenizer.decode(want) + "\n"

    assert main(["checkpoint", "export", str(run), "--format", "hf", "--out", str(back)]) == 0
    assert f"as Hugging Face {FAMILIES[family][0].removesuffix('ForCausalLM')}:" in capsys.readouterr().out
    original, exported = _tensors(hf), _tensors(back)
    assert sorted(exported) == sorted(original)
    for name, value in original.items():
        np.testing.assert_array_equal(exported[name], value, strict=True, err_msg=name)
    before, after = (json.loads((folder / "config.json").read_text()) for folder in (hf, back))
    assert {k: v for k, v in after.items() if k in before} == before  # every key of the original, as it was

    tuned, merged, apart = tmp_path / "tuned", tmp_path / "merged", tmp_path / "apart"
    lora = ["lora.rank=4", "lora.alpha=8", "lora.targets=['q_proj', 'v_proj', 'down_proj']"]
    steps = ["train.steps=2", "optimizer.learning_rate=0.01", *MESH]
    config = load_config(RunDir(run).config, [f"run.dir={tuned}", f"train.init_from={hf}", *lora, *steps])
    assert train(config, progress=False).final_step == 2
    assert main(["checkpoint", "export", str(tuned), "--format", "hf", "--out", str(merged), "--merge-lora"]) == 0
    _assert_within_floor(tuned, 2, hf_logits(merged, TOKENS))
    assert main(["checkpoint", "export", str(tuned), "--format", "hf", "--out", str(apart)]) == 0
    _assert_within_floor(tuned, 2, peft_logits(apart, apart / "lora", TOKENS))  # PEFT's own loader


def test_each_row_reads_keys_of_the_model_section_and_names_its_tensors_once():
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    for row in ARCHITECTURES:
        assert set(row.keys) <= fields, row.name
        if row.hf_class:
            names = [name for name, _ in hf_names(row, tied=False).values()]
            assert len(names) == len(set(names)), row.name  # one jzero path per Hugging Face tensor


def test_the_old_llama_names_warn_and_answer_with_the_decoder():
    import jzero.models.llama as old

    with pytest.warns(DeprecationWarning, match="jzero.models.decoder.Decoder"):
        assert old.Llama is Decoder


def test_a_decoder_config_builds_the_row_it_names():
    sets_ = ["model.name=gemma3", "model.d_model=32", "model.n_layers=3", "model.n_heads=4", "model.head_dim=12",
             "model.sliding_window=4", "model.seq_len=16", "train.global_batch_size=8"]  # fmt: skip
    job = build_job(load_config(None, sets_))
    assert isinstance(job.model, Decoder) and job.model.arch == "gemma3"
    assert job.model.layer_types == (True, True, True) and job.model.kinds()[0] == "sliding"  # every 6th is full: none of 3
    paths = {t.path: t.shape for t in job.plan.tensors}
    assert paths["layers/q_proj/kernel"] == (3, 32, 48) and paths["layers/q_norm/scale"] == (3, 12)
    assert "layers/pre_feedforward_layernorm/scale" in paths and "lm_head/kernel" in paths  # untied unless asked


@pytest.mark.parametrize(
    "raw, fragment",
    [
        ({"architectures": ["Gemma2ForCausalLM"], "hidden_activation": "relu"}, "hidden_activation: jzero's gemma2 has"),
        ({"architectures": ["Qwen3ForCausalLM"], "layer_types": ["chunked_attention"] * 2, "use_sliding_window": True},
         "layer_types: jzero computes full_attention and sliding_attention"),
        ({"architectures": ["MistralForCausalLM"], "rope_scaling": {"rope_type": "yarn", "factor": 4}},
         "rope_scaling: jzero reads rope_type llama3 or linear, got 'yarn'"),
    ],
    ids=["gemma-relu", "chunked-layers", "yarn"],
)
def test_a_config_json_jzero_does_not_compute_is_one_line(devices, tmp_path, capsys, raw, fragment):
    shape = {"vocab_size": 320, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4}
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**shape, **raw}))
    one_line_error(capsys, ["checkpoint", "import", str(tmp_path / "hf"), "--out", str(tmp_path / "run")], fragment)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "family, raw",
    [
        ("qwen2", {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 2}),
        ("qwen3", {}),
        ("qwen3", {"use_sliding_window": False, "sliding_window": 6, "max_window_layers": 2}),  # Qwen2.5's: no window
        ("mistral", {}),
        ("gemma2", {}),
        ("gemma3", {"sliding_window_pattern": 3}),
        ("gemma3", {"rope_scaling": {"rope_type": "linear", "factor": 8.0}}),
    ],
    ids=["qwen2-max-window-layers", "qwen3", "qwen3-window-off", "mistral", "gemma2", "gemma3-pattern", "gemma3"],
)
def test_keys_config_json_leaves_out_read_as_transformers_config_class_reads_them(tmp_path, family, raw):
    """A config.json with only the sizes (and ``raw``): the section jzero reads holds what the
    family's own transformers config class makes of it (its defaults, its layer pattern)."""
    import transformers

    name, _ = FAMILIES[family]
    # 32 heads: Qwen's default of 32 key and value heads must divide them
    shape = {"architectures": [name], "vocab_size": 320, "hidden_size": 256, "intermediate_size": 96, "num_hidden_layers": 7,
             "num_attention_heads": 32, **raw}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(shape))
    model = load_config(None, [f"model.{k}={json.dumps(v)}" for k, v in model_section(tmp_path).items()]).model
    hf = getattr(transformers, name).config_class(**shape)
    kinds = getattr(hf, "layer_types", None) or ["sliding_attention" if hf.sliding_window else "full_attention"] * 7
    assert sliding_layers(model) == tuple(kind == "sliding_attention" for kind in kinds)
    assert head_size(model) == (getattr(hf, "head_dim", None) or 256 // 32)
    assert kv_heads(model) == hf.num_key_value_heads
    assert (model.rope_theta, model.rms_norm_eps) == (hf.rope_theta, hf.rms_norm_eps)
    assert model.tie_embeddings == hf.tie_word_embeddings
    if family.startswith("gemma"):
        assert (model.attn_scalar, model.attn_softcap, model.final_softcap) == (
            hf.query_pre_attn_scalar, hf.attn_logit_softcapping, hf.final_logit_softcapping
        )  # fmt: skip
    if family == "gemma3":
        assert model.rope_local_theta == hf.rope_local_base_freq
        assert (model.rope_scaling.factor if model.rope_scaling else None) == (hf.rope_scaling or {}).get("factor")


# Gemma 2 at the tests' tiny size (d_model 32, 16-token windows of bytes): its head size, query scale
# and soft-caps, a window of 6 on layers 0 and 2 of 3. The row with the most of the decoder's branches
# in its backward (the soft-capped attention, the mask by each layer's flag, the sandwich norms); the
# other rows' forwards are held to transformers' at stage 3 on data: 4, model: 2 above.
GEMMA2 = ["model.name=gemma2", "model.head_dim=12", "model.attn_scalar=10.0", "model.attn_softcap=5.0",
          "model.final_softcap=10.0"]  # fmt: skip
DECODER = ["model.n_layers=3", "model.n_heads=4", "model.n_kv_heads=2", "model.mlp_hidden=48", "model.sliding_window=6",
           "model.layer_types=[sliding, full, sliding]", LR]  # fmt: skip
STEPS_HERE = 6


@functools.cache
def _reference(data) -> Any:
    job = build_job(tiny_config(*DECODER, *GEMMA2, "mesh.axes.data=1"), devices=jax.devices()[:1])
    batches = lambda k: jnp.asarray(data.global_batch(k))  # noqa: E731
    return reference_with_floor(job.init_fn, job.loss_fn, optax_tx(job.config), job.rng, batches, STEPS_HERE)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_gemma2_trains_at_each_stage_as_one_device_does(devices, data, stage):
    """Sharded at the stage on ``data: 4, model: 2`` (tensor parallelism over heads, key/value heads
    and the MLP), a few AdamW steps give one device's optax parameters and moments within the floor."""
    job = build_job(tiny_config(*DECODER, *GEMMA2, f"zero.stage={stage}", "mesh.axes={data: 4, model: 2}"))
    state = train_sharded(job, data.device_batch, STEPS_HERE)
    _reference(data).check(params=state.params, opt_state=state.opt_state)


@pytest.mark.parametrize("name", ["qwen2.5-7b", "mistral-7b", "gemma2-9b", "llama3-8b", "llama3.2-1b"])
def test_a_published_shape_counts_as_transformers_counts_the_config_jzero_writes(name):
    """``configs/NAME.yaml``'s parameter count (jzero.models.sizes.param_count) equals the count of
    transformers' model built, on PyTorch's meta device, from the ``config.json`` an export writes
    for it (jzero.checkpoint.hf.hf_config): the shape, the biases, the norms and the tying agree."""
    import torch
    import transformers

    model = load_config(str(ROOT / "configs" / f"{name}.yaml")).model
    raw = hf_config(model, "bfloat16")
    config = transformers.AutoConfig.for_model(raw.pop("model_type"), **raw)
    with torch.device("meta"):
        built = transformers.AutoModelForCausalLM.from_config(config)
    assert type(built).__name__ == raw["architectures"][0]
    assert param_count(model) == sum(p.numel() for p in built.parameters())
