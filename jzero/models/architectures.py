"""The architecture table: one row per ``model.name`` of jzero's own models, what its layers compute
and how Hugging Face names its tensors. Readable before JAX starts (the config layer reads it).

jzero's GPT is its own module (:mod:`jzero.models.gpt`); every other row is the one decoder of
:mod:`jzero.models.decoder`, which reads its row: Llama, Qwen2 (and 2.5), Qwen3, Mistral, Gemma 2 and
Gemma 3 (text). What varies between them is a field here; what a checkpoint chooses (its sizes, its
sliding window, its soft-caps) is a ``model:`` key (:data:`KEYS`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["ARCHITECTURES", "DECODERS", "Architecture", "architecture", "by_hf_class", "hf_names"]

# The ``model:`` keys every one of jzero's models reads, and those of the decoder rows.
SHARED_KEYS = (
    "vocab_size", "d_model", "n_layers", "n_heads", "seq_len", "remat", "tie_embeddings", "partition_activations", "attention",
)  # fmt: skip
_DECODER_KEYS = (*SHARED_KEYS, "n_kv_heads", "mlp_hidden", "head_dim", "rope_theta", "rope_scaling", "rms_norm_eps")
_WINDOW = ("sliding_window", "layer_types")
_GEMMA = (*_WINDOW, "attn_scalar", "attn_softcap", "final_softcap")
# transformers' defaults (4.57's config classes) for the keys jzero reads
_HF_LLAMA = (("rope_theta", 10_000.0), ("rms_norm_eps", 1e-6), ("tie_word_embeddings", False))
_HF_QWEN = (
    *_HF_LLAMA, ("num_key_value_heads", 32), ("use_sliding_window", False), ("sliding_window", 4096), ("max_window_layers", 28),
)  # fmt: skip
_HF_GEMMA = (
    ("num_key_value_heads", 4), ("head_dim", 256), ("rope_theta", 10_000.0), ("rms_norm_eps", 1e-6),
    ("tie_word_embeddings", True), ("query_pre_attn_scalar", 256), ("sliding_window", 4096),
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Architecture:
    """What one family's layers compute, beyond the sizes a checkpoint picks.

    Attributes:
      name: its ``model.name``.
      hf_class: ``config.json``'s ``architectures`` entry (None: jzero's own, no Hugging Face form).
      model_types: ``config.json``'s ``model_type`` values it reads.
      keys: the ``model:`` keys it reads; the others must keep their defaults.
      norm_plus_one: RMSNorm multiplies by ``1 + weight`` in float32, its weight starting at 0 (Gemma).
      sandwich_norms: a norm after attention and after the MLP too, before each residual add (Gemma 2
        and 3): four per layer, the MLP's input norm named ``pre_feedforward_layernorm``.
      activation: the gated MLP's: ``silu`` (SwiGLU) or ``gelu_tanh`` (GeGLU, tanh's approximation).
      qkv_bias: the query, key and value projections have biases (Qwen2); the output's has none.
      qk_norm: an RMSNorm over each query and key head before rotary positions (Qwen3, Gemma 3).
      embed_scale: the token embedding times ``sqrt(d_model)``, rounded to the compute dtype (Gemma).
      sliding_every: Hugging Face's layer pattern when ``config.json`` gives no ``layer_types``:
        every ``sliding_every``-th layer full, the others sliding (Gemma 2: 2, Gemma 3: 6); 0: every
        layer sliding once a window is set (Mistral), or as ``max_window_layers`` says (Qwen).
      local_rope: the sliding layers rotate with their own base, ``rope_local_theta``, unscaled (Gemma 3).
      hf_defaults: what transformers' config class takes for a key ``config.json`` leaves out
        (the keys jzero reads), as ``(key, value)`` pairs.
    """

    name: str
    hf_class: str | None
    model_types: tuple[str, ...]
    keys: tuple[str, ...]
    norm_plus_one: bool = False
    sandwich_norms: bool = False
    activation: str = "silu"
    qkv_bias: bool = False
    qk_norm: bool = False
    embed_scale: bool = False
    sliding_every: int = 0
    local_rope: bool = False
    hf_defaults: tuple[tuple[str, Any], ...] = ()

    @property
    def mlp_norm(self) -> str:
        """The name of the norm before the MLP (Hugging Face's)."""
        return "pre_feedforward_layernorm" if self.sandwich_norms else "post_attention_layernorm"


ARCHITECTURES = (
    Architecture("gpt", None, (), (*SHARED_KEYS, "mlp_ratio"), activation="gelu"),
    Architecture("llama", "LlamaForCausalLM", ("llama",), _DECODER_KEYS, hf_defaults=_HF_LLAMA),
    Architecture("qwen2", "Qwen2ForCausalLM", ("qwen2",), (*_DECODER_KEYS, *_WINDOW), qkv_bias=True, hf_defaults=_HF_QWEN),
    Architecture(
        "qwen3", "Qwen3ForCausalLM", ("qwen3",), (*_DECODER_KEYS, *_WINDOW), qk_norm=True,
        hf_defaults=(*_HF_QWEN, ("head_dim", 128)),
    ),  # fmt: skip
    Architecture(
        "mistral", "MistralForCausalLM", ("mistral",), (*_DECODER_KEYS, "sliding_window"),
        hf_defaults=(*_HF_LLAMA, ("num_key_value_heads", 8), ("sliding_window", 4096)),
    ),  # fmt: skip
    Architecture(
        "gemma2", "Gemma2ForCausalLM", ("gemma2",), (*_DECODER_KEYS, *_GEMMA),
        norm_plus_one=True, sandwich_norms=True, activation="gelu_tanh", embed_scale=True, sliding_every=2,
        hf_defaults=(*_HF_GEMMA, ("final_logit_softcapping", 30.0), ("attn_logit_softcapping", 50.0)),
    ),  # fmt: skip
    Architecture(
        "gemma3", "Gemma3ForCausalLM", ("gemma3_text",), (*_DECODER_KEYS, *_GEMMA, "rope_local_theta"),
        norm_plus_one=True, sandwich_norms=True, activation="gelu_tanh", qk_norm=True, embed_scale=True,
        sliding_every=6, local_rope=True,
        hf_defaults=(*_HF_GEMMA, ("rope_theta", 1_000_000.0), ("rope_local_base_freq", 10_000.0)),
    ),  # fmt: skip
)
_BY_NAME = {a.name: a for a in ARCHITECTURES}
DECODERS = tuple(a.name for a in ARCHITECTURES if a.hf_class is not None)  # the rows jzero.models.decoder builds


def architecture(name: str) -> Architecture:
    """The row of ``model.name`` ``name`` (KeyError for a model of your own)."""
    return _BY_NAME[name]


def by_hf_class(classes: list[str], model_type: str | None) -> Architecture | None:
    """The row a ``config.json`` names, by ``architectures`` first, then ``model_type``; None if none."""
    for a in ARCHITECTURES:
        if a.hf_class is not None and a.hf_class in classes:
            return a
    return next((a for a in ARCHITECTURES if model_type in a.model_types), None)


def hf_names(arch: Architecture, tied: bool) -> dict[str, tuple[str, bool]]:
    """jzero's parameter path -> (Hugging Face's tensor, ``{}`` the layer of a stacked one; whether
    transposed: PyTorch's ``Linear`` keeps ``[out, in]``, Flax's ``Dense`` ``[in, out]``)."""
    layer = "model.layers.{}."
    names = {"embed_tokens/embedding": ("model.embed_tokens.weight", False), "norm/scale": ("model.norm.weight", False)}
    norms = ["input_layernorm", "post_attention_layernorm"]
    norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"] if arch.sandwich_norms else []
    names |= {f"layers/{n}/scale": (f"{layer}{n}.weight", False) for n in norms}
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        names[f"layers/{proj}/kernel"] = (f"{layer}self_attn.{proj}.weight", True)
        if arch.qkv_bias and proj != "o_proj":
            names[f"layers/{proj}/bias"] = (f"{layer}self_attn.{proj}.bias", False)
    if arch.qk_norm:
        names |= {f"layers/{n}/scale": (f"{layer}self_attn.{n}.weight", False) for n in ("q_norm", "k_norm")}
    names |= {f"layers/{p}/kernel": (f"{layer}mlp.{p}.weight", True) for p in ("gate_proj", "up_proj", "down_proj")}
    if not tied:
        names["lm_head/kernel"] = ("lm_head.weight", True)
    return names
