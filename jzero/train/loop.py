"""The training loop: a built run (:mod:`jzero.train.job`) stepped under ``run.dir``.

The loop restores or initialises the state, compiles the step, writes the start-up ledger, then
steps. Its outputs are hooks (:mod:`jzero.train.hooks`): the progress bar, ``metrics.jsonl``, TensorBoard,
the checkpoint cadence and preemption.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding

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
from jzero.train.data import TextBatches, text_batches
from jzero.train.hooks import CheckpointHook, Hook, JsonlHook, PreemptionHook, ProgressHook, TensorBoardHook, writing
from jzero.train.job import Job, build_job
from jzero.train.preemption import Preemption
from jzero.train.progress import TrainProgress
from jzero.train.report import startup_ledger

__all__ = ["MetricsLog", "TrainResult", "initial_state", "train"]


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
    s: Job, checkpoints: RunCheckpoints | None, data: TextBatches, note: Callable[[str], None]
) -> tuple[TrainState, int]:
    """The latest committed checkpoint (onto this run's mesh and stage), else ``train.init_from``,
    else a fresh init. Returns the state and the step it is at."""
    restored = checkpoints.restore_latest(s.abstract_state(), warn=note) if checkpoints is not None else None
    if restored is not None:
        start = data.check_state(restored.data)
        changed = changes(restored.meta, mesh_shape(s.mesh), s.plan.stage)
        note(f"resumed from {checkpoints.step_dir(restored.step)}" + (f" ({changed})" if changed else ""))
        return restored.state, start
    if s.config.train.init_from:
        loaded = load_params(s.config.train.init_from)
        match_params(loaded, {t.path: t.shape for t in s.plan.tensors}, s.config.train.init_from)
        arrays = [
            jax.device_put(np.asarray(loaded[t.path], np.float32), NamedSharding(s.mesh, t.param_spec)) for t in s.plan.tensors
        ]
        params = jax.tree.unflatten(jax.tree.structure(s.plan.params), arrays)
        note(f"parameters from {s.config.train.init_from}")
        return state_from_params(params, s.tx, s.plan, s.precision), 0
    return s.init_state(), 0


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
      job: a built job (:func:`jzero.train.job.build_job`), e.g. of your own model (default: built from
        ``config``, jzero's GPT).
      hooks: more :class:`~jzero.train.hooks.Hook` objects, called after jzero's own.

    Returns:
      A :class:`TrainResult`.

    Raises:
      ConfigError: the run is refused; nothing has been written then.
      TrainingHalted: ``train.nonfinite: halt`` met a non-finite gradient.
      CheckpointWriteError: a checkpoint write failed.
      OutputWriteError: another output (ledger, metrics, TensorBoard, config) could not be written.
    """
    s = job if job is not None else build_job(config)
    if data is None:
        m, t = config.model, config.train
        data = text_batches(config.data.path, config.data.max_bytes, m.seq_len, t.global_batch_size, config.seed)
    # Everything that can refuse the run does so here, before anything is written or drawn. With
    # several processes, process 0 writes the run's own files (each process writes its checkpoint
    # shards), once every process has looked at run.dir as it was.
    primary = is_primary()
    run_dir, existing = check_run_dir(config.run.dir, resume)
    run = RunDir(run_dir)
    has_checkpoints = run.checkpoints.is_dir()
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("jzero: run.dir checked")
    notes: list[str] = []
    checkpoints = RunCheckpoints(run_dir, config.checkpoint) if has_checkpoints else None
    try:
        state, start = initial_state(s, checkpoints, data, notes.append)
    except BaseException:
        for line in notes if primary else ():  # checkpoints set aside on the way
            print(line, file=sys.stderr)
        if checkpoints is not None:
            checkpoints.close()
        raise
    create_run_dir(run_dir)
    checkpoints = checkpoints or RunCheckpoints(run_dir, config.checkpoint)
    if not existing and primary:
        with writing(run.config):
            run.config.write_text(dump_config(config))
    dropped = 0
    if primary:
        with writing(run.metrics):
            dropped = run.trim_metrics(start)
    if dropped:
        notes.append(f"dropped {dropped} metrics.jsonl records past step {start}, which this run logs again")
    meta = run_meta(config.to_dict(), mesh_shape(s.mesh), s.plan.stage, s.plan.num_params, s.rng)
    steps = config.train.steps

    all_hooks: list[Hook] = []
    try:
        with TrainProgress(steps, enabled=progress, silent=not primary) as bar, Preemption() as preemption:
            for line in notes:
                bar.announce(line)
            result = TrainResult([], start, start, [])
            if start >= steps:
                bar.announce(f"step {start} already reached train.steps={steps}; nothing to do")
                checkpoints.close()
                return result
            if primary and existing and start > 0 and run.config.read_text() != dump_config(config):
                with writing(run.resumed_config(start)):  # the resumed run's own config
                    run.resumed_config(start).write_text(dump_config(config))
            t0 = time.perf_counter()
            compiled = s.compile(s.make_step().lower(state, data.device_batch(start, s.plan.batch)))
            bar.note(
                f"mesh {mesh_shape(s.mesh)}  stage {s.plan.stage}  params {s.plan.num_params:,}  "
                f"compile {time.perf_counter() - t0:.1f}s  from step {start}"
            )
            report = startup_ledger(s, compiled, state)
            ledger = run.ledger(start)
            if primary:
                with writing(ledger):
                    ledger.write_text(json.dumps(report, indent=1))
            bar.note(format_ledger_summary(report) + f"\n  written to {ledger}")
            bar.advance(start)

            saver = CheckpointHook(checkpoints, start, steps, data.state, meta, bar.announce)
            all_hooks = [saver, ProgressHook(bar)]
            if primary:
                all_hooks.append(JsonlHook(run.metrics))
                if config.run.tensorboard:
                    all_hooks.append(TensorBoardHook(run.tensorboard))
            all_hooks += [PreemptionHook(preemption), *hooks]
            tokens = config.train.global_batch_size * config.model.seq_len
            schedule = build_schedule(config.optimizer, steps)
            log = MetricsLog(tokens, start, int(state.skipped), config.train.nonfinite == "halt", schedule)
            for step, batch in data.iterate(s.plan.batch, start):
                # Every hook is asked (no short cut): with several processes a request is a collective.
                if step >= steps or any([h.stop_requested() for h in all_hooks]):
                    break
                state, metrics = compiled(state, batch)
                log.add(metrics)
                done = result.final_step = step + 1
                for hook in all_hooks:
                    hook.step(done, state)
                if done % config.run.log_every == 0 or done == steps:
                    _log(all_hooks, log.record(done))
            if log.pending:  # stopped early: the steps since the last record get one too
                _log(all_hooks, log.record(result.final_step))
            result.history = log.history
            result.preempted = preemption.agreed
            for hook in all_hooks:
                hook.end(result.final_step, state, result.preempted)
    except KeyboardInterrupt:  # a second SIGINT: abort now, leave any write uncommitted
        raise
    except BaseException:
        # The error that stopped the run is the one to report; the checkpoints close either way.
        _close(all_hooks, quietly=True)
        if not all_hooks:
            with contextlib.suppress(Exception):
                checkpoints.close()
        raise
    _close(all_hooks)
    result.saved = saver.saved
    return result


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
