"""jzero's models and the choices a config names, readable before JAX starts (the config layer checks them)."""

from __future__ import annotations

from jzero.models.architectures import ARCHITECTURES, DECODERS

__all__ = [
    "ADAPTERS", "ATTENTION", "AUTO_ATTENTION", "DECODERS", "GPT", "KEYS", "LLAMA", "MODELS", "OWN", "A", "B", "is_adapter",
]  # fmt: skip

# What ``model.name`` may say: a row of the architecture table (jzero's GPT, or the decoder of
# Llama, Qwen, Mistral or Gemma, jzero.models.architectures), or a model of your own (its
# ``init_fn`` and ``loss_fn`` from ``model.entry`` or passed to ``jzero.build_job``), of which only
# the batch's shape is configured.
GPT, LLAMA, OWN = "gpt", "llama", "own"
MODELS = (*(a.name for a in ARCHITECTURES), OWN)

# The ``model:`` keys each of jzero's models reads; the others must keep their defaults.
KEYS = {a.name: a.keys for a in ARCHITECTURES}

# How the models attend (``jax.nn.dot_product_attention``'s implementations): ``xla``, any backend,
# with the [batch, heads, T, T] logits in float32; ``cudnn``, the fused flash kernel, which never
# materialises them (GPUs, 16-bit compute).
ATTENTION = ("xla", "cudnn")
AUTO_ATTENTION = "auto"  # cudnn where the devices and the compute dtype allow it, else xla

# LoRA's adapters (jzero.models.lora): their parameters' names, beside the kernel each adapts.
A, B = "lora_a", "lora_b"
ADAPTERS = (f"/{A}$", f"/{B}$")  # the path regexes that train when lora is on and train.trainable is unset


def is_adapter(path: str) -> bool:
    """Whether the parameter at ``path`` is an adapter's ``A`` or ``B``."""
    return path.endswith((f"/{A}", f"/{B}"))
