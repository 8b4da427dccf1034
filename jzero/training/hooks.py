"""What the training loop does besides stepping, as hooks it calls (Levanter's pattern).

The loop (:func:`jzero.training.loop.train`) steps and, at logged steps, turns the device metrics into
one host-side record. Everything else is a :class:`Hook`: the progress bar, ``metrics.jsonl``,
TensorBoard, the checkpoint cadence and preemption, made in the loop's order by
:func:`jzero.training.loop.default_hooks`. A Python caller adds its own with ``train(config, hooks=[...])``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax

from jzero.checkpoint.runs import RunCheckpoints
from jzero.errors import OutputWriteError
from jzero.sharding.state import TrainState
from jzero.training.goodput import Goodput
from jzero.training.nonfinite import NonFiniteSteps
from jzero.training.preemption import Preemption
from jzero.training.progress import TrainProgress

__all__ = [
    "CheckpointHook",
    "ClosingHooks",
    "Hook",
    "JsonlHook",
    "PreemptionHook",
    "ProgressHook",
    "TensorBoardHook",
    "close_hooks",
    "closed_on_error",
    "writing",
]


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """An ``OSError`` inside becomes an :class:`OutputWriteError` naming ``path``."""
    try:
        yield
    except OSError as err:
        raise OutputWriteError(path, err) from err


class Hook:
    """Something the training loop calls; override what you need. Every method is a no-op here.

    The loop calls, in order: :meth:`step` after each step, :meth:`log` at each logged step,
    :meth:`stop_requested` before each step, :meth:`end` once after the last step (also when the
    run stops early), and :meth:`close` on every exit, errors included, except an abort by a second
    Ctrl-C (which leaves a checkpoint write in flight uncommitted rather than wait for it).
    """

    def step(self, step: int, state: TrainState) -> None:
        """After each train step; ``step`` is the number of steps done."""

    def log(self, record: dict[str, Any]) -> None:
        """At each logged step: ``record`` holds ``step``, ``loss``, ``grad_norm``,
        ``learning_rate``, ``tokens_per_sec``, ``model_flops_per_sec``, ``skipped_steps`` (and
        ``mfu`` where the device's peak is known, ``loss_scale`` with loss scaling, ``eval_loss``
        and ``eval_perplexity`` at eval steps)."""

    def stop_requested(self) -> bool:
        """Whether the loop should stop before its next step."""
        return False

    def end(self, step: int, state: TrainState, preempted: str | None) -> None:
        """After the last step run; ``preempted`` names the signal that stopped the run early."""

    def close(self) -> None:
        """Release what the hook holds; called once, on every exit path."""


class ProgressHook(Hook):
    """The progress bar: advanced each step, loss and tokens/s at logged steps."""

    def __init__(self, bar: TrainProgress):
        self.bar = bar

    def step(self, step: int, state: TrainState) -> None:
        self.bar.advance(step)

    def log(self, record: dict[str, Any]) -> None:
        self.bar.update(record["step"], record)


class JsonlHook(Hook):
    """One JSON object per logged step, appended to ``metrics.jsonl`` and flushed at once."""

    def __init__(self, path: Path):
        self.path = path
        with writing(path):
            self.file = open(path, "a")

    def log(self, record: dict[str, Any]) -> None:
        with writing(self.path):
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()

    def close(self) -> None:
        with writing(self.path):
            self.file.close()


def _tensorboard_x() -> tuple[Any, Any, Any]:
    """tensorboardX's ``EventsWriter``, ``Event`` and ``scalar``, imported only by runs that log to
    TensorBoard, and without PyTorch: tensorboardX's package imports torch where it is installed
    (for torch tensors, which a run never logs), 1.2 s of every run's start-up here."""
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # ``import torch`` raises ImportError, which tensorboardX allows
    try:
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar
    finally:
        if hide:
            del sys.modules["torch"]
    return EventsWriter, Event, scalar


class TensorBoardHook(Hook):
    """Each logged record's numbers as TensorBoard scalars in an event file under ``logdir``.

    Written in the loop's thread with tensorboardX's ``EventsWriter``, not its ``SummaryWriter``,
    whose background thread printed its own traceback when the disk filled: a failed write raises
    :class:`OutputWriteError`, like every other output of the run.
    """

    def __init__(self, logdir: str | Path):
        EventsWriter, Event, scalar = _tensorboard_x()
        # It logs a warning for each NaN it is given; the loss is NaN in metrics.jsonl too, and a
        # diverging run says so in its own line (jzero.training.nonfinite).
        logging.getLogger("tensorboardX.x2num").setLevel(logging.ERROR)
        self.logdir, self.event, self.scalar = Path(logdir), Event, scalar
        with writing(self.logdir):
            self.logdir.mkdir(parents=True, exist_ok=True)
            self.writer = EventsWriter(str(self.logdir / "events"))

    def log(self, record: dict[str, Any]) -> None:
        with writing(self.logdir):
            for name, value in record.items():
                if name != "step":
                    event = self.event(wall_time=time.time(), step=record["step"], summary=self.scalar(name, value))
                    self.writer.write_event(event)
            self.writer.flush()

    def close(self) -> None:
        with writing(self.logdir):
            self.writer.close()


