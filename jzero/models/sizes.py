"""The GPT's size and its model FLOPs from its shape alone, without building it or importing JAX:
what config validation needs to refuse a model too large to count, and what MFU divides by."""

from __future__ import annotations

__all__ = ["gpt_flops_per_token", "gpt_matmul_params", "gpt_param_count"]


def gpt_param_count(vocab_size: int, d_model: int, n_layers: int, mlp_ratio: int) -> int:
    """The GPT's parameter count, to the leading terms: embedding and head, then per layer the
    attention (4 d^2) and MLP (2 r d^2) kernels."""
    return 2 * vocab_size * d_model + n_layers * (4 + 2 * mlp_ratio) * d_model**2


def gpt_matmul_params(vocab_size: int, d_model: int, n_layers: int, mlp_ratio: int) -> int:
    """The weights every token multiplies by: per layer the q, k, v and output projections (4 d^2)
    and the MLP (2 r d^2), then the LM head (V d, tied or not). The token embedding's lookup is a
    gather, not a matmul; biases and LayerNorms are elementwise."""
    return n_layers * (4 + 2 * mlp_ratio) * d_model**2 + vocab_size * d_model


def gpt_flops_per_token(vocab_size: int, d_model: int, n_layers: int, mlp_ratio: int, seq_len: int) -> int:
    """Training FLOPs per token the GPT needs (PaLM, Chowdhery et al. 2022, appendix B): 6 N for the
    forward and backward matmuls over N :func:`gpt_matmul_params`, plus 12 L T d for attention's
    scores and weighted values at sequence length T. Remat's recomputation is not counted."""
    return 6 * gpt_matmul_params(vocab_size, d_model, n_layers, mlp_ratio) + 12 * n_layers * seq_len * d_model
