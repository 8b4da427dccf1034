"""jzero's Llama against Hugging Face's: the same logits from the same checkpoint, on any mesh."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.cli import sets
from support.hf_llama import SHAPE, hf_greedy, hf_logits, write_hf_llama, write_tokenizer
from support.reference import MARGIN, ULPS

from jzero.checkpoint.hf import HFCheckpoint, model_section, placed_params
from jzero.cli.main import main
from jzero.config.loading import load_config
from jzero.data.tokenizer import load_tokenizer
from jzero.models.decoder import Decoder
from jzero.models.layers import rope_frequencies
from jzero.models.sizes import flops_per_token, param_count
from jzero.step import activation_rules
from jzero.training.job import build_job


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return write_hf_llama(tmp_path_factory.mktemp("hf") / "tiny-llama")


def _words(hf_dir, *sets):
    return [f"model.{k}={v!r}".replace("'", '"').replace("True", "true").replace("False", "false").replace("None", "null")
            for k, v in model_section(hf_dir).items()] + ["model.seq_len=16", "train.global_batch_size=8", *sets]  # fmt: skip


def _logits(hf_dir, tokens, *sets):
    """jzero's logits for ``tokens`` from the checkpoint, its weights placed as ``sets``' plan says."""
    job = build_job(load_config(None, _words(hf_dir, *sets)))
    params = placed_params(hf_dir, job.plan)
    with activation_rules(job.plan):
        out = jax.jit(lambda p, t: job.model.apply({"params": p}, t))(params, jnp.asarray(tokens))
    return np.asarray(out)


TOKENS = np.random.default_rng(0).integers(0, SHAPE["vocab_size"], (4, 16))


def test_the_config_reads_as_jzeros_llama(hf_dir):
    section = model_section(hf_dir)
    assert section == {
        "name": "llama", "vocab_size": 320, "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "mlp_hidden": 96,
        "head_dim": 16,
        "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_embeddings": False, "seq_len": 64,
        "rope_scaling": {"rope_type": "llama3", **{k: v for k, v in SHAPE["rope_scaling"].items() if k != "rope_type"}},
    }  # fmt: skip
    model = load_config(None, _words(hf_dir)).model
    weights = HFCheckpoint(hf_dir)
    assert param_count(model) == sum(a.size for a in weights.tensors.values())  # the formula, exactly
    assert flops_per_token(model) > 6 * param_count(model) - 6 * 320 * 64  # the lookup is no matmul


MESHES = {
    "0-dp8": ["zero.stage=0", "mesh.axes={data: 8}"],
    "3-dp8": ["zero.stage=3", "mesh.axes={data: 8}"],
    "3-dp4-mp2": ["zero.stage=3", "mesh.axes={data: 4, model: 2}"],
}


@pytest.mark.parametrize("sets", list(MESHES.values()), ids=list(MESHES))
def test_logits_equal_transformers(hf_dir, devices, sets):
    """The floor: jzero's own logits on one device against the mesh's (another order of the sums
    over model shards and batch rows); transformers' must lie within MARGIN times it, plus ULPS ulps.
    Measured here: gaps 1.9e-7 to 2.5e-7 against floors of 2.4e-7 (0.11 of the tolerance); with
    rope_scaling ignored the gap was 6.0e-3, with RMSNorm's eps doubled 8.9e-3."""
    want = hf_logits(hf_dir, TOKENS)
    one = _logits(hf_dir, TOKENS, "mesh.axes={data: 1}", "train.global_batch_size=4")
    got = _logits(hf_dir, TOKENS, *sets, "train.global_batch_size=8") if sets else one
    floor = float(np.max(np.abs(one - got)))
    gap = float(np.max(np.abs(got - want)))
    assert gap <= MARGIN * floor + ULPS * np.finfo(np.float32).eps * float(np.max(np.abs(want))), (gap, floor)


