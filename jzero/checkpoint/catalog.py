"""A run's checkpoint steps as a whole: the committed ones listed, each verified, every folder
described (``jzero checkpoint info``), and the newest read while the run may be rotating them.

Above :mod:`jzero.checkpoint.runs`, whose :class:`~jzero.checkpoint.runs.RunCheckpoints` lists the
steps through Orbax.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jzero.checkpoint import integrity
from jzero.checkpoint.meta import RunMeta
from jzero.checkpoint.runs import RunCheckpoints
from jzero.checkpoint.verify import read_meta, rotated_away, step_folder, verify_step
from jzero.config.run_folder import CHECKPOINTS, not_a_folder
from jzero.errors import CheckpointError, ConfigError, DamagedCheckpoint, RotatedAway
from jzero.records import record

__all__ = ["NO_COMMITTED_STEP", "StepFolder", "Verdict", "committed_steps", "describe", "read_newest", "verify_run"]

NO_COMMITTED_STEP = "has no committed checkpoint (jzero train saves one every checkpoint.every steps)"
_TMP = re.compile(r"^(\d+)\.orbax-checkpoint-tmp")


@record
class StepFolder:
    """One checkpoint folder of a run (:func:`describe`), committed or not.

    Attributes:
      step: its step.
      committed: whether Orbax committed it (a folder named by its step alone).
      verified: True (its files match its manifest), False (written before manifests) or None (not committed).
      mesh: the mesh's axis sizes it recorded, or None.
      stage: its ZeRO stage (``"1-2"`` where only its shardings said it), or None.
      devices: its device count, or None.
      processes: its process count, or None.
      bytes: its files' bytes on disk.
      path: the folder.
    """

    step: int
    committed: bool
    verified: bool | None
    mesh: dict[str, int] | None
    stage: int | str | None
    devices: int | None
    processes: int | None
    bytes: int
    path: str


def committed_steps(run_dir: str | Path, step: int | None = None) -> list[int]:
    """A run's committed steps, oldest first; with ``step``, just that one.

    Raises:
      CheckpointError: ``run_dir`` holds no checkpoints folder.
      ConfigError: ``step`` is not a committed step (``--step``).
    """
    for attempt in range(5):  # Orbax stats each step it lists: one the run rotates away meanwhile is gone
        try:
            checkpoints = RunCheckpoints(run_dir, read_only=True)
            break
        except (FileNotFoundError, NotADirectoryError):
            if attempt == 4:
                raise
            time.sleep(0.05)
    steps = checkpoints.steps()
    checkpoints.close()
    if step is not None and step not in steps:
        raise ConfigError("--step", f"no committed checkpoint at step {step} (committed: {', '.join(map(str, steps)) or 'none'})")
    return steps if step is None else [step]


Verdict = int | integrity.Unverified | DamagedCheckpoint  # bytes verified, no manifest, or the damage


def verify_run(run_dir: str | Path, step: int | None = None) -> list[tuple[int, Verdict]]:
    """Each committed step (or one) with its verdict: bytes verified, ``Unverified``, or the damage.
    A step the run's own rotation deleted while it was read is left out: it was not damaged."""
    verdicts = []
    for s in committed_steps(run_dir, step):
        folder = step_folder(run_dir, s)
        try:
            verdict: Verdict = verify_step(folder)
        except DamagedCheckpoint as err:
            verdict = err
        except RotatedAway:
            continue
        if isinstance(verdict, int) or not rotated_away(folder):
            verdicts.append((s, verdict))
    return verdicts


def read_newest(run_dir: str | Path, step: int | None, read: Callable[[Path], Any]) -> Any:
    """``read(step_dir)`` of ``step``, or of the newest committed step; if the run's rotation
    deletes the newest while it is read, the new newest is read instead.

    Raises:
      CheckpointError: the run has no committed step, or the step named was deleted by the
        rotation while it was read; or what :func:`committed_steps` and ``read`` raise.
    """
    while True:
        steps = committed_steps(run_dir, step)
        if not steps:
            raise CheckpointError(str(run_dir), NO_COMMITTED_STEP)
        step_dir = step_folder(run_dir, steps[-1])
        try:
            return read(step_dir)
        except Exception:
            if not rotated_away(step_dir):
                raise
            if step is not None:
                raise RotatedAway(step_dir) from None


def describe(run_dir: str | Path) -> list[StepFolder]:
    """Every checkpoint folder of a run, committed or not, oldest first.

    Raises:
      DamagedCheckpoint: the first committed step whose files are not what was written.
    """
    directory = Path(run_dir) / CHECKPOINTS
    if not directory.is_dir():
        raise CheckpointError(str(run_dir), not_a_folder(run_dir) or f"holds no checkpoints ({directory} does not exist)")
    verdicts = dict(verify_run(run_dir))
    for verdict in verdicts.values():
        if isinstance(verdict, DamagedCheckpoint):
            raise verdict
    rows = []
    for entry in sorted(directory.iterdir()):
        tmp = _TMP.match(entry.name)
        if not entry.is_dir() or not (entry.name.isdigit() or tmp):
            continue
        step = int(entry.name) if entry.name.isdigit() else int(tmp.group(1))
        meta = RunMeta.read(read_meta(entry))
        committed = entry.name.isdigit() and step in verdicts
        verified = not isinstance(verdicts[step], integrity.Unverified) if committed else None
        rows.append(StepFolder(step=step, committed=committed, verified=verified, mesh=meta.mesh, stage=meta.stage,
                               devices=meta.devices, processes=meta.processes, bytes=_size(entry), path=str(entry)))  # fmt: skip
    return sorted(rows, key=lambda r: (r.step, r.committed))


def _size(folder: Path) -> int:
    """The bytes of the files under ``folder``; those deleted while counted (a rotation) count 0."""
    total = 0
    for parent, _, files in os.walk(folder):  # os.walk skips folders that vanish
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(parent, name)).st_size
    return total
