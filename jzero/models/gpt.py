"""A decoder-only GPT in flax.linen, annotated for jzero.

- Parameters carry logical axis names (``nn.with_logical_partitioning``): ``vocab``, ``embed``,
  ``heads``, ``mlp`` and ``layers`` (the scan axis). Positions are rotary (no parameters).
- Blocks are stacked with ``nn.scan`` and rematerialised with a named policy (:mod:`jzero.memory.remat`),
  so stage 3 gathers one layer's parameters at a time inside the loop.
- ``partition_activations`` (ZeRO-R's P_a): the activation passed between blocks, which is what a
  rematerialised block saves, is split over ``model`` along the sequence (``activation_length``)
  and gathered at each block's input.
- ``fetch_params`` (parameter offload): each block's parameters come from pinned host memory to the
  device inside the loop (:func:`jzero.memory.offload.fetching`).
- ``gather`` (stage 3 with qwZ, :func:`jzero.sharding.gathers.model_gather`): each block gathers its own
  parameters inside the loop, as do the embedding and the head (:func:`jzero.communication.gather.gathering`).
- Activations are constrained with the batch on ``data`` at each block input and inside attention
  and the MLP. Without that, GSPMD may replicate attention over the global batch on every device.
  Constraints only act under a mesh and ``nn.logical_axis_rules``, which :mod:`jzero.step` sets.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from jzero.communication.gather import gathering
from jzero.dtypes import FP8_RECIPES
from jzero.models.layers import (
    BATCH_ACT,
    SAVED_ACT,
    Cache,
    annotated,
    attend,
    attention,
    cached,
    causal_attention,
    dense,
    gathered,
    head_policy,
    layer_inputs,
    layer_stack,
    lookup,
    rotary,
    tied_logits,
)
from jzero.models.lora import LoraSpec
from jzero.models.names import ATTENTION

__all__ = [
    "BATCH_ACT",
    "Block",
    "GPT",
    "SAVED_ACT",
    "attend",
    "causal_attention",
    "gathered",
    "lm_loss",
    "rotary",
]


def _layer_norm(dtype: jnp.dtype, name: str, gather: Any = None) -> nn.LayerNorm:
    """A LayerNorm with its scale and bias annotated ``embed`` (gathered by ``gather`` where given)."""
    return gathering(nn.LayerNorm, gather, name)(
        dtype=dtype,
        scale_init=annotated(nn.initializers.ones, "embed"),
        bias_init=annotated(nn.initializers.zeros, "embed"),
        name=name,
    )


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention then an MLP."""

    d_model: int
    n_heads: int
    mlp_ratio: int
    n_layers: int
    dtype: jnp.dtype = jnp.float32
    partition_activations: bool = False
    attention: str = ATTENTION[0]  # one of ATTENTION
    lora: LoraSpec | None = None  # low-rank adapters on the kernels it targets
    fp8: str = FP8_RECIPES[0]  # its projections' GEMMs in float8 (jzero.memory.float8)

    def linear(self, features: int, in_name: str, out_name: str, init: Any, name: str, bias: bool = True) -> nn.Dense:
        return dense(features, in_name, out_name, init, name, self.dtype, bias, self.lora, self.path, self.fp8)

    @nn.compact
    def __call__(self, x: jax.Array, layer: Any = None) -> tuple[jax.Array, Cache | None]:
        """``x`` [batch, length, d_model] -> the block's output and, when ``layer`` is ``(_, cache)``
        (:func:`jzero.models.layers.layer_inputs`), the cache with these tokens' keys and values."""
        cache = None if layer is None else layer[1]
        if self.partition_activations:
            # Said again where the block starts, so that the stack of saved inputs the backward reads
            # keeps this sharding too; the next line is the gather over model.
            x = nn.with_logical_constraint(x, SAVED_ACT)
        x = nn.with_logical_constraint(x, BATCH_ACT)
        head_dim = self.d_model // self.n_heads
        dense_init = nn.initializers.normal(0.02)
        proj_init = nn.initializers.normal(0.02 / math.sqrt(2 * self.n_layers))

        batch, length, _ = x.shape
        heads = ("batch", "length", "heads", "kv")
        h = _layer_norm(self.dtype, "ln_attn")(x)
        # No key bias: softmax is shift-invariant, so its gradient is exactly zero (pure rounding
        # noise, which Adam would amplify into real updates).
        # Constrained before the split into heads too: the bias gradient is then summed in the
        # [batch, length, d_model] layout, which reduce-scatters; summed as [heads, head_dim] (XLA
        # folds the reshape otherwise) it has to be all-reduced whenever heads don't divide by N_d.
        q, k, v = (
            nn.with_logical_constraint(
                nn.with_logical_constraint(
                    self.linear(self.d_model, "embed", "heads", dense_init, n, n != "key")(h),
                    ("batch", "length", "heads"),
                ).reshape(batch, length, self.n_heads, head_dim),
                heads,
            )
            for n in ("query", "key", "value")
        )
        at = None if cache is None else cache.start + jnp.arange(length)
        q, k = rotary(q, at), rotary(k, at)
        positions = None
        if cache is not None:
            k, v, cache, positions = cached(k, v, cache)
        attn = nn.with_logical_constraint(attention(q, k, v, implementation=self.attention, positions=positions), heads)
        attn = attn.reshape(batch, length, self.d_model)
        x = x + self.linear(self.d_model, "heads", "embed", proj_init, "attn_out")(attn)

        h = _layer_norm(self.dtype, "ln_mlp")(x)
        h = self.linear(self.mlp_ratio * self.d_model, "embed", "mlp", dense_init, "mlp_in")(h)
        h = nn.gelu(nn.with_logical_constraint(h, ("batch", "length", "mlp")))
        x = x + self.linear(self.d_model, "mlp", "embed", proj_init, "mlp_out")(h)
        return nn.with_logical_constraint(x, SAVED_ACT if self.partition_activations else BATCH_ACT), cache