def test_llama3_rope_scaling_divides_only_the_long_wavelengths():
    """Llama 3.1's rule, worked by hand for head_dim 16 and base 10000 (context 32, factor 8, low 1,
    high 4): a wavelength 2 pi / freq under 32 / 4 = 8 positions is kept, one over 32 / 1 divided
    by 8, one between blended by (32 / wavelength - 1) / (4 - 1). Here the wavelengths are 6.3,
    19.9, 62.8, ... positions: one of each kind, then six divided. No sum in it, so no reordering
    floor: float32 powers and quotients against float64, measured 6.4e-8 and 9.0e-8 relative at the
    most (under one float32 ulp, 1.2e-7); rtol 1e-6 is about 8 ulps, 11x the larger gap."""
    plain = np.asarray(rope_frequencies(16, 10_000.0))
    np.testing.assert_allclose(plain, 10.0 ** -(np.arange(8) / 2), rtol=1e-6)
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    got = np.asarray(rope_frequencies(16, 10_000.0, scaling))
    smooth = (32 / (2 * np.pi / plain[1]) - 1) / 3
    want = [plain[0], (1 - smooth) * plain[1] / 8 + smooth * plain[1], *(plain[2:] / 8)]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_llama_config_builds_jzeros_llama_and_refuses_what_it_does_not_read():
    job = build_job(load_config(None, ["model.name=llama", "model.d_model=32", "model.n_layers=2", "model.n_heads=4",
                                       "model.n_kv_heads=2", "model.seq_len=16", "train.global_batch_size=8"]))  # fmt: skip
    assert isinstance(job.model, Decoder) and job.model.mlp_hidden == 256  # Meta's rule: 8/3 x 32 up to 256
    kv = next(t for t in job.plan.tensors if t.path == "layers/k_proj/kernel")
    assert kv.shape == (2, 32, 16)  # [layers, d_model, n_kv_heads x head_dim]


def test_greedy_sampling_gives_transformers_tokens(devices, tmp_path, capsys):
    """``jzero sample --temperature 0`` of an imported run prints what transformers' greedy
    ``generate`` makes, 32 tokens (or up to the end-of-document token) after a prompt. The weights'
    scale (initializer_range 0.2) makes each step's largest logit stand clear of the next."""
    hf = write_hf_llama(tmp_path / "hf", seed=2, initializer_range=0.2)
    eos = write_tokenizer(hf, SHAPE["vocab_size"])
    run = tmp_path / "run"
    small = sets("train.global_batch_size=8", "data.max_bytes=200000")
    assert main(["checkpoint", "import", str(hf), "--out", str(run), *small]) == 0
    assert "its tokenizer" in capsys.readouterr().out
    tokenizer = load_tokenizer(hf / "tokenizer.json")
    prompt = "def wrap(text, width):"
    want = hf_greedy(hf, tokenizer.encode(prompt), 32, eos)
    assert len(want) >= 8  # a continuation worth comparing
    assert main(["sample", str(run), "--prompt", prompt, "--temperature", "0", "--max-tokens", "32"]) == 0
    got = capsys.readouterr().out
    assert got == tokenizer.decode(want) + "\n"  # the command ends its output with a newline


def test_keys_config_json_leaves_out_take_transformers_defaults(tmp_path):
    """A Llama 2-era config.json without rope_theta, rms_norm_eps, num_key_value_heads or
    tie_word_embeddings reads as transformers' LlamaConfig reads it: 10000, 1e-6, n_heads, untied."""
    import json

    shape = {"architectures": ["LlamaForCausalLM"], "vocab_size": 320, "hidden_size": 64, "intermediate_size": 96,
             "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(shape))
    section = model_section(tmp_path)
    assert (section["rope_theta"], section["rms_norm_eps"], section["tie_embeddings"]) == (10_000.0, 1e-6, False)
    model = load_config(None, [f"model.{k}={json.dumps(v)}" for k, v in section.items()]).model
    assert model.n_kv_heads is None and param_count(model) == 2 * 320 * 64 + 2 * (4 * 64 * 64 + 3 * 64 * 96 + 2 * 64) + 64
