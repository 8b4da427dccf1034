"""The training loop: a built job (:mod:`jzero.training.job`) stepped under ``run.dir``.

:func:`train` prepares the run folder (:func:`prepare_run`: restore or initialise the state, write
``config.yaml``), compiles the step and writes the start-up ledger (:func:`startup_outputs`), then
steps (:func:`run_steps`). Its outputs are hooks (:mod:`jzero.training.hooks`), jzero's own from
:func:`default_hooks`: the checkpoint cadence, the progress bar, ``metrics.jsonl``, TensorBoard and
preemption.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import jax
from jax.experimental import multihost_utils
from jax.sharding import Sharding

from jzero.checkpoint.meta import run_meta
from jzero.checkpoint.runs import RunCheckpoints
from jzero.compiler.cache import cache_hits
from jzero.config.loading import dump_config, read_text_file
from jzero.config.run_folder import RunDir, check_run_dir, create_run_dir
from jzero.config.schema import Config, ProfileConfig
from jzero.distributed.runtime import is_primary, lock_run_dir
from jzero.lazy import moved_names
from jzero.ledger.render import format_ledger_summary
from jzero.ledger.startup import GoodputReport, StartupLedger
from jzero.optimizers import build_schedule
from jzero.records import to_json
from jzero.sharding.axes import mesh_text
from jzero.sharding.mesh import mesh_shape
from jzero.sharding.state import TrainState
from jzero.training import metrics as logged
from jzero.training.data import EvalBatches, TextBatches, run_tokenizer_path, train_data
from jzero.training.data import eval_data as load_eval_data
from jzero.training.evaluation import Evaluator
from jzero.training.goodput import Goodput
from jzero.training.hooks import (
    CheckpointHook,
    ClosingHooks,
    Hook,
    JsonlHook,
    PreemptionHook,
    ProgressHook,
    TensorBoardHook,
    closed_on_error,
    writing,
)
from jzero.training.initial_state import init_tokenizer, initial_state
from jzero.training.job import Job, build_job
from jzero.training.nonfinite import NonFiniteSteps, skip_limit
from jzero.training.preemption import Preemption
from jzero.training.profile import ProfileWindow
from jzero.training.progress import TrainProgress
from jzero.training.report import startup_ledger

__all__ = ["Extras", "TrainResult", "default_hooks", "train"]
__getattr__ = moved_names(__name__, {name: f"jzero.training.metrics.{name}" for name in ("MetricsLog", "Throughput")})


@dataclasses.dataclass
class TrainResult:
    """What :func:`train` did: its logged records, where it started and stopped, what it saved."""

    history: list[dict[str, Any]]
    start_step: int  # 0, or the checkpoint step it resumed from
    final_step: int
    saved: list[int]  # checkpoint steps written by this run
    preempted: str | None = None  # the signal that stopped it early
    goodput: GoodputReport | None = None  # where the wall time went (jzero.training.goodput)


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
      ledger: the start-up ledger's file, once written (:func:`startup_outputs`).
      startup: the start-up ledger written there, which the goodput report joins at the end.
    """

    folder: RunDir
    existing: bool
    primary: bool
    checkpoints: RunCheckpoints
    state: TrainState
    start: int
    notes: list[str]
    meta: dict[str, Any]
    ledger: Path | None = None
    config_changed: bool = False
    startup: StartupLedger | None = None


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
    written = _written_config(folder) if existing else None
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
    if written is None and primary:  # a new run's, or one an existing run lost
        with writing(folder.config):
            folder.config.write_text(dump_config(config))
    if not existing and primary:
        tokenizer = run_tokenizer_path(config) or init_tokenizer(config)
        if tokenizer is not None:  # the run's own copy: jzero sample decodes with it
            with writing(folder.tokenizer):
                shutil.copyfile(tokenizer, folder.tokenizer)
    dropped = 0
    if primary:
        with writing(folder.metrics):
            dropped = folder.trim_metrics(start)
    if dropped:
        notes.append(f"dropped {dropped} metrics.jsonl records past step {start}, which this run logs again")
    meta = run_meta(config.to_dict(), mesh_shape(job.mesh), job.plan.zero.stage, job.plan.num_params, job.rng)
    changed = start > 0 and written is not None and written != dump_config(config)
    return PreparedRun(folder, existing, primary, checkpoints, state, start, notes, meta, config_changed=changed)


