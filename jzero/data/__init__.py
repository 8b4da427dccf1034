"""Text to token ids and back, without JAX: tokenizers (bytes or BPE), the token folder that
``jzero data prepare`` writes, and reading it."""

__all__ = []  # a folder: its modules are the API
