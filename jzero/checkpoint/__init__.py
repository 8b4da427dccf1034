"""Checkpoints: a run's Orbax checkpoints, their integrity manifests, and safetensors export.

The Python API of ``jzero checkpoint export`` loads on first use from here, e.g.
``jzero.checkpoint.export_checkpoint("runs/mine", "model.safetensors")``.
"""

from typing import TYPE_CHECKING

from jzero.lazy import lazy_names

_API = {"export_checkpoint": "jzero.checkpoint.export"}
if TYPE_CHECKING:  # the table above, for type checkers and IDEs (tests/test_api.py keeps the two equal)
    from jzero.checkpoint.export import export_checkpoint
__all__ = sorted(_API)
__getattr__, __dir__ = lazy_names(__name__, _API)