class CheckpointHook(Hook):
    """Saves every ``checkpoint.every`` steps and at the last step; on preemption, the step reached.

    Args:
      checkpoints: the run's checkpoints.
      first_step: the step the run started from (a run preempted there has nothing new to save).
      last_step: ``train.steps``.
      data_state: ``data_state(step)``, the data iterator's state before ``step``.
      meta: what each checkpoint records about the run.
      warn: where a skipped save is reported.
      goodput: where the saves' time is charged (after the step in flight has finished), or None.
      nonfinite: the run's non-finite steps: a save is refused when a loss since the previous save
        point was not finite (:meth:`~jzero.training.nonfinite.NonFiniteSteps.save_point`), or None.
    """

    def __init__(
        self,
        checkpoints: RunCheckpoints,
        first_step: int,
        last_step: int,
        data_state: Callable[[int], dict[str, Any]],
        meta: dict[str, Any],
        warn: Callable[[str], None],
        goodput: Goodput | None = None,
        nonfinite: NonFiniteSteps | None = None,
    ):
        self.checkpoints, self.first_step, self.last_step = checkpoints, first_step, last_step
        self.data_state, self.meta, self.warn = data_state, meta, warn
        self.goodput, self.nonfinite = goodput or Goodput(), nonfinite
        self.saved: list[int] = []  # the steps this run checkpointed
        self.tried = first_step  # the last step a save was due at, written or refused

    def save(self, step: int, state: TrainState) -> None:
        jax.block_until_ready(state)  # the step's own time is not the save's
        self.tried = step
        bad = self.nonfinite.save_point() if self.nonfinite is not None else None
        if bad is not None:
            steps = self.checkpoints.steps()
            newest = f"the newest checkpoint stays step {steps[-1]}" if steps else "there is no checkpoint yet"
            self.warn(f"jzero: warning: step {step}: the loss was not finite at step {bad}; not checkpointed ({newest})")
            return
        with self.goodput.timed("checkpoint"):
            saved = self.checkpoints.save(step, state, self.data_state(step), self.meta)
        if saved:
            self.saved.append(step)
        else:
            self.warn(f"jzero: warning: step {step}: the state is not finite; not checkpointed")

    def step(self, step: int, state: TrainState) -> None:
        self.checkpoints.check()  # a failed background write surfaces here, in the loop's thread
        if self.checkpoints.due(step) or step == self.last_step:
            self.save(step, state)

    def end(self, step: int, state: TrainState, preempted: str | None) -> None:
        if preempted and step > self.tried:  # a save refused at this step is not tried again
            self.save(step, state)

    def close(self) -> None:
        with self.goodput.timed("checkpoint"):
            self.checkpoints.close()  # waits for the write in flight


class PreemptionHook(Hook):
    """Stops the loop at the step boundary after SIGTERM or SIGINT (agreed across processes)."""

    def __init__(self, preemption: Preemption):
        self.preemption = preemption

    def stop_requested(self) -> bool:
        return self.preemption.requested()


def close_hooks(hooks: Sequence[Hook], quietly: bool = False) -> None:
    """Close every hook; the first failure is raised after all are closed, unless ``quietly``."""
    first: Exception | None = None
    for hook in hooks:
        try:
            hook.close()
        except Exception as err:
            first = first or err
    if first is not None and not quietly:
        raise first


class ClosingHooks:
    """Closes the run's hooks on every exit, or the checkpoints while there are none yet; except on an
    abort by a second SIGINT, which leaves any write uncommitted rather than wait for it."""

    def __init__(self, checkpoints: RunCheckpoints):
        self.checkpoints = checkpoints
        self.hooks: list[Hook] | None = None  # set once the hooks own the checkpoints

    def __enter__(self) -> ClosingHooks:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: Any) -> None:
        if kind is None:
            close_hooks(self.hooks or [])
        elif not issubclass(kind, KeyboardInterrupt):
            # The error that stopped the run is the one to report; the checkpoints close either way.
            close_hooks(self.hooks or [], quietly=True)
            if self.hooks is None:
                with contextlib.suppress(Exception):
                    self.checkpoints.close()


@contextlib.contextmanager
def closed_on_error(hooks: list[Hook]) -> Iterator[None]:
    """Close ``hooks`` quietly when the block fails, except on an abort by a second SIGINT."""
    try:
        yield
    except KeyboardInterrupt:
        raise
    except BaseException:
        close_hooks(hooks, quietly=True)
        raise
