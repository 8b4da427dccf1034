"""The building blocks jzero's models share: annotated kernels, rotary positions, causal attention.

Parameters carry logical axis names (``nn.with_logical_partitioning``), which the plan maps onto
the mesh (:func:`jzero.sharding.rules.default_rules`): ``vocab``, ``embed``, ``heads``, ``kv_heads``,
``mlp`` and ``layers`` (a scan's stacked dimension).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from jzero.communication.gather import SECONDARY, gathering
from jzero.dtypes import FP8_RECIPES
from jzero.memory import float8
from jzero.memory.offload import fetching
from jzero.memory.remat import checkpoint_policy, policy_name, remat
from jzero.models.lora import LoraDense, LoraSpec
from jzero.models.names import ATTENTION

__all__ = [
    "BATCH_ACT",
    "SAVED_ACT",
    "Cache",
    "annotated",
    "attend",
    "attention",
    "cached",
    "causal_attention",
    "dense",
    "gathered",
    "head_policy",
    "layer_inputs",
    "layer_stack",
    "lookup",
    "rope_frequencies",
    "rotary",
    "tied_logits",
]

BATCH_ACT = ("batch", "length", "embed")
# Between blocks with partitioned activations: the sequence split over the model axis.
SAVED_ACT = ("batch", "activation_length", "embed")
ROPE_THETA = 10_000.0  # the GPT's rotary base (RoFormer's)


def annotated(init: Any, *names: str) -> Any:
    """``init`` with the logical axis names of the parameter it makes."""
    return nn.with_logical_partitioning(init, names)


def dense(
    features: int,
    in_name: str,
    out_name: str,
    init: Any,
    name: str,
    dtype: jnp.dtype,
    use_bias: bool = True,
    lora: LoraSpec | None = None,
    where: tuple[str, ...] = (),
    fp8: str = FP8_RECIPES[0],
) -> nn.Dense:
    """A Dense with its kernel annotated ``(in_name, out_name)`` and its bias ``out_name``; with a
    low-rank adapter (:class:`jzero.models.lora.LoraDense`) where ``lora`` targets its kernel's path
    (``where``: the calling module's path); its GEMM in float8 by the recipe ``fp8``
    (:mod:`jzero.memory.float8`) unless that is ``none``."""
    # Plain Dense, not DenseGeneral: Flax reshapes DenseGeneral kernels through a boxed
    # value, which trips the logical constraints when a mesh is active.
    shape = dict(
        features=features,
        use_bias=use_bias,
        dtype=dtype,
        kernel_init=annotated(init, in_name, out_name),
        bias_init=annotated(nn.initializers.zeros, out_name),
        name=name,
    )
    if fp8 != FP8_RECIPES[0]:
        shape["dot_general"] = float8.dot_general(fp8)
    if lora is not None and lora.adapts("/".join((*where, name, "kernel"))):
        return LoraDense(**shape, rank=lora.rank, scale=lora.scale, in_name=in_name, out_name=out_name)
    return nn.Dense(**shape)


def rope_frequencies(head_dim: int, theta: float = ROPE_THETA, scaling: Mapping[str, Any] | None = None) -> jax.Array:
    """Rotary frequencies ``1 / theta^(2i / head_dim)`` [head_dim / 2], float32.

    Args:
      head_dim: the size of one attention head.
      theta: the rotary base (Llama 3: 500000).
      scaling: ``rope_scaling``: ``rope_type: linear`` divides every frequency by ``factor``; Llama
        3.1's (``rope_type: llama3``, ``factor``, ``low_freq_factor``,
        ``high_freq_factor``, ``original_max_position_embeddings``): wavelengths longer than the
        original context over ``low_freq_factor`` are divided by ``factor``, those shorter than it
        over ``high_freq_factor`` kept, and those between blended (as Hugging Face's
        ``_compute_llama3_parameters``). None: unscaled.
    """
    freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    if not scaling:
        return freq
    if scaling.get("rope_type") == "linear":
        return freq / float(scaling["factor"])
    factor, low, high = (float(scaling[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
    context = float(scaling["original_max_position_embeddings"])
    wavelength = 2 * math.pi / freq
    scaled = jnp.where(wavelength > context / low, freq / factor, freq)
    smooth = (context / wavelength - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength >= context / high) & (wavelength <= context / low)
    return jnp.where(medium, blended, scaled)


def rotary(x: jax.Array, positions: jax.Array | None = None, freq: jax.Array | None = None) -> jax.Array:
    """Rotary position embedding over the last axis of ``x`` [batch, length, heads, head_dim], its two
    halves rotated against each other (GPT-NeoX's and Hugging Face Llama's layout).

    ``positions`` [length]: the positions along ``x``'s length axis (a decoder's new tokens after its
    cache, :mod:`jzero.models.decode`); default ``0 .. length - 1``, as in training. ``freq``:
    :func:`rope_frequencies` (default: the GPT's, base 10000, unscaled)."""
    length, head_dim = x.shape[1], x.shape[-1]
    half = head_dim // 2
    freq = rope_frequencies(head_dim) if freq is None else freq
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


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """Softmax attention of ``q`` [batch, queries, heads, head_dim] over ``k`` and ``v`` [batch, keys,
    heads, head_dim], positions already applied; ``mask`` [queries, keys] is True where a query sees a key."""
    return attention(q, k.astype(dtype), v.astype(dtype), positions=mask)


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    implementation: str = ATTENTION[0],
    scale: float | None = None,
    softcap: float | None = None,
    window: int | None = None,
    sliding: jax.Array | None = None,
    positions: Any = None,
) -> jax.Array:
    """Causal softmax attention, rotary positions already applied.

    Args:
      q: [batch, length, heads, head_dim], in the compute dtype.
      k, v: [batch, keys, kv_heads, head_dim]; ``heads`` a multiple of ``kv_heads`` (grouped-query
        attention: each key and value head serves ``heads / kv_heads`` query heads).
      implementation: one of :data:`ATTENTION`.
      scale: the logits' factor (default ``head_dim**-0.5``).
      softcap: the logits become ``softcap * tanh(logits / softcap)`` before the mask (Gemma 2).
      window: a query sees this many positions, its own included (a sliding window); None: all before it.
      sliding: where layers differ, this layer's flag (a scan's per-layer input): the window holds
        only where it is True. None: ``window`` holds as given.
      positions: with a KV cache, ``(query positions [length], key positions [keys])``, or a
        ``[length, keys]`` mask of what each query sees; None: ``0 .. length - 1`` for both.

    Returns:
      [batch, length, heads, head_dim], in ``q``'s dtype.
    """
    dtype, scale = q.dtype, q.shape[-1] ** -0.5 if scale is None else scale
    if positions is None and softcap is None and (sliding is None or implementation == ATTENTION[1]):
        return _fused(q, k, v, implementation, scale, window, sliding)
    mask = _mask(q.shape[1], k.shape[1], window, sliding, positions)
    if softcap is None:
        return _fused(q, k, v, ATTENTION[0], scale, None, None, mask)
    batch, length, heads, head_dim = q.shape
    grouped = q.reshape(batch, length, k.shape[2], heads // k.shape[2], head_dim)
    logits = jnp.einsum("btkgd,bskd->bkgts", grouped, k.astype(dtype)) * jnp.asarray(scale, dtype)
    logits = jnp.tanh(logits / softcap) * softcap
    logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    weights = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(dtype)
    return jnp.einsum("bkgts,bskd->btkgd", weights, v.astype(dtype)).reshape(q.shape)


def _fused(q, k, v, implementation, scale, window, sliding, mask=None):
    """``jax.nn.dot_product_attention``: causal with a static window, or ``mask``; where layers
    differ under cuDNN, a branch per kind of layer (its kernel takes no mask)."""
    dtype = q.dtype
    if implementation == ATTENTION[0] and dtype == jnp.float16:
        # XLA's path asks for an F16_F16_F32 dot, which the CPU backend cannot compile: fp32 instead.
        q = q.astype(jnp.float32)
    k, v = k.astype(q.dtype), v.astype(q.dtype)

    def call(size):
        local = (size - 1, 0) if size is not None and mask is None else None
        masked = None if mask is None else mask[None, None]
        return jax.nn.dot_product_attention(
            q, k, v, mask=masked, scale=scale, is_causal=mask is None, local_window_size=local, implementation=implementation
        )

    if sliding is None:
        return call(window).astype(dtype)
    return jax.lax.cond(sliding, lambda: call(window), lambda: call(None)).astype(dtype)


def _mask(length: int, keys: int, window: int | None, sliding: jax.Array | None, positions: Any) -> jax.Array:
    """``[length, keys]``: True where a query sees a key (causal, inside the window where it holds)."""
    if positions is not None and not isinstance(positions, tuple):
        return positions
    q_at, k_at = positions if positions is not None else (jnp.arange(length), jnp.arange(keys))
    sees = k_at[None, :] <= q_at[:, None]
    if window is None:
        return sees
    inside = k_at[None, :] > q_at[:, None] - window
    return sees & (inside if sliding is None else inside | ~sliding)


def causal_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, implementation: str = ATTENTION[0], freq: jax.Array | None = None
) -> jax.Array:
    """Causal softmax attention, rotary positions on ``q`` and ``k`` (:func:`attention` after
    :func:`rotary` with ``freq``, default the GPT's)."""
    return attention(rotary(q, freq=freq), rotary(k, freq=freq), v, implementation=implementation)


