"""A committed checkpoint step's files checked against its manifest, with every process agreeing,
and a step that failed to read told apart from one its run's rotation (``checkpoint.keep``) deleted
meanwhile.

Below :mod:`jzero.checkpoint.runs`, which checks each step it restores, and
:mod:`jzero.checkpoint.catalog`, which lists and verifies a run's steps.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from jzero.checkpoint import integrity
from jzero.config.run_folder import CHECKPOINTS, writer_may_be_live
from jzero.errors import DamagedCheckpoint, RotatedAway

__all__ = ["ROTATION_WAIT_S", "on_every_process", "read_meta", "rotated_away", "step_folder", "verify_step"]

ROTATION_WAIT_S = 2.0  # how long a step that failed to read may take to vanish, when a trainer is live


def on_every_process(flag: bool) -> list[bool]:
    """Each process's ``flag``, in process order (a collective when there are several)."""
    if jax.process_count() == 1:
        return [flag]
    return [bool(x) for x in np.asarray(multihost_utils.process_allgather(np.int32(flag))).ravel()]


def step_folder(run_dir: str | Path, step: int) -> Path:
    """``<run_dir>/checkpoints/<step>``, absolute (Orbax wants absolute paths)."""
    return Path(run_dir).absolute() / CHECKPOINTS / str(step)


def verify_step(step_dir: Path, warn: Callable[[str], None] | None = None) -> integrity.Unverified | int:
    """Check a committed step's files against its manifest, with every process agreeing.

    The processes share the hashing (:func:`jzero.checkpoint.integrity.verify`'s ``part``); a file found bad by
    one makes the step damaged on all. A step whose ``meta`` says it was written with a manifest
    and has none is damaged; one written before manifests is :class:`~jzero.checkpoint.integrity.Unverified`,
    and ``warn`` (if given) is told so in one line.

    Returns:
      The bytes this process hashed, or ``Unverified``.

    Raises:
      DamagedCheckpoint: naming the step folder and the first bad file this process found.
      CheckpointError: the step was deleted by its run's rotation while it was checked.
    """
    expect = read_meta(step_dir).get("manifest") == integrity.MANIFEST
    try:
        verdict, damage = integrity.verify(step_dir, (jax.process_index(), jax.process_count()), expect), None
    except DamagedCheckpoint as err:
        verdict, damage = None, err
    found = on_every_process(damage is not None)
    if damage is None and any(found):
        damage = DamagedCheckpoint(step_dir, "a data file", f"failed its checksum on process {found.index(True)}")
    if damage is not None:
        raise damage
    if isinstance(verdict, integrity.Unverified) and rotated_away(step_dir):  # its manifest went first
        raise RotatedAway(step_dir)
    if warn is not None and isinstance(verdict, integrity.Unverified):
        warn(f"jzero: warning: {verdict}")
    return verdict


def rotated_away(step_dir: Path) -> bool:
    """Whether a step that failed to read (or read without its manifest) was being deleted meanwhile
    by its run's rotation (``checkpoint.keep``): while a trainer may be writing the run, its folder
    goes within moments (Orbax removes it file by file); otherwise it is not waited for."""
    live = writer_may_be_live(step_dir.parent.parent)
    deadline = time.monotonic() + (ROTATION_WAIT_S if live else 0.0)
    while step_dir.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return not step_dir.exists()


def read_meta(step_dir: Path) -> dict[str, Any]:
    """The ``meta`` item a step folder holds, as saved, or an empty object where it is missing or not
    JSON (a step written before a key existed, or half-deleted by a rotation)."""
    try:
        return json.loads((step_dir / "meta" / "metadata").read_text())
    except (OSError, ValueError):
        return {}
