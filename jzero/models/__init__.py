"""Models that jzero trains out of the box: the GPT."""

__all__ = []
