"""The training loop: a built job (:mod:`jzero.training.job`) stepped under ``run.dir``.

:func:`train` prepares the run folder (:func:`prepare_run`: restore or initialise the state, write
``config.yaml``), compiles the step and writes the start-up ledger (:func:`startup_outputs`), then
steps (:func:`run_steps`). Its outputs are hooks (:mod:`jzero.training.hooks`), jzero's own from
:func:`default_hooks`: the checkpoint cadence, the progress bar, ``metrics.jsonl``, TensorBoard and
preemption.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, Sharding

from jzero.checkpoint.export import load_params, match_params
from jzero.checkpoint.runs import RunCheckpoints, changes, run_meta
from jzero.config.loading import dump_config
from jzero.config.rundir import RunDir
from jzero.config.schema import Config
from jzero.distributed.runtime import is_primary
from jzero.errors import ConfigError, TrainingHalted
from jzero.ledger.render import format_ledger_summary
from jzero.mesh import mesh_shape
from jzero.optimizers import build_schedule
from jzero.state import TrainState
from jzero.step import state_from_params
from jzero.training.data import TextBatches, text_batches
from jzero.training.hooks import CheckpointHook, Hook, JsonlHook, PreemptionHook, ProgressHook, TensorBoardHook, writing
from jzero.training.job import Job, build_job
from jzero.training.preemption import Preemption
from jzero.training.progress import TrainProgress
from jzero.training.report import startup_ledger

__all__ = ["MetricsLog", "TrainResult", "default_hooks", "initial_state", "train"]


def check_run_dir(path: str, resume: bool) -> tuple[Path, bool]:
    """``run.dir`` and whether it already holds a run, writing nothing. Without ``resume`` a folder
    that holds a run is refused, so nothing is overwritten; a path that cannot be a folder is refused."""
    run_dir = Path(path)
    for folder in (run_dir, *run_dir.parents):  # the nearest existing ancestor must be a folder
        if folder.exists():
            if not folder.is_dir():
                raise ConfigError("run.dir", f"{folder} is a file, not a folder")
            break
    existing = RunDir(run_dir).holds()
    if existing and not resume:
        raise ConfigError("--no-resume", f"{run_dir} already holds a run ({', '.join(existing)}); choose another run.dir")
    return run_dir, bool(existing)


def create_run_dir(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError("run.dir", f"cannot create {run_dir}: {err.strerror or err}") from None


@dataclasses.dataclass
class TrainResult:
    """What :func:`train` did: its logged records, where it started and stopped, what it saved."""

    history: list[dict[str, Any]]
    start_step: int  # 0, or the checkpoint step it resumed from
    final_step: int
    saved: list[int]  # checkpoint steps written by this run
    preempted: str | None = None  # the signal that stopped it early


def initial_state(
    job: Job, checkpoints: RunCheckpoints | None, data: TextBatches, note: Callable[[str], None]
) -> tuple[TrainState, int]:
    """The latest committed checkpoint (onto this run's mesh and stage), else ``train.init_from``,
    else a fresh init. Returns the state and the step it is at."""
    restored = checkpoints.restore_latest(job.abstract_state(), warn=note) if checkpoints is not None else None
    if restored is not None:
        start = data.check_state(restored.data)
        changed = changes(restored.meta, mesh_shape(job.mesh), job.plan.stage)
        note(f"resumed from {checkpoints.step_dir(restored.step)}" + (f" ({changed})" if changed else ""))
        return restored.state, start
    if job.config.train.init_from:
        loaded = load_params(job.config.train.init_from)
        match_params(loaded, {t.path: t.shape for t in job.plan.tensors}, job.config.train.init_from)
        arrays = [
            jax.device_put(np.asarray(loaded[t.path], np.float32), NamedSharding(job.mesh, t.param_spec))
            for t in job.plan.tensors
        ]
        params = jax.tree.unflatten(jax.tree.structure(job.plan.params), arrays)
        note(f"parameters from {job.config.train.init_from}")
        return state_from_params(params, job.tx, job.plan, job.precision), 0
    return job.init_state(), 0


class MetricsLog:
    """Collects each step's metrics on device and, at logged steps, makes one host-side record of
    them (one host sync per logged step). In ``halt`` mode it raises at the first step whose
    gradient was not finite.

    Args:
      tokens_per_step: tokens in one global batch, for ``tokens_per_sec``.
      start: the step the run starts from.
      skipped: steps skipped before ``start``.
      halt: raise :class:`TrainingHalted` at a non-finite step.
      schedule: the learning-rate schedule, for ``learning_rate``.
    """

    def __init__(self, tokens_per_step: int, start: int, skipped: int, halt: bool, schedule: optax.Schedule):
        self.tokens_per_step, self.halt, self.schedule = tokens_per_step, halt, schedule
        self.pending: list[dict[str, jax.Array]] = []
        self.skipped = skipped
        self.mark, self.mark_step = time.perf_counter(), start
        self.history: list[dict[str, Any]] = []

    def add(self, metrics: dict[str, jax.Array]) -> None:
        self.pending.append(metrics)

    def record(self, step: int) -> dict[str, Any]:
        """The record of the steps since the last one, ending at ``step``."""
        interval, self.pending = jax.device_get(self.pending), []
        if self.halt:
            for offset, m in enumerate(interval):
                if int(m["skipped"]) > self.skipped:
                    raise TrainingHalted(self.mark_step + offset + 1)
        last = interval[-1]
        self.skipped = int(last["skipped"])
        now = time.perf_counter()
        record = {
            "step": step,
            "loss": float(last["loss"]),
            "grad_norm": float(last["grad_norm"]),
            # optax counts applied updates: the rate of the last update applied
            "learning_rate": float(self.schedule(max(step - self.skipped - 1, 0))),
            "tokens_per_sec": self.tokens_per_step * (step - self.mark_step) / (now - self.mark),
            "skipped_steps": self.skipped,
        }
        if "loss_scale" in last:
            record["loss_scale"] = float(last["loss_scale"])
        self.mark, self.mark_step = now, step
        self.history.append(record)
        return record


@dataclasses.dataclass
class PreparedRun:
    """A run folder ready for the loop (:func:`prepare_run`): the state to start from and what was
    found and written there.

    Attributes:
      folder: the run folder.
      existing: it already held a run.
      primary: this process writes the run's own files and prints.
      checkpoints: the run's checkpoints, open.
      state: the state to start from.
      start: its step.
      notes: lines to announce before the run starts.
      meta: what each checkpoint records about the run.
    """

    folder: RunDir
    existing: bool
    primary: bool
    checkpoints: RunCheckpoints
    state: TrainState
    start: int
    notes: list[str]
    meta: dict[str, Any]


def prepare_run(config: Config, job: Job, data: TextBatches, resume: bool) -> PreparedRun:
    """Check ``run.dir``, restore or initialise the state, then create the folder, write
    ``config.yaml`` (a new run) and trim ``metrics.jsonl`` to the step it starts from.

    Everything that can refuse the run does so before anything is written. With several
    processes, process 0 writes the run's own files (each process writes its checkpoint shards),
    once every process has looked at ``run.dir`` as it was.

    Args:
      config: the run's config.
      job: the built job (:func:`jzero.training.job.build_job`).
      data: the batches, whose state a checkpoint restores.
      resume: False refuses a ``run.dir`` that already holds a run.

    Returns:
      The :class:`PreparedRun`.

    Raises:
      ConfigError: the run is refused; nothing has been written then.
      OutputWriteError: ``config.yaml`` or ``metrics.jsonl`` could not be written.
    """
    primary = is_primary()
    run_dir, existing = check_run_dir(config.run.dir, resume)
    folder = RunDir(run_dir)
    has_checkpoints = folder.checkpoints.is_dir()
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("jzero: run.dir checked")
    notes: list[str] = []
    checkpoints = RunCheckpoints(run_dir, config.checkpoint) if has_checkpoints else None
    try:
        state, start = initial_state(job, checkpoints, data, notes.append)
    except BaseException:
        for line in notes if primary else ():  # checkpoints set aside on the way
            print(line, file=sys.stderr)
        if checkpoints is not None:
            checkpoints.close()
        raise
    create_run_dir(run_dir)
    checkpoints = checkpoints or RunCheckpoints(run_dir, config.checkpoint)
    if not existing and primary:
        with writing(folder.config):
            folder.config.write_text(dump_config(config))
    dropped = 0
    if primary:
        with writing(folder.metrics):
            dropped = folder.trim_metrics(start)
    if dropped:
        notes.append(f"dropped {dropped} metrics.jsonl records past step {start}, which this run logs again")
    meta = run_meta(config.to_dict(), mesh_shape(job.mesh), job.plan.stage, job.plan.num_params, job.rng)
    return PreparedRun(folder, existing, primary, checkpoints, state, start, notes, meta)


def startup_outputs(config: Config, job: Job, run: PreparedRun, data: TextBatches, bar: TrainProgress) -> Any:
    """Compile the step and write what the run reports at start-up: a resumed run's changed config
    (``config.step-N.yaml``), the compile line, and the start-up ledger (``ledger.json``, or
    ``ledger.step-N.json`` when resumed) with its summary; then the bar stands at the start step.

    Args:
      config: the run's config.
      job: the built job.
      run: the prepared run (:func:`prepare_run`).
      data: the batches; the first one is what the step is compiled for.
      bar: the progress bar the notes go to.

    Returns:
      The compiled step.

    Raises:
      OutputWriteError: the config or the ledger could not be written.
    """
    start, folder = run.start, run.folder
    if run.primary and run.existing and start > 0 and folder.config.read_text() != dump_config(config):
        with writing(folder.resumed_config(start)):  # the resumed run's own config
            folder.resumed_config(start).write_text(dump_config(config))
    t0 = time.perf_counter()
    compiled = job.compile(job.make_step().lower(run.state, data.device_batch(start, job.plan.batch)))
    bar.note(
        f"mesh {mesh_shape(job.mesh)}  stage {job.plan.stage}  params {job.plan.num_params:,}  "
        f"compile {time.perf_counter() - t0:.1f}s  from step {start}"
    )
    report = startup_ledger(job, compiled, run.state)
    ledger = folder.ledger(start)
    if run.primary:
        with writing(ledger):
            ledger.write_text(json.dumps(report, indent=1))
    bar.note(format_ledger_summary(report) + f"\n  written to {ledger}")
    bar.advance(start)
    return compiled


def default_hooks(
    config: Config,
    checkpoints: RunCheckpoints,
    bar: TrainProgress,
    preemption: Preemption,
    *,
    start: int,
    data_state: Callable[[int], dict[str, Any]],
    meta: dict[str, Any],
) -> list[Hook]:
    """jzero's own hooks, in the order the loop calls them (Levanter's ``Trainer._add_default_hooks``):
    the checkpoint cadence, the progress bar, then on process 0 ``metrics.jsonl`` and, with
    ``run.tensorboard``, TensorBoard, then preemption. :func:`train` appends the caller's hooks.

    Args:
      config: the run's config (``run.dir``, ``run.tensorboard``, ``train.steps``).
      checkpoints: the run's checkpoints; the :class:`CheckpointHook`, first, closes them.
      bar: the progress bar.
      preemption: the run's SIGTERM/SIGINT handler.
      start: the step the run starts from.
      data_state: ``data_state(step)``, the data iterator's state before ``step``.
      meta: what each checkpoint records about the run.

    Returns:
      The hooks. If one cannot be made, those made already are closed and the error raised.

    Raises:
      OutputWriteError: ``metrics.jsonl`` or the TensorBoard folder could not be opened.
    """
    folder = RunDir(Path(config.run.dir))
    hooks: list[Hook] = []
    with _closed_on_error(hooks):
        hooks += [CheckpointHook(checkpoints, start, config.train.steps, data_state, meta, bar.announce), ProgressHook(bar)]
        if is_primary():
            hooks.append(JsonlHook(folder.metrics))
            if config.run.tensorboard:
                hooks.append(TensorBoardHook(folder.tensorboard))
        hooks.append(PreemptionHook(preemption))
    return hooks


def run_steps(
    config: Config, compiled: Any, state: TrainState, data: TextBatches, sharding: Sharding, start: int, hooks: Sequence[Hook]
) -> tuple[TrainState, int, list[dict[str, Any]]]:
    """Step from ``start`` until ``train.steps`` or a hook asks to stop, calling the hooks.

    Args:
      config: the run's config (``train``, ``model.seq_len``, ``optimizer``, ``run.log_every``).
      compiled: the compiled step (:func:`startup_outputs`).
      state: the state at ``start``.
      data: the batches.
      sharding: the batch's sharding (the plan's).
      start: the step to start from.
      hooks: every hook of the run.

    Returns:
      The last state, the steps done by then, and the logged records.

    Raises:
      TrainingHalted: ``train.nonfinite: halt`` met a non-finite gradient.
    """
    steps = config.train.steps
    tokens = config.train.global_batch_size * config.model.seq_len
    schedule = build_schedule(config.optimizer, steps)
    log = MetricsLog(tokens, start, int(state.skipped), config.train.nonfinite == "halt", schedule)
    done = start
    for step, batch in data.iterate(sharding, start):
        # Every hook is asked (no short cut): with several processes a request is a collective.
        if step >= steps or any([h.stop_requested() for h in hooks]):
            break
        state, metrics = compiled(state, batch)
        log.add(metrics)
        done = step + 1
        for hook in hooks:
            hook.step(done, state)
        if done % config.run.log_every == 0 or done == steps:
            _log(hooks, log.record(done))
    if log.pending:  # stopped early: the steps since the last record get one too
        _log(hooks, log.record(done))
    return state, done, log.history


def train(
    config: Config,
    *,
    progress: bool = True,
    data: TextBatches | None = None,
    resume: bool = True,
    job: Job | None = None,
    hooks: Sequence[Hook] = (),
) -> TrainResult:
    """Train per ``config`` under ``run.dir``.

    Writes ``config.yaml``, ``metrics.jsonl``, ``ledger.json``, Orbax checkpoints in
    ``checkpoints/`` and, with ``run.tensorboard``, TensorBoard scalars in ``tensorboard/``.
    Resumes from the latest committed checkpoint. SIGTERM or SIGINT saves at the next step
    boundary and stops.

    Args:
      config: the run's config.
      progress: draw the progress bar.
      data: the batches (default: ``data:`` of the config).
      resume: False refuses a ``run.dir`` that already holds a run.
      job: a built job (:func:`jzero.training.job.build_job`), e.g. of your own model (default: built from
        ``config``, jzero's GPT).
      hooks: more :class:`~jzero.training.hooks.Hook` objects, called after jzero's own.

    Returns:
      A :class:`TrainResult`.

    Raises:
      ConfigError: the run is refused; nothing has been written then.
      TrainingHalted: ``train.nonfinite: halt`` met a non-finite gradient.
      CheckpointWriteError: a checkpoint write failed.
      OutputWriteError: another output (ledger, metrics, TensorBoard, config) could not be written.
    """
    job = job if job is not None else build_job(config)
    if data is None:
        m, t = config.model, config.train
        data = text_batches(config.data.path, config.data.max_bytes, m.seq_len, t.global_batch_size, config.seed)
    run = prepare_run(config, job, data, resume)  # refuses the run, if anything does, before writing
    start, steps = run.start, config.train.steps
    with (
        _Closing(run.checkpoints) as closing,
        TrainProgress(steps, enabled=progress, silent=not run.primary) as bar,
        Preemption() as preemption,
    ):
        for line in run.notes:
            bar.announce(line)
        if start >= steps:
            bar.announce(f"step {start} already reached train.steps={steps}; nothing to do")
            run.checkpoints.close()
            return TrainResult([], start, start, [])
        compiled = startup_outputs(config, job, run, data, bar)
        closing.hooks = []  # from here the CheckpointHook closes the checkpoints (default_hooks does if it fails)
        own = default_hooks(config, run.checkpoints, bar, preemption, start=start, data_state=data.state, meta=run.meta)
        closing.hooks += [*own, *hooks]
        state, final, history = run_steps(config, compiled, run.state, data, job.plan.batch, start, closing.hooks)
        preempted = preemption.agreed
        for hook in closing.hooks:
            hook.end(final, state, preempted)
    return TrainResult(history, start, final, own[0].saved, preempted)  # own[0]: the CheckpointHook


def _log(hooks: Sequence[Hook], record: dict[str, Any]) -> None:
    for hook in hooks:
        hook.log(record)


def _close(hooks: Sequence[Hook], quietly: bool = False) -> None:
    """Close every hook; the first failure is raised after all are closed, unless ``quietly``."""
    first: Exception | None = None
    for hook in hooks:
        try:
            hook.close()
        except Exception as err:
            first = first or err
    if first is not None and not quietly:
        raise first


class _Closing:
    """Closes the run's hooks on every exit, or the checkpoints while there are none yet; except on an
    abort by a second SIGINT, which leaves any write uncommitted rather than wait for it."""

    def __init__(self, checkpoints: RunCheckpoints):
        self.checkpoints = checkpoints
        self.hooks: list[Hook] | None = None  # set once the hooks own the checkpoints

    def __enter__(self) -> _Closing:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: Any) -> None:
        if kind is None:
            _close(self.hooks or [])
        elif not issubclass(kind, KeyboardInterrupt):
            # The error that stopped the run is the one to report; the checkpoints close either way.
            _close(self.hooks or [], quietly=True)
            if self.hooks is None:
                with contextlib.suppress(Exception):
                    self.checkpoints.close()


@contextlib.contextmanager
def _closed_on_error(hooks: list[Hook]) -> Iterator[None]:
    """Close ``hooks`` quietly when the block fails, except on an abort by a second SIGINT."""
    try:
        yield
    except KeyboardInterrupt:
        raise
    except BaseException:
        _close(hooks, quietly=True)
        raise
