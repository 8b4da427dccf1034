"""A Llama decoder in flax.linen, annotated for jzero: what ``model.name: llama`` trains.

Llama 2 and 3's architecture, as Hugging Face's ``LlamaForCausalLM`` computes it: RMSNorm before
attention and the MLP, rotary positions with ``rope_theta`` and Llama 3's ``rope_scaling``,
grouped-query attention (``n_kv_heads`` key and value heads), a SwiGLU MLP of ``mlp_hidden`` units,
no biases, and an LM head of its own or the token embedding (``tie_embeddings``).

As for the GPT (:mod:`jzero.models.gpt`): parameters carry logical axis names (``heads``,
``kv_heads`` and ``mlp`` go on the ``model`` axis), the layers are one ``nn.scan`` so stage 3 gathers
them one at a time, rematerialised by a named policy, and ``partition_activations``,
``fetch_params`` and ``gather`` work the same. The parameter names follow Hugging Face's
(``layers/q_proj/kernel`` is ``model.layers.N.self_attn.q_proj.weight``, transposed:
:mod:`jzero.checkpoint.hf`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jzero.communication.gather import gathering
from jzero.models.layers import (
    BATCH_ACT,
    SAVED_ACT,
    annotated,
    causal_attention,
    dense,
    head_policy,
    layer_stack,
    lookup,
    rope_frequencies,
    tied_logits,
)
from jzero.models.lora import LoraSpec
from jzero.models.names import ATTENTION

__all__ = ["Llama", "LlamaBlock", "RMSNorm", "rope_scaling_pairs"]

_INIT = nn.initializers.normal(0.02)  # Hugging Face's initializer_range
MLP_ACT = ("batch", "length", "mlp")


def rope_scaling_pairs(scaling: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...] | None:
    """``rope_scaling`` as sorted pairs: a Flax module's fields must hash."""
    return tuple(sorted(scaling.items())) if scaling else None


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * scale``, computed in float32 and cast back before the scale
    (as Hugging Face's ``LlamaRMSNorm``)."""

    eps: float = 1e-5
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param("scale", annotated(nn.initializers.ones, "embed"), (x.shape[-1],))
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return normed.astype(self.dtype) * scale.astype(self.dtype)


class LlamaBlock(nn.Module):
    """One decoder layer: ``x + attention(norm(x))``, then ``x + mlp(norm(x))``."""

    d_model: int
    n_heads: int
    n_kv_heads: int
    mlp_hidden: int
    rope_theta: float = 500_000.0
    rope_scaling: tuple[tuple[str, Any], ...] | None = None  # rope_scaling_pairs(...)
    rms_norm_eps: float = 1e-5
    dtype: jnp.dtype = jnp.float32
    partition_activations: bool = False
    attention: str = ATTENTION[0]  # one of ATTENTION
    lora: LoraSpec | None = None  # low-rank adapters on the kernels it targets

    @nn.compact
    def __call__(self, x: jax.Array, _unused=None) -> tuple[jax.Array, None]:
        if self.partition_activations:
            x = nn.with_logical_constraint(x, SAVED_ACT)  # the saved input keeps this sharding
        x = nn.with_logical_constraint(x, BATCH_ACT)
        batch, length, _ = x.shape
        head_dim = self.d_model // self.n_heads
        h = RMSNorm(self.rms_norm_eps, self.dtype, name="input_layernorm")(x)

        def linear(features: int, in_name: str, out_name: str, name: str) -> nn.Dense:
            return dense(features, in_name, out_name, _INIT, name, self.dtype, False, self.lora, self.path)

        def project(name: str, heads: int, logical: str) -> jax.Array:
            out = linear(heads * head_dim, "embed", logical, name)(h)
            out = nn.with_logical_constraint(out, ("batch", "length", logical))
            return nn.with_logical_constraint(out.reshape(batch, length, heads, head_dim), ("batch", "length", logical, "kv"))

        q = project("q_proj", self.n_heads, "heads")
        k, v = (project(name, self.n_kv_heads, "kv_heads") for name in ("k_proj", "v_proj"))
        freq = rope_frequencies(head_dim, self.rope_theta, dict(self.rope_scaling) if self.rope_scaling else None)
        attn = causal_attention(q, k, v, self.attention, freq)
        attn = nn.with_logical_constraint(attn, ("batch", "length", "heads", "kv")).reshape(batch, length, self.d_model)
        x = x + linear(self.d_model, "heads", "embed", "o_proj")(attn)

        h = RMSNorm(self.rms_norm_eps, self.dtype, name="post_attention_layernorm")(x)
        gate, up = (
            nn.with_logical_constraint(linear(self.mlp_hidden, "embed", "mlp", n)(h), MLP_ACT)
            for n in ("gate_proj", "up_proj")
        )
        x = x + linear(self.d_model, "mlp", "embed", "down_proj")(nn.silu(gate) * up)
        return nn.with_logical_constraint(x, SAVED_ACT if self.partition_activations else BATCH_ACT), None


class Llama(nn.Module):
    """A Llama-architecture decoder; the fields named as the ``model:`` section's keys."""

    vocab_size: int = 256
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    mlp_hidden: int = 384
    rope_theta: float = 500_000.0
    rope_scaling: tuple[tuple[str, Any], ...] | None = None  # rope_scaling_pairs(config's mapping)
    rms_norm_eps: float = 1e-5
    tie_embeddings: bool = False
    seq_len: int = 128  # the longest sequence trained on; rotary positions need no table
    remat: str | bool = "full"  # a policy of jzero.memory.remat
    partition_activations: bool = False
    fetch_params: bool = False
    dtype: jnp.dtype = jnp.float32
    attention: str = ATTENTION[0]
    gather: Any = None  # (prefix, params) -> params gathered (jzero.sharding.gathers.model_gather)
    lora: LoraSpec | None = None  # low-rank adapters (jzero.models.lora) on the layers' kernels it targets

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        """``tokens`` [batch, length] int -> logits [batch, length, vocab] float32."""
        x, embed = lookup(tokens, self.vocab_size, self.d_model, _INIT, self.gather, "embed_tokens")
        x = nn.with_logical_constraint(x.astype(self.dtype), BATCH_ACT)
        stack = layer_stack(LlamaBlock, self.n_layers, self.remat, self.gather, self.fetch_params, "layers")
        shape = (self.d_model, self.n_heads, self.n_kv_heads, self.mlp_hidden, self.rope_theta, self.rope_scaling)
        options = (self.rms_norm_eps, self.dtype, self.partition_activations, self.attention, self.lora)
        layers = stack(*shape, *options, name="layers")
        x, _ = layers(x, None)
        x = nn.with_logical_constraint(x, BATCH_ACT)
        head = nn.remat(Llama._head, policy=head_policy(self.remat, self.gather))
        resting = embed.embedding if self.gather is None else self.variables["params"]["embed_tokens"]["embedding"]
        return head(self, x, resting).astype(jnp.float32)

    def _head(self, x: jax.Array, embedding: jax.Array) -> jax.Array:
        """The final RMSNorm and the output layer: the tied embedding or its own ``lm_head``."""
        x = gathering(RMSNorm, self.gather, "norm")(self.rms_norm_eps, self.dtype, name="norm")(x)
        if self.tie_embeddings:
            return tied_logits(x, embedding, self.gather, "embed_tokens", self.dtype)
        return gathering(nn.Dense, self.gather, "lm_head")(
            self.vocab_size, use_bias=False, dtype=self.dtype, kernel_init=annotated(_INIT, "embed", "vocab"), name="lm_head"
        )(x)
