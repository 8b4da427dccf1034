"""Text from jzero's GPT and decoders (:mod:`jzero.models.gpt`, :mod:`jzero.models.decoder`): KV-cache
decoding in one compiled loop.

:func:`generate` runs the prompt through the model once (:func:`prefill`), keeping every layer's
keys and values in a :class:`KVCache`, then makes each new token inside one ``jax.lax.while_loop``
under ``jit``: a one-token forward (:func:`decode_step`) attends to the cache and appends its own key
and value, so no step recomputes the prefix.

The forward is the model's own: each layer takes its cache as an optional input (Flax's
``decode=True`` pattern), so training and decoding run the same blocks. ``tests/apps/test_sample.py``
checks the cached logits against each model's ``apply`` on the whole prefix, and
``tests/models/test_families.py`` greedy tokens against transformers' ``generate``.
:func:`decode_loop` is the loop alone: another model is decoded by it given the same two calls, a
prefill that returns the last logits and a cache, and a one-token step at a position that returns
the next logits and the cache.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from jzero.models.decoder import Decoder
from jzero.models.gpt import GPT

__all__ = ["KVCache", "OnToken", "decode_loop", "decode_step", "forward", "generate", "init_cache", "next_token", "prefill"]

OnToken = Callable[[np.ndarray, int], None]  # (the step's tokens [batch], its index) -> None


class KVCache(NamedTuple):
    """Every layer's rotated keys and its values, ``[layers, batch, max_len, heads, head_dim]`` in the
    model's dtype; positions not yet decoded hold zeros and are masked out."""

    k: jax.Array
    v: jax.Array


Model = GPT | Decoder


def init_cache(model: Model, batch: int, max_len: int) -> KVCache:
    """An empty cache for ``batch`` sequences of up to ``max_len`` tokens (at most ``model.seq_len``):
    one entry per key and value head (a decoder's ``n_kv_heads``)."""
    heads = getattr(model, "n_kv_heads", model.n_heads)  # the GPT has as many as query heads
    head_dim = model.head_size if isinstance(model, Decoder) else model.d_model // model.n_heads
    shape = (model.n_layers, batch, max_len, heads, head_dim)
    return KVCache(jnp.zeros(shape, model.dtype), jnp.zeros(shape, model.dtype))


def forward(model: Model, params: Any, tokens: jax.Array, cache: KVCache, start: jax.Array | int) -> tuple[jax.Array, KVCache]:
    """The model on ``tokens`` at positions ``start .. start + length - 1``, given the cache of the
    tokens before: the model's own layers, each with its cache (``model.apply(..., cache, start)``).

    Args:
      model: the GPT or decoder whose ``params`` these are (its shape and dtype).
      params: the params tree of ``model.init`` (boxed with logical names or not).
      tokens: ``[batch, length]`` int token ids.
      cache: the keys and values of positions ``0 .. start - 1`` (:func:`init_cache`).
      start: the first token's position; ``start + length`` must not exceed the cache's length.

    Returns:
      ``(logits, cache)``: float32 logits ``[batch, length, vocab]``, and the cache with these
      tokens' keys and values added.
    """
    return model.apply({"params": nn.unbox(params)}, tokens, cache, jnp.asarray(start, jnp.int32))


def prefill(model: Model, params: Any, prompt: jax.Array, max_len: int) -> tuple[jax.Array, KVCache]:
    """The prompt ``[batch, length]`` in one pass: its last position's logits ``[batch, vocab]`` and a
    cache of ``max_len`` positions holding its keys and values."""
    logits, cache = forward(model, params, prompt, init_cache(model, prompt.shape[0], max_len), 0)
    return logits[:, -1], cache


def decode_step(model: Model, params: Any, token: jax.Array, cache: KVCache, position: jax.Array) -> tuple[jax.Array, KVCache]:
    """One token per sequence (``token`` [batch]) at ``position``: the next logits ``[batch, vocab]`` and the cache."""
    logits, cache = forward(model, params, token[:, None], cache, position)
    return logits[:, 0], cache


def next_token(logits: jax.Array, key: jax.Array, temperature: float, top_k: int | None) -> jax.Array:
    """A token per row of ``logits`` [batch, vocab]: the argmax when ``temperature`` is 0, else a draw
    from ``softmax(logits / temperature)``, limited to the ``top_k`` largest logits when given (ties
    with the k-th are kept)."""
    if temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    if top_k is not None:
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    return jax.random.categorical(key, logits / temperature, axis=-1).astype(jnp.int32)


