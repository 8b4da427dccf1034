"""jzero's models' sizes and model FLOPs, and what the GPT's layers save for the backward, from their
shape alone, without building them or importing JAX: what config validation needs to refuse a model
too large to count, what MFU divides by, and the formula the ledger sets the saved activations against.

The functions that take ``m`` read a ``model:`` section's fields (:class:`jzero.models.config.ModelConfig`
or anything with them) for either model (:data:`jzero.models.names.KEYS`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from jzero.models.architectures import architecture
from jzero.models.names import DECODERS

__all__ = [
    "SAVED_BY_POLICY",
    "LayerShape",
    "attention_flops_per_token",
    "layer_shape",
    "matmul_params",
    "flops_per_token",
    "kv_heads",
    "mlp_units",
    "param_count",
    "gpt_flops_per_token",
    "gpt_matmul_params",
    "gpt_param_count",
    "gpt_saved_per_layer",
    "gpt_saved_role",
    "head_size",
    "sliding_layers",
]

# What each remat policy keeps of a GPT layer (docs/offload.md, "What a layer saves"): its input,
# the q, k and v projections, attention (cuDNN's output and softmax statistics, or XLA's float32
# scores and weighted values), the output projection and the MLP's first matmul. Everything else
# (norms, rotary, GELU, the residual adds) is recomputed from these; offload_dots keeps the same
# as dots_with_no_batch_dims_saveable but in host memory (the ledger reads which).
_PROJECTIONS = ("input", "query", "key", "value", "attn_out", "mlp_in")
SAVED_BY_POLICY: dict[str, tuple[str, ...]] = {
    "none": (*_PROJECTIONS, "attention"),
    "full": ("input",),
    "dots_saveable": (*_PROJECTIONS, "attention(xla)"),
    "dots_with_no_batch_dims_saveable": _PROJECTIONS,
    "offload_dots": _PROJECTIONS,
}


@dataclasses.dataclass(frozen=True)
class LayerShape:
    """One transformer layer of either model, by its shape: the weights each token multiplies by
    and the values it saves for the backward, per token. The one table the model FLOPs
    (:func:`flops_per_token`), the planner's estimate (:mod:`jzero.planner.candidates`) and the
    GPT's saved-bytes formula read.

    Attributes:
      d_model: the width.
      n_heads: query heads.
      kv_heads: key and value heads (fewer than ``n_heads`` with grouped-query attention).
      mlp_hidden: the MLP's hidden units.
      gated: a gated MLP (the Llama's SwiGLU: gate and up projections) rather than one input projection.
      head_dim: one head's size (None: ``d_model / n_heads``; Gemma's and Qwen3's are set apart).
    """

    d_model: int
    n_heads: int
    kv_heads: int
    mlp_hidden: int
    gated: bool
    head_dim: int | None = None

    @property
    def q_width(self) -> int:
        """The query's (and attention's output) width: ``n_heads`` x ``head_dim``."""
        return self.d_model if self.head_dim is None else self.n_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """The key's (and the value's) width: ``kv_heads`` x ``head_dim``."""
        return self.q_width * self.kv_heads // self.n_heads

    @property
    def matmul_params(self) -> int:
        """q and o (2 d q_width), k and v (2 d kv_width), the MLP (2 or, gated, 3 d mlp_hidden)."""
        mlp = (3 if self.gated else 2) * self.d_model * self.mlp_hidden
        return 2 * self.d_model * self.q_width + 2 * self.d_model * self.kv_width + mlp

    def values_per_token(self) -> dict[str, int]:
        """Elements per token of each value a layer can save (:data:`SAVED_BY_POLICY`'s kinds):
        ``mlp_in`` is the MLP's first matmul (both of a gated MLP's), ``attention`` its output."""
        d, q, kv = self.d_model, self.q_width, self.kv_width
        mlp_in = self.mlp_hidden * (2 if self.gated else 1)
        return {"input": d, "query": q, "key": kv, "value": kv, "attn_out": d, "mlp_in": mlp_in, "attention": q}

    def saved_per_token(self, policy: str) -> int:
        """Elements per token one layer saves under a remat policy (cuDNN's attention: its output)."""
        values = self.values_per_token()
        return sum(values[kind.removesuffix("(xla)")] for kind in SAVED_BY_POLICY[policy])

    def working_per_token(self) -> int:
        """Elements per token a layer holds while its backward runs: every value it can save and the
        MLP's activation."""
        return sum(self.values_per_token().values()) + self.mlp_hidden


def layer_shape(m: Any) -> LayerShape:
    """The :class:`LayerShape` of a ``model:`` section (any row of the architecture table)."""
    head_dim = getattr(m, "head_dim", None) if m.name in DECODERS else None
    return LayerShape(m.d_model, m.n_heads, kv_heads(m), mlp_units(m), m.name in DECODERS, head_dim)


def matmul_params(m: Any) -> int:
    """The weights every token of a ``model:`` section's model multiplies by: its layers'
    (:attr:`LayerShape.matmul_params`) and the LM head's (V d, tied or not). The token embedding's
    lookup is a gather, not a matmul; biases and norms are elementwise."""
    return m.n_layers * layer_shape(m).matmul_params + m.vocab_size * m.d_model


def gpt_param_count(vocab_size: int, d_model: int, n_layers: int, mlp_ratio: int) -> int:
    """The GPT's parameter count, to the leading terms: embedding and head, then per layer the
    attention (4 d^2) and MLP (2 r d^2) kernels."""
    return 2 * vocab_size * d_model + n_layers * (4 + 2 * mlp_ratio) * d_model**2


def gpt_matmul_params(vocab_size: int, d_model: int, n_layers: int, mlp_ratio: int) -> int:
    """The GPT's weights every token multiplies by (:func:`matmul_params`): per layer the q, k, v
    and output projections (4 d^2) and the MLP (2 r d^2), then the LM head (V d)."""
    layer = LayerShape(d_model, 1, 1, mlp_ratio * d_model, gated=False)
    return n_layers * layer.matmul_params + vocab_size * d_model


def gpt_flops_per_token(vocab_size: int, d_model: int, n_layers: int, mlp_ratio: int, seq_len: int) -> int:
    """Training FLOPs per token the GPT needs (PaLM, Chowdhery et al. 2022, appendix B): 6 N for the
    forward and backward matmuls over N :func:`gpt_matmul_params`, plus 12 L T d for attention's
    scores and weighted values at sequence length T. Remat's recomputation is not counted."""
    return 6 * gpt_matmul_params(vocab_size, d_model, n_layers, mlp_ratio) + 12 * n_layers * seq_len * d_model


def mlp_units(m: Any) -> int:
    """The MLP's hidden units: the GPT's ``mlp_ratio`` x ``d_model``; a decoder's ``mlp_hidden``, or
    Meta's rule without it (8/3 ``d_model`` rounded up to a multiple of 256)."""
    if m.name not in DECODERS:
        return m.mlp_ratio * m.d_model
    return m.mlp_hidden if m.mlp_hidden is not None else 256 * math.ceil(8 * m.d_model / 3 / 256)


def kv_heads(m: Any) -> int:
    """The key and value heads: a decoder's ``n_kv_heads`` (default ``n_heads``); the GPT's ``n_heads``."""
    return m.n_kv_heads if m.name in DECODERS and m.n_kv_heads is not None else m.n_heads


def head_size(m: Any) -> int:
    """One attention head's size: ``head_dim`` where a decoder sets it, else ``d_model / n_heads``."""
    given = getattr(m, "head_dim", None) if m.name in DECODERS else None
    return given if given is not None else m.d_model // m.n_heads


def sliding_layers(m: Any) -> tuple[bool, ...]:
    """Which layers attend to a sliding window (``model.sliding_window``) rather than every earlier
    position: ``layer_types`` where given, else the row's pattern (``sliding_every``: Gemma's), else
    every layer once a window is set (Mistral's). All False without a window."""
    window = getattr(m, "sliding_window", None) if m.name in DECODERS else None
    if window is None:
        return (False,) * m.n_layers
    if getattr(m, "layer_types", None) is not None:
        return tuple(kind == "sliding" for kind in m.layer_types)
    every = architecture(m.name).sliding_every
    return tuple(bool((i + 1) % every) if every else True for i in range(m.n_layers))


def param_count(m: Any) -> int:
    """A ``model:`` section's parameter count (the GPT's to its leading terms, a decoder's exactly:
    its matmul weights, the embedding unless tied, its norms' scales, biases and query/key norms as
    its row of the architecture table has them)."""
    if m.name not in DECODERS:
        return gpt_param_count(m.vocab_size, m.d_model, m.n_layers, m.mlp_ratio)
    arch, layer = architecture(m.name), layer_shape(m)
    per_layer = (4 if arch.sandwich_norms else 2) * m.d_model
    per_layer += (layer.q_width + 2 * layer.kv_width) if arch.qkv_bias else 0
    per_layer += 2 * head_size(m) if arch.qk_norm else 0
    embedding = 0 if m.tie_embeddings else m.vocab_size * m.d_model
    return matmul_params(m) + embedding + m.n_layers * per_layer + m.d_model


def flops_per_token(m: Any) -> int:
    """Training FLOPs per token of a ``model:`` section's model: 6 N over its matmul weights N plus
    attention's (:func:`attention_flops_per_token`)."""
    return 6 * matmul_params(m) + attention_flops_per_token(m)


def attention_flops_per_token(m: Any) -> int:
    """Attention's training FLOPs per token: 12 T q_width per layer (:func:`gpt_flops_per_token`'s
    counting, 12 L T d for the GPT: scores and weighted values, forward and backward), where a
    sliding layer's query sees ``min(T, sliding_window)`` positions instead of T."""
    width = layer_shape(m).q_width
    window = (getattr(m, "sliding_window", None) if m.name in DECODERS else None) or m.seq_len
    spans = sum(min(m.seq_len, window) if sliding else m.seq_len for sliding in sliding_layers(m))
    return 12 * spans * width


def gpt_saved_per_layer(
    policy: str,
    rows: int,
    seq_len: int,
    d_model: int,
    n_heads: int,
    mlp_ratio: int,
    *,
    dtype_bytes: int,
    attention: str,
    model_parallel: int = 1,
    partitioned: bool = False,
) -> dict[str, int]:
    """Bytes one GPT layer saves for the backward per device, by kind, under a remat policy.

    Args:
      policy: a remat policy's name (:data:`SAVED_BY_POLICY`).
      rows: the batch rows a device computes at once (one microbatch's).
      seq_len, d_model, n_heads, mlp_ratio: the model's shape.
      dtype_bytes: the compute dtype's size (2 for bfloat16).
      attention: ``xla`` or ``cudnn``.
      model_parallel: N_m; heads and the MLP's hidden units are split over it.
      partitioned: the layer's input is split over ``model`` too (ZeRO-R's P_a).

    Returns:
      ``{kind: bytes}``. For 16-bit compute, ``none`` is (6 + mlp_ratio) s b h bytes plus cuDNN's
      4 b a s of softmax statistics (20 s b h at mlp_ratio 4, against Korthikanti et al.'s 34 s b h,
      which also keeps the norms' outputs, the GELU's output and dropout masks), ``full`` 2 s b h.
    """
    sbh, split = rows * seq_len * d_model, model_parallel
    attention_bytes = (
        {"attention": sbh // split * dtype_bytes + rows * n_heads // split * seq_len * 4}
        if attention == "cudnn"
        else {"attention": rows * n_heads // split * seq_len * seq_len * 4 + sbh // split * dtype_bytes}
    )
    every = {
        "input": sbh // (split if partitioned else 1) * dtype_bytes,
        **{name: sbh // split * dtype_bytes for name in ("query", "key", "value")},
        "attn_out": sbh // (split if partitioned else 1) * dtype_bytes,  # reduce-scattered along the sequence
        "mlp_in": sbh * mlp_ratio // split * dtype_bytes,
        **attention_bytes,
    }
    kept = [k.removesuffix("(xla)") for k in SAVED_BY_POLICY[policy] if not (k.endswith("(xla)") and attention != "xla")]
    return {kind: every[kind] for kind in kept}


def gpt_saved_role(kind: str, shape: list[int]) -> str:
    """The formula's kind of a saved stack named by its producing op (``query/dot_general``, ``input``,
    ``attention/cudnn``) and shaped ``shape`` (one layer's). Any other op of the block itself is
    attention's own matmuls under XLA (per head: more than 3 dimensions) or the residual stream that
    is the next layer's input ([rows, seq, d_model])."""
    module = kind.split("/")[0]
    if module in (*_PROJECTIONS, "attention"):
        return module
    return "attention" if len(shape) > 3 else "input"