class Cache(NamedTuple):
    """One layer's KV cache as a layer reads it: its rotated keys and its values ``[batch, max_len,
    kv_heads, head_dim]``, and the position of the first new token (:mod:`jzero.models.decode`)."""

    k: jax.Array
    v: jax.Array
    start: jax.Array


def cached(k: jax.Array, v: jax.Array, cache: Cache) -> tuple[jax.Array, jax.Array, Cache, tuple[jax.Array, jax.Array]]:
    """The new tokens' keys and values written into ``cache`` at its start: every key and value the
    queries see, the cache to hand on, and ``(query positions, key positions)`` for :func:`attention`."""
    keys = jax.lax.dynamic_update_slice_in_dim(cache.k, k.astype(cache.k.dtype), cache.start, axis=1)
    values = jax.lax.dynamic_update_slice_in_dim(cache.v, v.astype(cache.v.dtype), cache.start, axis=1)
    positions = (cache.start + jnp.arange(k.shape[1]), jnp.arange(keys.shape[1]))
    return keys, values, Cache(keys, values, cache.start), positions


# The token embedding, the stack of layers and the tied head, as both of jzero's models build them.
# ``gather`` is the model's own parameter gather (jzero.sharding.gathers.model_gather), or None when
# XLA gathers; each takes the module path its parameters live under.


