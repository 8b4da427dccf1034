"""``run.profile``: a ``jax.profiler`` trace of a window of train steps, one ``train`` step annotation
per step, into ``<run.dir>/profile/`` (TensorBoard's profile plugin reads its ``.xplane.pb``;
Perfetto opens its ``perfetto_trace.json.gz``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax

from jzero.config.schema import ProfileConfig
from jzero.training.hooks import writing

__all__ = ["STEP_NAME", "ProfileWindow"]

STEP_NAME = "train"  # the annotation's name; its ``step_num`` is the step's number (1-based)


class ProfileWindow:
    """Traces steps ``start + 1`` to ``start + steps``: the trace starts before the first of them and
    stops once the last one's outputs are ready. With no config, it does nothing.

    Args:
      config: ``run.profile``, or None.
      folder: where the trace goes (``<run.dir>/profile``).
      overhead: called with the seconds the trace's start and stop took (not the steps').
    """

    def __init__(self, config: ProfileConfig | None, folder: Path, overhead: Callable[[float], None] = lambda s: None):
        self.config, self.folder, self.overhead = config, folder, overhead
        self.active = False

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[list[Any]]:
        """Around the call that runs step ``step`` (1-based); put its outputs in the yielded list, so
        that the trace ends only once the last traced step has run."""
        outputs: list[Any] = []
        c = self.config
        if c is None or not c.start < step <= c.start + c.steps:
            yield outputs
            return
        if not self.active:
            t0 = time.perf_counter()
            with writing(self.folder):
                self.folder.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(self.folder), create_perfetto_trace=True)
            self.active = True
            self.overhead(time.perf_counter() - t0)
        with jax.profiler.StepTraceAnnotation(STEP_NAME, step_num=step):
            yield outputs
        if step == c.start + c.steps:
            self.close(outputs)

    def close(self, outputs: Any = None) -> None:
        """Stop a trace in progress (at its last step, or when the run stops early)."""
        if self.active:
            jax.block_until_ready(outputs)  # the last traced step, inside the trace
            t0 = time.perf_counter()
            jax.profiler.stop_trace()
            self.active = False
            self.overhead(time.perf_counter() - t0)
