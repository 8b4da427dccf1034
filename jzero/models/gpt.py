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

from jzero.communication.gather import SECONDARY, gathering
from jzero.memory.offload import fetching
from jzero.memory.remat import checkpoint_policy, policy_name, remat
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

BATCH_ACT = ("batch", "length", "embed")
# Between blocks with partitioned activations: the sequence split over the model axis.
SAVED_ACT = ("batch", "activation_length", "embed")


def _init(init, *names):
    return nn.with_logical_partitioning(init, names)


def rotary(x: jax.Array, positions: jax.Array | None = None) -> jax.Array:
    """Rotary position embedding over the last axis of ``x`` [batch, length, heads, head_dim].

    ``positions`` [length]: the positions along ``x``'s length axis (a decoder's new tokens after its
    cache, :mod:`jzero.models.decode`); default ``0 .. length - 1``, as in training."""
    length, head_dim = x.shape[1], x.shape[-1]
    half = head_dim // 2
    freq = 1.0 / (10_000.0 ** (jnp.arange(half, dtype=jnp.float32) / half))
    positions = jnp.arange(length, dtype=jnp.float32) if positions is None else positions.astype(jnp.float32)
    angles = positions[:, None] * freq[None, :]
    sin, cos = jnp.sin(angles)[None, :, None, :], jnp.cos(angles)[None, :, None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


@jax.custom_vjp
def gathered(table: jax.Array) -> jax.Array:
    """``table`` whole on every device, as its logical constraint says; unlike the constraint's own
    transpose, the backward leaves the cotangent unconstrained."""
    return nn.with_logical_constraint(table, ("vocab", "embed"))


def _gathered_fwd(table):
    return gathered(table), None


def _gathered_bwd(_, ct):
    return (ct,)


gathered.defvjp(_gathered_fwd, _gathered_bwd)


def _layer_norm(dtype: jnp.dtype, name: str, gather: Any = None) -> nn.LayerNorm:
    """A LayerNorm with its scale and bias annotated ``embed`` (gathered by ``gather`` where given)."""
    return gathering(nn.LayerNorm, gather, name)(
        dtype=dtype,
        scale_init=_init(nn.initializers.ones, "embed"),
        bias_init=_init(nn.initializers.zeros, "embed"),
        name=name,
    )


def _dense(features: int, in_name: str, out_name: str, init, name: str, dtype: jnp.dtype, use_bias: bool = True) -> nn.Dense:
    """A Dense with its kernel annotated ``(in_name, out_name)`` and its bias ``out_name``."""
    # Plain Dense, not DenseGeneral: Flax reshapes DenseGeneral kernels through a boxed
    # value, which trips the logical constraints when a mesh is active.
    return nn.Dense(
        features,
        use_bias=use_bias,
        dtype=dtype,
        kernel_init=_init(init, in_name, out_name),
        bias_init=_init(nn.initializers.zeros, out_name),
        name=name,
    )


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """Softmax attention of ``q`` [batch, queries, heads, head_dim] over ``k`` and ``v`` [batch, keys,
    heads, head_dim], positions already applied; ``mask`` [queries, keys] is True where a query sees a key."""
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    weights = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, v)


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, implementation: str = ATTENTION[0]) -> jax.Array:
    """Causal softmax attention, rotary positions on ``q`` and ``k``; all [batch, length, heads, head_dim].

    Args:
      q, k, v: the projections, in the compute dtype.
      implementation: one of :data:`ATTENTION`.

    Returns:
      [batch, length, heads, head_dim], in ``v``'s dtype.
    """
    q, k = rotary(q), rotary(k)
    dtype = q.dtype
    if implementation == ATTENTION[0] and dtype == jnp.float16:
        # XLA's path asks for an F16_F16_F32 dot, which the CPU backend cannot compile: fp32 instead.
        q = q.astype(jnp.float32)
    out = jax.nn.dot_product_attention(q, k.astype(q.dtype), v.astype(q.dtype), is_causal=True, implementation=implementation)
    return out.astype(dtype)


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention then an MLP."""

    d_model: int
    n_heads: int
    mlp_ratio: int
    n_layers: int
    dtype: jnp.dtype = jnp.float32
    partition_activations: bool = False
    attention: str = ATTENTION[0]  # one of ATTENTION

    @nn.compact
    def __call__(self, x: jax.Array, _unused=None) -> tuple[jax.Array, None]:
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
                    _dense(self.d_model, "embed", "heads", dense_init, n, self.dtype, use_bias=n != "key")(h),
                    ("batch", "length", "heads"),
                ).reshape(batch, length, self.n_heads, head_dim),
                heads,
            )
            for n in ("query", "key", "value")
        )
        attn = nn.with_logical_constraint(causal_attention(q, k, v, self.attention), heads)
        attn = attn.reshape(batch, length, self.d_model)
        x = x + _dense(self.d_model, "heads", "embed", proj_init, "attn_out", self.dtype)(attn)

        h = _layer_norm(self.dtype, "ln_mlp")(x)
        h = _dense(self.mlp_ratio * self.d_model, "embed", "mlp", dense_init, "mlp_in", self.dtype)(h)
        h = nn.gelu(nn.with_logical_constraint(h, ("batch", "length", "mlp")))
        x = x + _dense(self.d_model, "mlp", "embed", proj_init, "mlp_out", self.dtype)(h)
        return nn.with_logical_constraint(x, SAVED_ACT if self.partition_activations else BATCH_ACT), None


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

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        """``tokens`` [batch, length] int -> logits [batch, length, vocab] float32."""
        embed = gathering(nn.Embed, self.gather, "embed")(
            self.vocab_size,
            self.d_model,
            embedding_init=_init(nn.initializers.normal(0.02), "vocab", "embed"),
            name="embed",
        )
        # Gather the table (a parameter gather, as ZeRO-3 does for every layer) rather than let GSPMD
        # gather the batch's activations to meet a data-sharded table in the lookup's backward.
        # The model's own gather runs inside the module, as each block's does (under qgZ's
        # shard_map a module never sees its shard). Positions: rotary, in attention.
        if self.gather is None:
            x = jnp.take(nn.with_logical_constraint(embed.embedding, ("vocab", "embed")), tokens, axis=0)
        else:
            x = embed(tokens)
        x = x.astype(self.dtype)

        policy = policy_name(self.remat)
        # Under the scan, XLA cannot fold the recomputation into the forward: no CSE barrier needed.
        block = gathering(Block, self.gather, "blocks")
        # A model that gathers itself saves hpZ's secondary copies for the backward's gathers.
        also_save = (SECONDARY,) if self.gather is not None else ()
        block = remat(fetching(block) if self.fetch_params else block, policy, prevent_cse=False, also_save=also_save)
        # Whole along the sequence into the loop, even with partitioned activations: split here, XLA
        # partitioned the lookup and the loss with permutes across batch groups (the loop's carry
        # is split at the first block's output anyway).
        x = nn.with_logical_constraint(x, BATCH_ACT)
        stack = nn.scan(
            block,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            length=self.n_layers,
            metadata_params={nn.PARTITION_NAME: "layers"},
        )
        shape = (self.d_model, self.n_heads, self.mlp_ratio, self.n_layers)
        blocks = stack(*shape, self.dtype, self.partition_activations, self.attention, name="blocks")
        x, _ = blocks(x, None)
        x = nn.with_logical_constraint(x, BATCH_ACT)
        # Rematerialised like the blocks: the backward gathers the head's weights again instead of
        # holding them whole from the forward (ZeRO-3 frees a gathered parameter after its use).
        head = nn.remat(GPT._head, policy=checkpoint_policy(policy, also_save))
        # The table as it rests: a tied head gathers it again, inside its own remat.
        resting = embed.embedding if self.gather is None else self.variables["params"]["embed"]["embedding"]
        logits = head(self, x, resting)
        return logits.astype(jnp.float32)

    def _head(self, x: jax.Array, embedding: jax.Array) -> jax.Array:
        """The final LayerNorm and the output layer: the tied embedding or its own ``lm_head``."""
        x = _layer_norm(self.dtype, "ln_f", self.gather)(x)  # 1-D: never quantized; gathered by hpZ and qgZ
        if self.tie_embeddings:
            # The same gather as the lookup's, but the head's gradient is left unconstrained:
            # constrained whole, GSPMD all-reduces it (2x the bytes) rather than adding it to the
            # lookup's and reduce-scattering the sum once into the gradient's spec.
            table = gathered(embedding) if self.gather is None else self.gather("embed", {"embedding": embedding})["embedding"]
            return jnp.einsum("ble,ve->blv", x, table.astype(self.dtype))
        return gathering(nn.Dense, self.gather, "lm_head")(
            self.vocab_size,
            use_bias=False,
            dtype=self.dtype,
            kernel_init=_init(nn.initializers.normal(0.02), "embed", "vocab"),
            name="lm_head",
        )(x)


def lm_loss(model: GPT, params, batch: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy; ``batch`` is [batch, seq_len + 1] tokens."""
    logits = model.apply({"params": params}, batch[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()
