"""More than one process: this process's start and exit, ``jax.distributed``, and the launcher."""

__all__ = []
