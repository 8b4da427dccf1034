"""The GPT's choices a config names, readable before JAX starts (the config layer checks them)."""

from __future__ import annotations

__all__ = ["ATTENTION", "AUTO_ATTENTION", "GPT", "MODELS", "OWN"]

# What ``model.name`` may say: jzero's GPT, or a model of your own (its ``init_fn`` and ``loss_fn``
# from ``model.entry`` or passed to ``jzero.build_job``), of which only the batch's shape is configured.
MODELS = ("gpt", "own")
GPT, OWN = MODELS

# How the GPT attends (``jax.nn.dot_product_attention``'s implementations): ``xla``, any backend,
# with the [batch, heads, T, T] logits in float32; ``cudnn``, the fused flash kernel, which never
# materialises them (GPUs, 16-bit compute).
ATTENTION = ("xla", "cudnn")
AUTO_ATTENTION = "auto"  # cudnn where the devices and the compute dtype allow it, else xla