def generate(
    model: Model,
    params: Any,
    prompt: jax.Array,
    key: jax.Array,
    *,
    max_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    eos_id: int | None = None,
    on_token: OnToken | None = None,
    compiler_options: Mapping[str, Any] | None = None,
) -> tuple[np.ndarray, int]:
    """Continue ``prompt`` with jzero's GPT or a decoder by up to ``max_tokens`` tokens: :func:`decode_loop` with
    :func:`prefill` and :func:`decode_step`.

    Args:
      model: the GPT or a decoder (:mod:`jzero.models.gpt`, :mod:`jzero.models.decoder`).
      params: its params tree, on the device to decode on.
      prompt: ``[batch, length]`` int token ids, at least one per row.
      key: the PRNG key.
      max_tokens: how many tokens to make; ``length + max_tokens`` at most ``model.seq_len``, the
        positions the model was trained on.
      temperature: 0 for greedy (argmax), else the softmax temperature.
      top_k: sample from the ``top_k`` most likely tokens only.
      eos_id: the end-of-document token, where a row stops.
      on_token: called on the host with each step's tokens, as they are made.
      compiler_options: XLA options for the loop's compile (the run's, as training had them).

    Returns:
      ``(tokens, count)``, as :func:`decode_loop`.

    Raises:
      ValueError: ``length + max_tokens`` exceeds ``model.seq_len``.
    """
    length = prompt.shape[1]
    if length + max_tokens > model.seq_len:
        raise ValueError(f"generate: {length} prompt tokens and {max_tokens} new ones do not fit model.seq_len {model.seq_len}")
    return decode_loop(
        partial(prefill, model),
        partial(decode_step, model),
        params,
        prompt,
        key,
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        eos_id=eos_id,
        on_token=on_token,
        compiler_options=compiler_options,
    )


def decode_loop(
    prefill_fn: Callable[[Any, jax.Array, int], tuple[jax.Array, Any]],
    step_fn: Callable[[Any, jax.Array, Any, jax.Array], tuple[jax.Array, Any]],
    params: Any,
    prompt: jax.Array,
    key: jax.Array,
    *,
    max_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    eos_id: int | None = None,
    on_token: OnToken | None = None,
    compiler_options: Mapping[str, Any] | None = None,
) -> tuple[np.ndarray, int]:
    """One prefill, then every new token inside one compiled ``while_loop``: any model with a cache.

    Args:
      prefill_fn: ``prefill_fn(params, prompt, max_len)`` returns the last position's logits
        ``[batch, vocab]`` and a cache with room for ``max_len`` positions (any pytree of arrays).
      step_fn: ``step_fn(params, token, cache, position)``, ``token`` [batch] at ``position``,
        returns the next logits ``[batch, vocab]`` and the cache with the token added (same shapes).
      params: the model's parameters, passed to both (arguments of the compiled loop, not constants).
      prompt: ``[batch, length]`` int token ids, at least one per row.
      key: the PRNG key; step ``i`` draws with ``fold_in(key, i)``.
      max_tokens: how many tokens to make, at least 1; the cache holds ``length + max_tokens``.
      temperature: 0 for greedy (argmax), else the softmax temperature (:func:`next_token`).
      top_k: sample from the ``top_k`` most likely tokens only.
      eos_id: once a row makes it, that row makes only ``eos_id``; the loop ends when every row has.
      on_token: called on the host with each step's tokens [batch] and the step's index, in order,
        while the loop runs (an ordered ``io_callback``): what streams the text.
      compiler_options: XLA options for the loop's compile (``Lowered.compile``'s).

    Returns:
      ``(tokens, count)``: the ``[batch, max_tokens]`` tokens made, of which the first ``count``
      columns were decoded (the rest, after every row's ``eos_id``, are ``eos_id``).

    Raises:
      ValueError: an empty prompt, or ``max_tokens`` under 1.
    """
    batch, length = prompt.shape
    if length < 1 or max_tokens < 1:
        raise ValueError(f"decode_loop: needs a prompt token and a new one per row, not {length} and {max_tokens}")
    fill = -1 if eos_id is None else eos_id

    def loop(params, prompt, key):
        logits, cache = prefill_fn(params, prompt, length + max_tokens)

        def body(carry):
            i, logits, cache, done, out = carry
            token = jnp.where(done, fill, next_token(logits, jax.random.fold_in(key, i), temperature, top_k))
            if on_token is not None:
                io_callback(lambda t, n: on_token(np.asarray(t), int(n)), None, token, i, ordered=True)
            done = done | (token == fill)
            logits, cache = step_fn(params, token, cache, length + i)  # the last one goes unused
            return i + 1, logits, cache, done, out.at[:, i].set(token)

        def more(carry):
            return (carry[0] < max_tokens) & ~jnp.all(carry[3])

        start = (0, logits, cache, jnp.zeros(batch, bool), jnp.full((batch, max_tokens), fill, jnp.int32))
        count, _, _, _, out = jax.lax.while_loop(more, body, start)
        return out, count

    args = (params, jnp.asarray(prompt, jnp.int32), key)
    out, count = jax.jit(loop).lower(*args).compile(compiler_options=compiler_options)(*args)
    return np.asarray(out), int(count)
