"""jzero's models and the choices a config names, readable before JAX starts (the config layer checks them)."""

from __future__ import annotations

__all__ = ["ADAPTERS", "ATTENTION", "AUTO_ATTENTION", "GPT", "KEYS", "LLAMA", "MODELS", "OWN", "A", "B", "is_adapter"]

# What ``model.name`` may say: jzero's GPT, its Llama, or a model of your own (its ``init_fn`` and
# ``loss_fn`` from ``model.entry`` or passed to ``jzero.build_job``), of which only the batch's shape
# is configured.
MODELS = ("gpt", "llama", "own")
GPT, LLAMA, OWN = MODELS

# The ``model:`` keys each of jzero's models reads; the others must keep their defaults.
_SHARED = (
    "vocab_size", "d_model", "n_layers", "n_heads", "seq_len", "remat", "tie_embeddings", "partition_activations", "attention",
)  # fmt: skip
KEYS = {
    GPT: (*_SHARED, "mlp_ratio"),
    LLAMA: (*_SHARED, "n_kv_heads", "mlp_hidden", "rope_theta", "rope_scaling", "rms_norm_eps"),
}

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
