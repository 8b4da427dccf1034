"""The GPT's size from its shape alone, without building it or importing JAX: what config validation
needs to refuse a model too large to count."""

from __future__ import annotations

__all__ = ["gpt_param_count"]


def gpt_param_count(vocab_size: int, d_model: int, n_layers: int, mlp_ratio: int) -> int:
    """The GPT's parameter count, to the leading terms: embedding and head, then per layer the
    attention (4 d^2) and MLP (2 r d^2) kernels."""
    return 2 * vocab_size * d_model + n_layers * (4 + 2 * mlp_ratio) * d_model**2