class GPT(nn.Module):
    """Byte-level (or any vocabulary) decoder-only language model."""

    vocab_size: int = 256
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: int = 4
    seq_len: int = 128  # the longest sequence trained on; rotary positions need no table
    remat: str | bool = "full"  # a policy of jzero.memory.remat; True and False mean full and none
    tie_embeddings: bool = False  # GPT-2 style: the LM head reuses the token embedding
    partition_activations: bool = False  # the saved block inputs split over model (ZeRO-R's P_a)
    fetch_params: bool = False  # each block's parameters come from host memory inside the loop
    dtype: jnp.dtype = jnp.float32
    attention: str = ATTENTION[0]  # one of ATTENTION: xla, or cudnn's flash kernel on GPUs
    gather: Any = None  # (prefix, params) -> params gathered (jzero.sharding.gathers.model_gather); None: XLA gathers
    lora: LoraSpec | None = None  # low-rank adapters (jzero.models.lora) on the layers' kernels it targets
    fp8: str = FP8_RECIPES[0]  # the layers' projections' GEMMs in float8 (jzero.memory.float8); the head's stay

    @nn.compact
    def __call__(self, tokens: jax.Array, cache: Any = None, start: jax.Array | int = 0) -> Any:
        """``tokens`` [batch, length] int -> logits [batch, length, vocab] float32; with a ``cache``
        (:class:`jzero.models.decode.KVCache`) and the first token's position ``start``, ``(logits,
        cache)`` with the tokens' keys and values written in."""
        x, embed = lookup(tokens, self.vocab_size, self.d_model, nn.initializers.normal(0.02), self.gather, "embed")
        x = x.astype(self.dtype)  # positions: rotary, in attention
        stack = layer_stack(Block, self.n_layers, self.remat, self.gather, self.fetch_params, "blocks")
        # Whole along the sequence into the loop, even with partitioned activations: split here, XLA
        # partitioned the lookup and the loss with permutes across batch groups (the loop's carry
        # is split at the first block's output anyway).
        x = nn.with_logical_constraint(x, BATCH_ACT)
        shape = (self.d_model, self.n_heads, self.mlp_ratio, self.n_layers)
        blocks = stack(*shape, self.dtype, self.partition_activations, self.attention, self.lora, fp8=self.fp8, name="blocks")
        x, written = blocks(x, layer_inputs(None, cache, start, self.n_layers))
        x = nn.with_logical_constraint(x, BATCH_ACT)
        head = nn.remat(GPT._head, policy=head_policy(self.remat, self.gather))
        # The table as it rests: a tied head gathers it again, inside its own remat.
        resting = embed.embedding if self.gather is None else self.variables["params"]["embed"]["embedding"]
        logits = head(self, x, resting).astype(jnp.float32)
        return logits if cache is None else (logits, cache._replace(k=written.k, v=written.v))

    def _head(self, x: jax.Array, embedding: jax.Array) -> jax.Array:
        """The final LayerNorm and the output layer: the tied embedding or its own ``lm_head``."""
        x = _layer_norm(self.dtype, "ln_f", self.gather)(x)  # 1-D: never quantized; gathered by hpZ and qgZ
        if self.tie_embeddings:
            return tied_logits(x, embedding, self.gather, "embed", self.dtype)
        return gathering(nn.Dense, self.gather, "lm_head")(
            self.vocab_size,
            use_bias=False,
            dtype=self.dtype,
            kernel_init=annotated(nn.initializers.normal(0.02), "embed", "vocab"),
            name="lm_head",
        )(x)


def lm_loss(model: GPT, params, batch: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy; ``batch`` is [batch, seq_len + 1] tokens."""
    logits = model.apply({"params": params}, batch[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()
