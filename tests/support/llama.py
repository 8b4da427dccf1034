"""A Llama-style decoder written as most Flax users write one: unannotated, its layers called one
after another in Python (no scan), grouped-query attention, RMSNorm and a SwiGLU MLP."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from support.configs import LR
from support.lm import lm_parts


class RMSNorm(nn.Module):
    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],))
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * scale


class Layer(nn.Module):
    d: int
    heads: int
    kv_heads: int
    mlp: int
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        b, t, _ = x.shape
        hd = self.d // self.heads
        h = RMSNorm()(x)
        q = nn.Dense(self.d, use_bias=False, dtype=self.dtype, name="q_proj")(h).reshape(b, t, self.heads, hd)
        k = nn.Dense(self.kv_heads * hd, use_bias=False, dtype=self.dtype, name="k_proj")(h).reshape(b, t, self.kv_heads, hd)
        v = nn.Dense(self.kv_heads * hd, use_bias=False, dtype=self.dtype, name="v_proj")(h).reshape(b, t, self.kv_heads, hd)
        k, v = (jnp.repeat(a, self.heads // self.kv_heads, axis=2) for a in (k, v))
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / hd**0.5
        logits = jnp.where(jnp.tril(jnp.ones((t, t), bool)), logits, -1e9)
        attn = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, -1), v).reshape(b, t, self.d)
        x = x + nn.Dense(self.d, use_bias=False, dtype=self.dtype, name="o_proj")(attn)
        h = RMSNorm()(x)
        gate = nn.Dense(self.mlp, use_bias=False, dtype=self.dtype, name="gate_proj")(h)
        up = nn.Dense(self.mlp, use_bias=False, dtype=self.dtype, name="up_proj")(h)
        return x + nn.Dense(self.d, use_bias=False, dtype=self.dtype, name="down_proj")(nn.silu(gate) * up)


class Llama(nn.Module):
    vocab: int = 256
    d: int = 64
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    mlp: int | None = None  # the MLP's hidden width (default 4 d)
    dtype: jnp.dtype = jnp.float32  # the compute dtype

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab, self.d, dtype=self.dtype, name="embed_tokens")(tokens)
        for i in range(self.layers):
            x = Layer(self.d, self.heads, self.kv_heads, self.mlp or 4 * self.d, self.dtype, name=f"layers_{i}")(x)
        logits = nn.Dense(self.vocab, use_bias=False, dtype=self.dtype, name="lm_head")(RMSNorm(name="norm")(x))
        return logits.astype(jnp.float32)


def llama_parts(seq_len: int = 16, **shape):
    """``(init_fn, loss_fn)`` of a :class:`Llama` for token batches ``[batch, seq_len + 1]``."""
    return lm_parts(Llama(**shape), seq_len)


SHAPE = {"d": 32, "layers": 3, "heads": 4, "kv_heads": 2}
LLAMA = ["model.seq_len=16", "train.global_batch_size=16", LR]


def llama_job(*overrides, devices=None, **shape):
    """A job of this model (``SHAPE``, over it ``shape``) on a config of ``LLAMA`` and ``overrides``."""
    from jzero.config.loading import load_config
    from jzero.training.job import build_job

    init_fn, loss_fn = llama_parts(16, **{**SHAPE, **shape})
    cfg = load_config(None, [*LLAMA, *overrides])
    return build_job(cfg, devices or jax.devices()[:8], init_fn=init_fn, loss_fn=loss_fn)
