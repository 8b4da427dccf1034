"""Checkpoints: a run's Orbax checkpoints, their integrity manifests, and safetensors export.

The Python API of ``jzero checkpoint export`` loads on first use from here, e.g.
``jzero.checkpoint.export_checkpoint("runs/mine", "model.safetensors")``.
"""

from jzero.lazy import lazy_names

_API = {"export_checkpoint": "jzero.checkpoint.export"}
__all__ = sorted(_API)
__getattr__, __dir__ = lazy_names(__name__, _API)
