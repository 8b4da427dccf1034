"""The config layer: YAML files to a validated :class:`~jzero.config.schema.Config`, and the run
folder's layout. Nothing here imports JAX, so the command line and the launcher read configs fast."""

__all__ = []