def lookup(tokens: jax.Array, vocab_size: int, d_model: int, init: Any, gather: Any, name: str) -> tuple[jax.Array, nn.Embed]:
    """The embedding ``name`` [vocab, d_model] and ``tokens``' rows of it. Without ``gather``, the
    table is gathered (a parameter gather, as ZeRO-3 does for every layer) rather than letting GSPMD
    gather the batch's activations to meet a data-sharded table in the lookup's backward; with it,
    the model's own gather runs inside the module, as each layer's does (under qgZ's ``shard_map`` a
    module never sees its shard)."""
    embed = gathering(nn.Embed, gather, name)(vocab_size, d_model, embedding_init=annotated(init, "vocab", "embed"), name=name)
    if gather is None:
        return jnp.take(nn.with_logical_constraint(embed.embedding, ("vocab", "embed")), tokens, axis=0), embed
    return embed(tokens), embed


def layer_stack(layer: type[nn.Module], n_layers: int, policy: str | bool, gather: Any, fetch: bool, name: str) -> Any:
    """``layer`` repeated ``n_layers`` times in one ``nn.scan`` (its parameters stacked along
    ``layers``), each layer gathered by ``gather``, fetched from host memory with ``fetch``
    (:func:`jzero.memory.offload.fetching`) and rematerialised by ``policy``. A model that gathers
    itself saves hpZ's secondary copies for the backward's gathers."""
    # Under the scan, XLA cannot fold the recomputation into the forward: no CSE barrier needed.
    block = gathering(layer, gather, name)
    block = remat(fetching(block) if fetch else block, policy_name(policy), prevent_cse=False, also_save=_also_save(gather))
    return nn.scan(
        block, variable_axes={"params": 0}, split_rngs={"params": True}, length=n_layers,
        metadata_params={nn.PARTITION_NAME: "layers"},
    )  # fmt: skip


def layer_inputs(flags: jax.Array | None, cache: Any, start: jax.Array | int, n_layers: int) -> Any:
    """What a :func:`layer_stack`'s scan hands each layer: None in training where every layer is
    alike, else ``(flag, Cache)`` sliced per layer: its flag where layers differ (``flags``
    [n_layers]), and its :class:`Cache` when decoding (``cache``: every layer's keys and values
    stacked, ``start`` the first new token's position, the same for every layer)."""
    if cache is None:
        return None if flags is None else (flags, None)
    return (flags, Cache(cache.k, cache.v, jnp.full((n_layers,), start, jnp.int32)))


def head_policy(policy: str | bool, gather: Any) -> Any:
    """The head's checkpoint policy, the layers': the backward gathers the head's weights again
    instead of holding them whole from the forward (ZeRO-3 frees a gathered parameter after use)."""
    return checkpoint_policy(policy_name(policy), _also_save(gather))


def _also_save(gather: Any) -> tuple[str, ...]:
    return (SECONDARY,) if gather is not None else ()


def tied_logits(x: jax.Array, embedding: jax.Array, gather: Any, name: str, dtype: jnp.dtype) -> jax.Array:
    """``x`` times the embedding table ``name`` as it rests, gathered as the lookup's. The head's
    gradient is left unconstrained: constrained whole, GSPMD all-reduces it (2x the bytes) rather than
    adding it to the lookup's and reduce-scattering the sum once into the gradient's spec."""
    table = gathered(embedding) if gather is None else gather(name, {"embedding": embedding})["embedding"]
    return jnp.einsum("ble,ve->blv", x, table.astype(dtype))
