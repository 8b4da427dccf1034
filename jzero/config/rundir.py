"""The run folder (``run.dir``): the name of everything a run writes there, and its metrics log read
back. It imports no JAX: the launcher reads it between restarts."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["CHECKPOINTS", "LOCK", "RunDir", "not_a_folder"]

CHECKPOINTS = "checkpoints"  # <run.dir>/checkpoints/<step>/, one folder per committed step
LOCK = "train.lock"  # held by the one jzero train writing the folder (jzero.config.runlock); gone when it ends


def not_a_folder(path: str | Path) -> str | None:
    """Why a run folder a reader was given is not a folder, in words, or None when it is one."""
    path = Path(path)
    if path.is_dir():
        return None
    if path.is_symlink():
        return f"is not a run folder: it is a symbolic link to {os.readlink(path)}, which does not exist"
    return "is a file, not a run folder" if path.exists() else "is not a run folder: no such folder"


@dataclasses.dataclass(frozen=True)
class RunDir:
    """A run's folder and the paths of its outputs.

    Attributes:
      path: the folder, ``run.dir``.
    """

    path: Path

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def lock(self) -> Path:
        """The lock file of the trainer writing here (:class:`jzero.config.runlock.RunLock`)."""
        return self.path / LOCK

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    @property
    def tokenizer(self) -> Path:
        """The run's own copy of its BPE tokenizer (a byte-level run has none): what ``jzero sample`` decodes with."""
        return self.path / "tokenizer.json"

    @property
    def hf_config(self) -> Path:
        """The Hugging Face ``config.json`` a run imported from (``jzero checkpoint import``): what an
        export keeps of it beyond the model's shape (token ids, names)."""
        return self.path / "hf_config.json"

    @property
    def profile(self) -> Path:
        """The ``jax.profiler`` trace of ``run.profile``'s steps."""
        return self.path / "profile"

    def resumed_config(self, step: int) -> Path:
        """Where a run resumed at ``step`` with another config writes it."""
        return self.path / f"config.step-{step}.yaml"

    def ledger(self, step: int) -> Path:
        """The start-up ledger's file: ``ledger.json``, or ``ledger.step-N.json`` when resumed."""
        first = self.path / "ledger.json"
        return first if not first.exists() else self.path / f"ledger.step-{step}.json"

    def holds(self) -> list[str]:
        """The names of a run's own files already here: a folder that has one holds a run."""
        return [p.name for p in (self.metrics, self.config, self.checkpoints) if p.exists()]

    def newest_committed_step(self) -> int | None:
        """The newest checkpoint Orbax committed (a folder named by its step alone), or None."""
        folder = self.checkpoints
        steps = [int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit()] if folder.is_dir() else []
        return max(steps, default=None)

    def last_logged_step(self) -> int | None:
        """The step of the last whole record in ``metrics.jsonl``, or None."""
        return max((record["step"] for _, record in self._records()), default=None)

    def trim_metrics(self, last_step: int) -> int:
        """Drop the records past ``last_step`` (and a torn last line) from ``metrics.jsonl``,
        atomically, so a resumed run logs each step once. Returns how many were dropped.

        Raises:
          OSError: the log could not be rewritten.
        """
        lines = self.metrics.read_text(errors="replace").splitlines() if self.metrics.exists() else []
        kept = [line for line, record in self._records() if record["step"] <= last_step]
        if len(kept) == len(lines):
            return 0
        tmp = self.metrics.with_name(f".{self.metrics.name}.trim-{os.getpid()}")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, self.metrics)
        return len(lines) - len(kept)

    def _records(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Each whole record of ``metrics.jsonl`` with an integer step, and its line."""
        if not self.metrics.exists():
            return
        for line in self.metrics.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                yield line, record
