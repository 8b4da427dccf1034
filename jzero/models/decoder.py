"""The decoder of every Hugging Face family jzero reads, in flax.linen: Llama, Qwen2, Qwen3, Mistral,
Gemma 2 and Gemma 3 (text), each a row of :mod:`jzero.models.architectures`.

A layer is RMSNorm, attention and a gated MLP, as Hugging Face's ``*ForCausalLM`` computes it.
Its row says what varies: ``1 + weight`` norms and norms after attention and the MLP (Gemma),
GeGLU or SwiGLU, query/key/value biases (Qwen2), query/key norms (Qwen3, Gemma 3), the embedding's
``sqrt(d_model)`` (Gemma), and where the sliding layers rotate with their own base (Gemma 3). The
``model:`` section says the rest: grouped-query heads, an explicit ``head_dim``, sliding windows on
all or some layers, soft-capped logits, the query scale.

As for the GPT (:mod:`jzero.models.gpt`): parameters carry logical axis names (``heads``,
``kv_heads`` and ``mlp`` go on the ``model`` axis), the layers are one ``nn.scan`` so stage 3 gathers
them one at a time, rematerialised by a named policy, and ``partition_activations``,
``fetch_params`` and ``gather`` work the same. Parameter names follow Hugging Face's
(``layers/q_proj/kernel`` is ``model.layers.N.self_attn.q_proj.weight``, transposed:
:func:`jzero.models.architectures.hf_names`).

The KV cache is an optional input of the layer, as Flax's ``decode=True`` is: the same layer runs
the training forward and a decode step (:mod:`jzero.models.decode` keeps only the loop).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jzero.communication.gather import gathering
from jzero.dtypes import FP8_RECIPES
from jzero.models.architectures import Architecture, architecture
from jzero.models.layers import (
    BATCH_ACT,
    SAVED_ACT,
    Cache,
    annotated,
    attention,
    cached,
    dense,
    head_policy,
    layer_inputs,
    layer_stack,
    lookup,
    rope_frequencies,
    rotary,
    tied_logits,
)
from jzero.models.lora import LoraSpec
from jzero.models.names import ATTENTION, LLAMA

__all__ = ["Decoder", "DecoderBlock", "RMSNorm", "rope_scaling_pairs"]

_INIT = nn.initializers.normal(0.02)  # Hugging Face's initializer_range
MLP_ACT = ("batch", "length", "mlp")
_ACTIVATIONS = {"silu": nn.silu, "gelu_tanh": lambda x: nn.gelu(x, approximate=True)}
_GATED = ("gate_proj", "up_proj")
FULL, SLIDING, MIXED = "full", "sliding", "mixed"  # how a stack's layers attend (DecoderBlock.kinds)


def rope_scaling_pairs(scaling: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...] | None:
    """``rope_scaling`` as sorted pairs: a Flax module's fields must hash."""
    return tuple(sorted(scaling.items())) if scaling else None


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps)`` in float32, then times ``scale`` (Llama's: cast back first) or,
    with ``plus_one``, times ``1 + scale`` in float32 and cast back after (Gemma's, its scale
    starting at 0). ``axis``: the scale's logical name."""

    eps: float = 1e-5
    dtype: jnp.dtype = jnp.float32
    plus_one: bool = False
    axis: str = "embed"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        init = nn.initializers.zeros if self.plus_one else nn.initializers.ones
        scale = self.param("scale", annotated(init, self.axis), (x.shape[-1],))
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        if self.plus_one:
            return (normed * (1.0 + scale.astype(jnp.float32))).astype(self.dtype)
        return normed.astype(self.dtype) * scale.astype(self.dtype)


class DecoderBlock(nn.Module):
    """One layer: ``x + attention(norm(x))``, then ``x + mlp(norm(x))`` (with Gemma's norms after
    each too). Called by a scan with its per-layer input: None, or ``(sliding, cache)``: this layer's
    flag where layers differ (``kinds`` mixed) and its :class:`jzero.models.layers.Cache` when
    decoding. Returns the new ``x`` and the cache with the new tokens (None in training)."""

    arch: str
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    mlp_hidden: int
    rope_theta: float = 500_000.0
    rope_scaling: tuple[tuple[str, Any], ...] | None = None  # rope_scaling_pairs(...)
    rope_local_theta: float = 10_000.0
    rms_norm_eps: float = 1e-5
    kinds: str = FULL  # FULL, SLIDING or MIXED (each layer's flag an input)
    sliding_window: int | None = None
    attn_scale: float | None = None  # None: head_dim**-0.5
    attn_softcap: float | None = None
    dtype: jnp.dtype = jnp.float32
    partition_activations: bool = False
    attention: str = ATTENTION[0]  # one of ATTENTION
    lora: LoraSpec | None = None  # low-rank adapters on the kernels it targets
    fp8: str = FP8_RECIPES[0]  # its projections' GEMMs in float8 (jzero.memory.float8)

    @property
    def row(self) -> Architecture:
        return architecture(self.arch)

    def norm(self, name: str, axis: str = "embed") -> RMSNorm:
        return RMSNorm(self.rms_norm_eps, self.dtype, self.row.norm_plus_one, axis, name=name)

    def linear(self, features: int, in_name: str, out_name: str, name: str, bias: bool = False) -> nn.Dense:
        return dense(features, in_name, out_name, _INIT, name, self.dtype, bias, self.lora, self.path, self.fp8)

    @nn.compact
    def __call__(self, x: jax.Array, layer: Any = None) -> tuple[jax.Array, Cache | None]:
        sliding, cache = layer if layer is not None else (None, None)
        if self.partition_activations:
            x = nn.with_logical_constraint(x, SAVED_ACT)  # the saved input keeps this sharding
        x = nn.with_logical_constraint(x, BATCH_ACT)
        attn, cache = self.attend(self.norm("input_layernorm")(x), sliding, cache)
        x = x + (self.norm("post_attention_layernorm")(attn) if self.row.sandwich_norms else attn)
        h = self.norm(self.row.mlp_norm)(x)
        gate, up = (nn.with_logical_constraint(self.linear(self.mlp_hidden, "embed", "mlp", n)(h), MLP_ACT) for n in _GATED)
        h = self.linear(self.d_model, "mlp", "embed", "down_proj")(_ACTIVATIONS[self.row.activation](gate) * up)
        x = x + (self.norm("post_feedforward_layernorm")(h) if self.row.sandwich_norms else h)
        return nn.with_logical_constraint(x, SAVED_ACT if self.partition_activations else BATCH_ACT), cache

    def attend(self, h: jax.Array, sliding: jax.Array | None, cache: Cache | None) -> tuple[jax.Array, Cache | None]:
        """Self-attention on the normed input, through the cache where there is one."""
        batch, length, _ = h.shape

        def project(name: str, heads: int, logical: str) -> jax.Array:
            out = self.linear(heads * self.head_dim, "embed", logical, name, self.row.qkv_bias)(h)
            out = nn.with_logical_constraint(out, ("batch", "length", logical))
            out = nn.with_logical_constraint(out.reshape(batch, length, heads, self.head_dim), ("batch", "length", logical, "kv"))
            return self.norm(name[0] + "_norm", "kv")(out) if self.row.qk_norm and name != "v_proj" else out

        q = project("q_proj", self.n_heads, "heads")
        k, v = (project(name, self.n_kv_heads, "kv_heads") for name in ("k_proj", "v_proj"))
        at = None if cache is None else cache.start + jnp.arange(length)
        freq = self.frequencies(sliding)
        q, k = rotary(q, at, freq), rotary(k, at, freq)
        positions = None
        if cache is not None:
            k, v, cache, positions = cached(k, v, cache)
        window = None if self.kinds == FULL else self.sliding_window
        out = attention(
            q, k, v, implementation=self.attention, scale=self.attn_scale, softcap=self.attn_softcap, window=window,
            sliding=sliding if self.kinds == MIXED else None, positions=positions,
        )  # fmt: skip
        out = nn.with_logical_constraint(out, ("batch", "length", "heads", "kv")).reshape(batch, length, -1)
        return self.linear(self.d_model, "heads", "embed", "o_proj")(out), cache

    def frequencies(self, sliding: jax.Array | None) -> jax.Array:
        """This layer's rotary frequencies: Gemma 3's sliding layers have their own base, unscaled."""
        full = rope_frequencies(self.head_dim, self.rope_theta, dict(self.rope_scaling) if self.rope_scaling else None)
        if not self.row.local_rope or self.kinds == FULL:
            return full
        local = rope_frequencies(self.head_dim, self.rope_local_theta)
        return local if self.kinds == SLIDING else jnp.where(sliding, local, full)


class Decoder(nn.Module):
    """A decoder of the architecture table (``arch``: its row's ``model.name``); the fields named as
    the ``model:`` section's keys (:meth:`jzero.models.config.ModelConfig.build` resolves them).

    Called on ``tokens`` [batch, length], it returns float32 logits [batch, length, vocab]; with a
    ``cache`` (:class:`jzero.models.decode.KVCache`) and the first token's position ``start``, it
    returns ``(logits, cache)`` with the tokens' keys and values written in."""

    arch: str = LLAMA
    vocab_size: int = 256
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    mlp_hidden: int = 384
    head_dim: int | None = None  # None: d_model / n_heads
    rope_theta: float = 500_000.0
    rope_scaling: tuple[tuple[str, Any], ...] | None = None  # rope_scaling_pairs(config's mapping)
    rope_local_theta: float = 10_000.0
    rms_norm_eps: float = 1e-5
    sliding_window: int | None = None
    layer_types: tuple[bool, ...] | None = None  # whether each layer slides (jzero.models.sizes.sliding_layers)
    attn_scalar: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    tie_embeddings: bool = False
    seq_len: int = 128  # the longest sequence trained on; rotary positions need no table
    remat: str | bool = "full"  # a policy of jzero.memory.remat
    partition_activations: bool = False
    fetch_params: bool = False
    dtype: jnp.dtype = jnp.float32
    attention: str = ATTENTION[0]
    gather: Any = None  # (prefix, params) -> params gathered (jzero.sharding.gathers.model_gather)
    lora: LoraSpec | None = None  # low-rank adapters (jzero.models.lora) on the layers' kernels it targets
    fp8: str = FP8_RECIPES[0]  # the layers' projections' GEMMs in float8 (jzero.memory.float8); the head's stay

    @property
    def head_size(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    def kinds(self) -> tuple[str, jax.Array | None]:
        """How the layers attend, and each layer's flag where they differ."""
        slides = self.layer_types if self.sliding_window is not None and self.layer_types else ()
        if not any(slides):
            return FULL, None
        return (SLIDING, None) if all(slides) else (MIXED, jnp.asarray(slides))

    @nn.compact
    def __call__(self, tokens: jax.Array, cache: Any = None, start: jax.Array | int = 0) -> Any:
        row = architecture(self.arch)
        x, embed = lookup(tokens, self.vocab_size, self.d_model, _INIT, self.gather, "embed_tokens")
        x = x.astype(self.dtype)
        if row.embed_scale:  # Hugging Face rounds sqrt(d_model) to the compute dtype first
            x = x * jnp.asarray(self.d_model**0.5, self.dtype)
        x = nn.with_logical_constraint(x, BATCH_ACT)
        kinds, flags = self.kinds()
        stack = layer_stack(DecoderBlock, self.n_layers, self.remat, self.gather, self.fetch_params, "layers")
        scale = None if self.attn_scalar is None else self.attn_scalar**-0.5
        layers = stack(
            self.arch, self.d_model, self.n_heads, self.n_kv_heads, self.head_size, self.mlp_hidden, self.rope_theta,
            self.rope_scaling, self.rope_local_theta, self.rms_norm_eps, kinds, self.sliding_window, scale,
            self.attn_softcap, self.dtype, self.partition_activations, self.attention, self.lora,
            fp8=self.fp8, name="layers",
        )  # fmt: skip
        x, written = layers(x, layer_inputs(flags, cache, start, self.n_layers))
        x = nn.with_logical_constraint(x, BATCH_ACT)
        head = nn.remat(Decoder._head, policy=head_policy(self.remat, self.gather))
        resting = embed.embedding if self.gather is None else self.variables["params"]["embed_tokens"]["embedding"]
        logits = head(self, x, resting)
        if self.final_softcap is not None:
            logits = jnp.tanh(logits / self.final_softcap) * self.final_softcap
        if cache is None:
            return logits.astype(jnp.float32)
        return logits.astype(jnp.float32), cache._replace(k=written.k, v=written.v)

    def _head(self, x: jax.Array, embedding: jax.Array) -> jax.Array:
        """The final RMSNorm and the output layer: the tied embedding or its own ``lm_head``."""
        plus_one = architecture(self.arch).norm_plus_one
        x = gathering(RMSNorm, self.gather, "norm")(self.rms_norm_eps, self.dtype, plus_one, name="norm")(x)
        if self.tie_embeddings:
            return tied_logits(x, embedding, self.gather, "embed_tokens", self.dtype)
        return gathering(nn.Dense, self.gather, "lm_head")(
            self.vocab_size, use_bias=False, dtype=self.dtype, kernel_init=annotated(_INIT, "embed", "vocab"), name="lm_head"
        )(x)

