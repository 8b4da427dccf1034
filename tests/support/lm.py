"""``(init_fn, loss_fn)`` of any Flax linen language model over token batches."""

import jax.numpy as jnp
import optax


def lm_parts(model, seq_len: int = 16):
    """``(init_fn, loss_fn)`` of ``model`` (tokens ``[batch, T]`` -> logits) for token batches
    ``[batch, seq_len + 1]``: next-token cross-entropy."""

    def init_fn(key):
        return model.init(key, jnp.zeros((1, seq_len), jnp.int32))["params"]

    def loss_fn(params, batch):
        logits = model.apply({"params": params}, batch[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

    return init_fn, loss_fn
