"""What a checkpoint records of the run that wrote it (its ``meta`` item), and what a live state's
shardings tell of the run that holds it: the mesh, the ZeRO stage, the device and process counts.

:class:`RunMeta` is the record jzero's loop saves; a loop of your own may save any JSON object
(:meth:`jzero.checkpoint.runs.RunCheckpoints.save`), and :meth:`RunMeta.read` reads the keys it
knows from either.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
from jax.sharding import NamedSharding

from jzero.records import omit_if_none, record
from jzero.sharding.axes import DATA
from jzero.sharding.stages import layout_stage, stage_rule
from jzero.sharding.state import TrainState

__all__ = ["STAGE_1_OR_2", "RunMeta", "changes", "run_meta", "state_layout"]


@record
class RunMeta:
    """A checkpoint's ``meta``: what jzero's loop saves (:func:`run_meta`), the layout its state
    showed (:func:`state_layout`), and what each save adds (``step``, ``saved_at``, ``manifest``).
    A field the checkpoint does not hold (one written by your own loop, or before the key existed) is
    None, and a None field is left out of what a save writes, so it never hides the state's layout.

    Attributes:
      config: the resolved config, as ``config.yaml`` holds it.
      mesh: the mesh's axis sizes.
      stage: the ZeRO stage, or ``"1-2"`` where only the state's shardings said it (:data:`STAGE_1_OR_2`).
      devices: the devices of the job.
      processes: its processes.
      num_params: the model's parameters.
      rng: the run's random key, as integers.
      step: the step saved.
      saved_at: when, in seconds since the epoch.
      manifest: the name of the checksum manifest the step was written with.
    """

    config: dict[str, Any] | None = omit_if_none()
    mesh: dict[str, int] | None = omit_if_none()
    stage: int | str | None = omit_if_none()
    devices: int | None = omit_if_none()
    processes: int | None = omit_if_none()
    num_params: int | None = omit_if_none()
    rng: list[int] | None = omit_if_none()
    step: int | None = omit_if_none()
    saved_at: float | None = omit_if_none()
    manifest: str | None = omit_if_none()

    @classmethod
    def read(cls, saved: Mapping[str, Any]) -> RunMeta:
        """The keys of a saved ``meta`` object that this record knows; any other key is left out."""
        return cls(**{name: saved.get(name) for name in cls.__dataclass_fields__})


def run_meta(config_dict: dict[str, Any], mesh_axes: dict[str, int], stage: int, num_params: int, rng: jax.Array) -> RunMeta:
    """What jzero's loop saves with each checkpoint about the run that wrote it."""
    return RunMeta(
        config=config_dict,
        mesh=mesh_axes,
        stage=stage,
        devices=jax.device_count(),
        processes=jax.process_count(),
        num_params=num_params,
        rng=[int(x) for x in jax.random.key_data(rng).ravel()],
    )


STAGE_1_OR_2 = layout_stage(params=False, optimizer=True)  # "1-2": what a state's shardings say of stages 1 and 2


def state_layout(state: TrainState) -> dict[str, Any]:
    """What a live state's shardings tell of the run that holds it, as :func:`run_meta` records it:
    ``mesh`` (axis sizes), ``devices``, ``processes`` and, with a ``data`` axis over 1, ``stage``: what
    the parameters' and the optimizer state's partitioning over ``data`` show
    (:func:`~jzero.sharding.stages.layout_stage`: ``"1-2"`` for either of those). Empty for a state
    whose arrays are not laid out on a mesh."""
    named = [x.sharding for x in jax.tree.leaves(state) if isinstance(getattr(x, "sharding", None), NamedSharding)]
    if not named:
        return {}
    mesh = named[0].mesh
    layout = {"mesh": {a: int(n) for a, n in mesh.shape.items()}, "devices": jax.device_count(), "processes": jax.process_count()}
    if int(mesh.shape.get(DATA, 1)) > 1:
        layout["stage"] = layout_stage(_on_data(state.params), _on_data(state.opt_state))
    return layout


def _on_data(tree: Any) -> bool:
    """Whether any array of ``tree`` is split over ``data``."""
    specs = [x.sharding.spec for x in jax.tree.leaves(tree) if isinstance(getattr(x, "sharding", None), NamedSharding)]
    return any(DATA in (e if isinstance(e, tuple) else (e,)) for spec in specs for e in spec)


def changes(saved: RunMeta, mesh_axes: dict[str, int], stage: int) -> str | None:
    """How the resuming run's layout differs from the checkpoint's, or None."""
    now = {"mesh": mesh_axes, "stage": stage, "devices": jax.device_count()}
    rule = stage_rule(stage)
    same = {"stage": (stage, layout_stage(rule.params, rule.optimizer))}  # as its layout shows it
    diffs = [f"{k} {getattr(saved, k)} -> {v}" for k, v in now.items() if getattr(saved, k) not in same.get(k, (v,))]
    return ", ".join(diffs) if diffs else None
