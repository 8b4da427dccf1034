"""The GPT's attention: ``jax.nn.dot_product_attention``, XLA's on CPU and cuDNN's flash kernel on
GPU targets (jzero.models.gpt.causal_attention, jzero.models.config.attention_for)."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.cli import one_line_error, sets
from support.configs import BF16, tiny_config

from jzero.compiler.platforms import flash_attention_available
from jzero.errors import ConfigError
from jzero.memory.config import PrecisionConfig
from jzero.models.config import attention_for
from jzero.models.gpt import attend, causal_attention, rotary
from jzero.training.job import build_job

LENGTH = 64


def _exact(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Causal softmax attention in float64, positions already applied."""
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    length = q.shape[1]
    logits = np.where(np.tril(np.ones((length, length), bool)), logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    return np.einsum("bhqk,bkhd->bqhd", weights / weights.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_xla_attention_equals_the_softmax_formula_within_its_floor(dtype):
    """The new attention against the formula jzero used before (``attend`` with a causal mask): both
    against float64, the new one no further than twice the old one's own rounding error."""
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 64, 4, 16)).astype(dtype) for i in range(3))
    length = q.shape[1]
    old = attend(rotary(q), rotary(k), v, jnp.tril(jnp.ones((length, length), bool)), dtype)
    new = causal_attention(q, k, v, "xla")
    exact = _exact(*(np.asarray(x, np.float64) for x in (rotary(q), rotary(k), v)))
    floor = np.abs(np.asarray(old, np.float64) - exact).max()
    assert new.dtype == dtype and 0 < floor < 0.05
    assert np.abs(np.asarray(new, np.float64) - np.asarray(old, np.float64)).max() <= 2 * floor


def _logits_buffers(hlo: str, length: int) -> list[str]:
    """f32 [batch, heads, T, T] arrays: attention's logits (or its probabilities) materialised."""
    return re.findall(rf"f32\[\d+,\d+,{length},{length}\]", hlo)


def test_the_gpu_target_uses_cudnn_flash_attention_and_no_t_by_t_logits(h100x8):  # noqa: F811
    """gpt-tiny in bf16 on h100x8: cuDNN's fused attention forward and backward in the program, and no
    f32 [.., T, T] buffer, where XLA's attention has them."""
    assert flash_attention_available(), "the gpu-target extra installs nvidia-cudnn-cu12"
    programs = {}
    for attention in ("auto", "xla"):
        # A length unlike every other size of the model, so that [.., T, T] is only attention's.
        overrides = ("zero.stage=3", *BF16, "mesh.axes.data=8", f"model.seq_len={LENGTH}", f"model.attention={attention}")
        job = build_job(tiny_config(*overrides), h100x8)
        programs[job.model.attention] = job.compile_step()[1].as_text()
    assert "__cudnn$fmhaSoftmax" in programs["cudnn"] and "__cudnn$fmhaSoftmaxBackward" in programs["cudnn"]
    assert not _logits_buffers(programs["cudnn"], LENGTH) and _logits_buffers(programs["xla"], LENGTH)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["model.attention=flash"], "model.attention: must be auto, xla or cudnn, got 'flash'"),
        (["model.attention=cudnn"], "model.attention: cudnn: needs GPUs (or a GPU --target)"),
    ],
)
def test_bad_attention_settings_are_one_line(capsys, overrides, fragment):
    one_line_error(capsys, ["plan", "configs/gpt-tiny.yaml", *sets(*overrides)], fragment)


def test_each_attention_setting_resolves_for_the_devices_and_the_compute_dtype(h100x8):
    """``auto`` is cuDNN's only on GPUs with 16-bit compute; ``cudnn`` elsewhere names why not."""
    bf16, fp32 = PrecisionConfig(param_dtype="bfloat16").build(), PrecisionConfig().build()
    cpus = jax.devices()
    assert attention_for("auto", h100x8, bf16) == "cudnn" and attention_for("cudnn", h100x8, bf16) == "cudnn"
    assert attention_for("auto", h100x8, fp32) == "xla" and attention_for("auto", cpus, bf16) == "xla"
    assert attention_for("xla", h100x8, bf16) == "xla"
    assert attention_for("auto", h100x8, bf16, softcap=50.0) == "xla"  # Gemma 2's soft-cap: cuDNN does not compute it
    with pytest.raises(ConfigError, match=r"^model\.attention: cudnn: soft-capped logits"):
        attention_for("cudnn", h100x8, bf16, softcap=50.0)
    with pytest.raises(ConfigError, match=r"^model\.attention: cudnn: needs 16-bit compute"):
        attention_for("cudnn", h100x8, fp32)
    with pytest.raises(ConfigError, match=r"^model\.attention: cudnn: needs GPUs"):
        attention_for("cudnn", cpus, bf16)


def test_sliding_windows_go_to_cudnns_kernel_on_a_gpu_target(h100x8):  # noqa: F811
    """A Gemma 3 row in bf16 on h100x8, a window of 16 under 64 positions on layers 0 and 2 of 3: each
    kind of layer compiles to cuDNN's fused attention with its own window (the layers' scan takes a
    branch per kind), no f32 [.., T, T] buffer, and the plan report counts the calls by window. With
    every layer sliding, the FLOP counter counts attention over the keys each query sees: fewer
    than under a window as long as the sequence."""
    from jzero.ledger.flops import matmul_flops
    from jzero.ledger.render import format_plan
    from jzero.training.report import plan_report

    row = ["model.name=gemma3", "model.d_model=64", "model.n_layers=3", "model.n_heads=4", "model.n_kv_heads=2",
           "model.head_dim=16", "model.mlp_hidden=128", f"model.seq_len={LENGTH}"]  # fmt: skip
    base = ["zero.stage=3", *BF16, "mesh.axes.data=8", *row]
    mixed = build_job(tiny_config(*base, "model.sliding_window=16", "model.layer_types=[sliding, full, sliding]"), h100x8)
    report = plan_report(mixed)
    assert report.attention == "cudnn" and set(report.attention_windows) == {"0", "16"}
    calls = ", ".join(f"{w}: {report.attention_windows[k]}" for w, k in (("no window", "0"), ("a window of 16", "16")))
    assert f"  cuDNN's fused calls (forward and backward) by sliding window: {calls}" in format_plan(report).splitlines()
    assert not _logits_buffers(mixed.compile_step()[1].as_text(), LENGTH)
    sliding = "model.layer_types=[sliding, sliding, sliding]"
    windowed, whole = (
        matmul_flops(build_job(tiny_config(*base, f"model.sliding_window={w}", sliding), h100x8).compile_step()[1].as_text())
        for w in (16, LENGTH)
    )
    assert windowed.executed < whole.executed
