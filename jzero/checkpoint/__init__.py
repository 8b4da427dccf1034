"""Checkpoints: a run's Orbax checkpoints, their integrity manifests, and safetensors export."""

__all__ = []