def _written_config(folder: RunDir) -> str | None:
    """The text of the run's ``config.yaml``, or None where there is none.

    Raises:
      ConfigError: it is there but cannot be read (a folder, not UTF-8, unreadable), naming it.
    """
    if not folder.config.exists() and not folder.config.is_symlink():
        return None
    return read_text_file(folder.config, "run.dir")


def startup_outputs(
    config: Config, job: Job, run: PreparedRun, data: TextBatches, bar: TrainProgress, goodput: Goodput | None = None
) -> Any:
    """Compile the step and write what the run reports at start-up: a resumed run's changed config
    (``config.step-N.yaml``), the compile line, and the start-up ledger (``ledger.json``, or
    ``ledger.step-N.json`` when resumed) with its summary; then the bar stands at the start step.

    Args:
      config: the run's config.
      job: the built job.
      run: the prepared run (:func:`prepare_run`).
      data: the batches; the first one is what the step is compiled for.
      bar: the progress bar the notes go to.
      goodput: where the compile's time is charged.

    Returns:
      The compiled step; ``run.ledger`` is set to the ledger's file.

    Raises:
      OutputWriteError: the config or the ledger could not be written.
    """
    start, folder = run.start, run.folder
    if run.primary and run.config_changed:
        with writing(folder.resumed_config(start)):  # the resumed run's own config
            folder.resumed_config(start).write_text(dump_config(config))
    t0, hits = time.perf_counter(), cache_hits()
    bar.note(f"compiling the train step: stage {job.plan.zero.stage} on {mesh_text(mesh_shape(job.mesh))}, "
             f"{job.plan.num_params:,} parameters, from step {start}")  # fmt: skip
    compiled = job.compile(job.make_step().lower(run.state, data.device_batch(start, job.plan.batch)))
    if goodput is not None:
        goodput.charge("compile", time.perf_counter() - t0)
    cached = f", read from JAX's compilation cache in {jax.config.jax_compilation_cache_dir}" if cache_hits() > hits else ""
    bar.note(f"compiled in {time.perf_counter() - t0:.1f} s{cached}")
    report = run.startup = startup_ledger(job, compiled, run.state)
    ledger = run.ledger = folder.ledger(start)
    if run.primary:
        with writing(ledger):
            ledger.write_text(json.dumps(to_json(report), indent=1))
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
    goodput: Goodput | None = None,
    nonfinite: NonFiniteSteps | None = None,
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
      goodput: where the checkpoint hook charges its saves.
      nonfinite: the run's non-finite steps, which refuse a save of a state whose loss was not finite.

    Returns:
      The hooks. If one cannot be made, those made already are closed and the error raised.

    Raises:
      OutputWriteError: ``metrics.jsonl`` or the TensorBoard folder could not be opened.
    """
    folder = RunDir(Path(config.run.dir))
    hooks: list[Hook] = []
    with closed_on_error(hooks):
        saves = CheckpointHook(checkpoints, start, config.train.steps, data_state, meta, bar.announce, goodput, nonfinite)
        hooks += [saves, ProgressHook(bar)]
        if is_primary():
            hooks.append(JsonlHook(folder.metrics))
            if config.run.tensorboard:
                hooks.append(TensorBoardHook(folder.tensorboard))
        hooks.append(PreemptionHook(preemption))
    return hooks


@dataclasses.dataclass
class Extras:
    """What the loop measures and does besides stepping and calling hooks.

    Attributes:
      throughput: what gives ``tokens_per_sec``, ``model_flops_per_sec`` and ``mfu``.
      evaluator: the validation loss at its steps (``train.eval_every``), or None.
      goodput: where data waits and eval time are charged.
      profile: ``run.profile``, the steps to trace into ``<run.dir>/profile``, or None.
      nonfinite: the run's non-finite steps, read at logged steps (past ``train.max_skipped_in_a_row``
        in a row the run stops), or None.
    """

    throughput: logged.Throughput
    evaluator: Evaluator | None = None
    goodput: Goodput = dataclasses.field(default_factory=Goodput)
    profile: ProfileConfig | None = None
    nonfinite: NonFiniteSteps | None = None


def run_steps(
    config: Config,
    compiled: Any,
    state: TrainState,
    data: TextBatches,
    sharding: Sharding,
    start: int,
    hooks: Sequence[Hook],
    extras: Extras,
) -> tuple[TrainState, int, list[dict[str, Any]]]:
    """Step from ``start`` until ``train.steps`` or a hook asks to stop, calling the hooks.

    Args:
      config: the run's config (``train``, ``optimizer``, ``run.log_every``).
      compiled: the compiled step (:func:`startup_outputs`).
      state: the state at ``start``.
      data: the batches.
      sharding: the batch's sharding (the plan's).
      start: the step to start from.
      hooks: every hook of the run.
      extras: throughput, eval, goodput and the profile window.

    Returns:
      The last state, the steps done by then, and the logged records.

    Raises:
      TrainingHalted: ``train.nonfinite: halt`` met a non-finite gradient.
      TooManySkipped: more than ``train.max_skipped_in_a_row`` steps in a row were skipped.
      EndedNonFinite: the last step was non-finite (:meth:`NonFiniteSteps.finish`).
    """
    steps, goodput = config.train.steps, extras.goodput
    schedule = build_schedule(config.optimizer, steps)
    log = logged.MetricsLog(extras.throughput, start, int(state.skipped), config.train.nonfinite == "halt", schedule, goodput)
    folder = RunDir(Path(config.run.dir)).profile
    if jax.process_count() > 1:  # the trace files are named by host: processes of one machine would share them
        folder = folder / f"process_{jax.process_index()}"
    profile = ProfileWindow(extras.profile, folder, partial(goodput.charge, "profile"))
    done, batches, metrics = start, data.iterate(sharding, start), None
    try:
        # Every hook is asked (no short cut): with several processes a request is a collective.
        while done < steps and not any([h.stop_requested() for h in hooks]):
            t0 = time.perf_counter()
            _, batch = next(batches)
            if metrics is None or metrics["loss"].is_ready():  # the device had nothing left to do: a wait
                goodput.charge("data", time.perf_counter() - t0)
            with profile.step(done + 1) as outputs:
                state, metrics = compiled(state, batch)
                outputs.append(metrics)
            log.add(metrics)
            done += 1
            if extras.nonfinite is not None:
                extras.nonfinite.add(done, metrics)
            for hook in hooks:
                hook.step(done, state)
            record = _evaluated(extras.evaluator, done, state, goodput)
            if record or done % config.run.log_every == 0 or done == steps:
                _logged(hooks, log.record(done, record), extras.nonfinite)
        if log.pending:  # stopped early: the steps since the last record get one too
            _logged(hooks, log.record(done), extras.nonfinite)
        if extras.nonfinite is not None:
            extras.nonfinite.finish()
    finally:
        profile.close(metrics)
    return state, done, log.history


def _evaluated(evaluator: Evaluator | None, step: int, state: TrainState, goodput: Goodput) -> dict[str, float]:
    """The eval figures at ``step`` if an eval is due, else none."""
    if evaluator is None or not evaluator.due(step):
        return {}
    jax.block_until_ready(state.params)  # the step's own time is not the eval's
    with goodput.timed("eval"):
        return evaluator.evaluate(state.params)


def train(
    config: Config,
    *,
    progress: bool = True,
    data: TextBatches | None = None,
    eval_data: EvalBatches | None = None,
    resume: bool = True,
    job: Job | None = None,
    hooks: Sequence[Hook] = (),
) -> TrainResult:
    """Train per ``config`` under ``run.dir``: ``config.yaml``, ``metrics.jsonl``, ``ledger.json``
    (with the goodput added at the end), checkpoints, TensorBoard scalars and a profile
    (:class:`~jzero.config.run_folder.RunDir`). Resumes from the latest committed checkpoint. SIGTERM or
    SIGINT saves at the next step boundary and stops. Holds ``run.dir``'s lock (one writer per run
    folder) from before anything there is read until the last save is committed.

    Args:
      config: the run's config.
      progress: draw the progress bar.
      data: the batches (default: ``data:`` of the config, :func:`jzero.training.data.train_data`).
      eval_data: the eval batches when ``train.eval_every`` is set (default: the config's
        validation split, :func:`jzero.training.data.eval_data`).
      resume: False refuses a ``run.dir`` that already holds a run.
      job: a built job (:func:`jzero.training.job.build_job`), e.g. of your own model (default: built from
        ``config``, jzero's GPT).
      hooks: more :class:`~jzero.training.hooks.Hook` objects, called after jzero's own.

    Returns:
      A :class:`TrainResult`.

    Raises:
      ConfigError: the run is refused; nothing has been written then. Another trainer holding
        ``run.dir``'s lock is refused too (:class:`~jzero.config.run_folder.RunLock`; in this process or another).
      TrainingHalted: ``train.nonfinite: halt`` met a non-finite gradient.
      TooManySkipped: more than ``train.max_skipped_in_a_row`` steps in a row had a non-finite
        gradient; no step whose loss was not finite is saved.
      EndedNonFinite: the last step was non-finite (its loss, or its gradient without a loss scale);
        it is not saved.
      CheckpointWriteError: a checkpoint write failed.
      OutputWriteError: another output (ledger, metrics, TensorBoard, config) could not be written.
    """
    goodput = Goodput()
    with goodput.timed("startup"):  # everything that can refuse the run does so before anything is written
        job = job if job is not None else build_job(config)
        job.check_xla_options()
        data = train_data(config) if data is None else data
        eval_data = load_eval_data(config) if eval_data is None else eval_data
        lock = lock_run_dir(config.run.dir)  # held until the last save is committed, on every exit path
    with lock:
        with goodput.timed("startup"):
            run = prepare_run(config, job, data, resume)
        return _train_prepared(config, job, run, data, eval_data, progress=progress, hooks=hooks, goodput=goodput)


def _train_prepared(
    config: Config,
    job: Job,
    run: PreparedRun,
    data: TextBatches,
    eval_data: EvalBatches | None,
    *,
    progress: bool,
    hooks: Sequence[Hook],
    goodput: Goodput,
) -> TrainResult:
    """:func:`train` once the run folder is locked and prepared."""
    start, steps = run.start, config.train.steps
    with (
        ClosingHooks(run.checkpoints) as closing,
        TrainProgress(steps, enabled=progress, silent=not run.primary) as bar,
        Preemption() as preemption,
    ):
        for line in run.notes:
            bar.announce(line)
        if start >= steps:
            return _nothing_to_do(run, bar, steps)
        with goodput.timed("startup"):
            compiled = startup_outputs(config, job, run, data, bar, goodput)
            extras = _extras(config, job, run, eval_data, goodput)
        closing.hooks = []  # from here the CheckpointHook closes the checkpoints (default_hooks does if it fails)
        kw = {"start": start, "data_state": data.state, "meta": run.meta, "goodput": goodput, "nonfinite": extras.nonfinite}
        closing.hooks += [*(own := default_hooks(config, run.checkpoints, bar, preemption, **kw)), *hooks]
        state, final, history = run_steps(config, compiled, run.state, data, job.plan.batch, start, closing.hooks, extras)
        for hook in closing.hooks:
            hook.end(final, state, preemption.agreed)
    report = _goodput_out(goodput, run)
    return TrainResult(history, start, final, own[0].saved, preemption.agreed, report)  # own[0]: the CheckpointHook


def _nothing_to_do(run: PreparedRun, bar: TrainProgress, steps: int) -> TrainResult:
    bar.announce(f"step {run.start} already reached train.steps={steps}; nothing to do")
    run.checkpoints.close()
    return TrainResult([], run.start, run.start, [])


def _extras(config: Config, job: Job, run: PreparedRun, eval_data: EvalBatches | None, goodput: Goodput) -> Extras:
    """The eval step, compiled (its time charged to compile), the profile window, goodput and the
    watch on non-finite steps."""
    evaluator = None
    if config.train.eval_every and eval_data is not None:
        evaluator = Evaluator(job, eval_data, config.train.eval_every, config.train.steps)
        with goodput.timed("compile"):
            evaluator.compile(run.state.params)
    scales_loss = job.precision.scales_loss
    limit = skip_limit(config.train.max_skipped_in_a_row, scales_loss)
    nonfinite = NonFiniteSteps(limit, int(run.state.skipped), scales_loss)
    return Extras(logged.Throughput.of(job), evaluator, goodput, config.run.profile, nonfinite)


def _goodput_out(goodput: Goodput, run: PreparedRun) -> GoodputReport:
    """The goodput report, added to the start-up ledger by process 0."""
    report = goodput.report()
    if run.primary and run.ledger is not None and run.startup is not None:
        with writing(run.ledger):
            run.ledger.write_text(json.dumps(to_json(dataclasses.replace(run.startup, goodput=report)), indent=1))
    return report


def _logged(hooks: Sequence[Hook], record: dict[str, Any], nonfinite: NonFiniteSteps | None) -> None:
    """Log ``record``, then count its steps' skips (the record shows the steps that pass the limit)."""
    for hook in hooks:
        hook.log(record)
    if nonfinite is not None:
        nonfinite.look()
