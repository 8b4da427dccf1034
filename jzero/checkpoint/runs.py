"""Sharded Orbax checkpoints of a training run.

A run's checkpoints live in ``<run.dir>/checkpoints/<step>/`` and are written by orbax-checkpoint's
``CheckpointManager``, so plain Orbax reads them too. Each holds three items:

- ``state``: the :class:`~jzero.sharding.state.TrainState` (step, parameters, fp32 master and optimizer
  state, skipped-step count, loss scale). Every process writes only the shards it owns.
- ``data``: the data iterator's state (:meth:`jzero.training.data.TextBatches.state`).
- ``meta``: the resolved config, mesh, stage, device count and run RNG, as JSON (:mod:`jzero.checkpoint.meta`).

Orbax writes into a temporary folder and renames it when every item is complete, so a folder named
by its step alone is committed and anything else is ignored. Before the rename jzero writes a
manifest of every file's checksum into it (:mod:`jzero.checkpoint.integrity`), and every read checks the files
against it first. Restore reads straight into the
target shardings (each device reads only its own slices), so a checkpoint restores onto any mesh,
stage or device count; only the model's shapes must match.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from jzero.checkpoint import in_flight, integrity
from jzero.checkpoint.meta import RunMeta, state_layout
from jzero.checkpoint.quiet import failure_reported, quiet_orbax
from jzero.checkpoint.slices import gate_replica_slices
from jzero.checkpoint.verify import on_every_process, step_folder, verify_step
from jzero.config.run_folder import CHECKPOINTS, not_a_folder
from jzero.config.schema import CheckpointConfig
from jzero.errors import (
    CheckpointError,
    CheckpointWriteError,
    DamagedCheckpoint,
    JzeroError,
    error_line,
)
from jzero.lazy import moved_names
from jzero.records import to_json
from jzero.sharding.state import TrainState
from jzero.trees import tree_paths

__all__ = ["ITEMS", "Restored", "RunCheckpoints", "array_metadata", "shape_differences", "written_by_jzero"]

# Until 0.2.0 (CHANGELOG.md): the step's verification, the run's listing and the meta record moved out.
_MOVED = {
    "rotated_away": "jzero.checkpoint.verify.rotated_away",  # step_folder and verify_step are imported here
    **{name: f"jzero.checkpoint.catalog.{name}" for name in ("NO_COMMITTED_STEP", "Verdict", "committed_steps", "describe",
                                                           "read_newest", "verify_run")},  # fmt: skip
    **{name: f"jzero.checkpoint.meta.{name}" for name in ("STAGE_1_OR_2", "changes", "run_meta")},  # state_layout: imported here
}
__getattr__ = moved_names(__name__, _MOVED)

ITEMS = ("state", "data", "meta")


Meta = RunMeta | dict[str, Any] | None  # what a save records of the run


def _write_failed(step: int, path: Path, cause: BaseException) -> CheckpointWriteError:
    failure_reported()  # this error is the failure's one report
    return CheckpointWriteError(step, path, cause)


@dataclasses.dataclass
class Restored:
    """A checkpoint read back by :meth:`RunCheckpoints.restore` or :meth:`RunCheckpoints.restore_latest`.

    Attributes:
      step: the committed step read.
      state: the :class:`~jzero.sharding.state.TrainState`, in the target's shardings.
      data: the data iterator's state (:meth:`jzero.training.data.TextBatches.state`).
      meta: the metadata saved with it, with ``step``, ``saved_at`` and ``manifest`` (jzero's loop saves
        :func:`~jzero.checkpoint.meta.run_meta`; :meth:`~jzero.checkpoint.meta.RunMeta.read` reads it).
      skipped: newer steps that could not be read, newest first, each with why; they were set aside.
    """

    step: int
    state: TrainState
    data: dict[str, Any]
    meta: dict[str, Any]
    skipped: list[tuple[int, str]]  # newer steps that could not be read, and why


def _is_array_metadata(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def array_metadata(pytree_dir: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Each array of a saved pytree as ``path -> (shape, dtype)``, read from its metadata alone."""
    quiet_orbax()
    metadata = ocp.PyTreeCheckpointer().metadata(pytree_dir).item_metadata
    if metadata is None:
        raise CheckpointError(str(pytree_dir), "has no readable metadata")
    return {p: (tuple(m.shape), str(m.dtype)) for p, m in tree_paths(metadata.tree, _is_array_metadata).items()}


def shape_differences(found: Mapping[str, Sequence[int]], want: Mapping[str, Sequence[int]], *, words: Mapping[str, str]) -> str:
    """What differs between two sets of arrays by path, as one line ("" if nothing): the paths
    missing from ``found``, those only in it, and those of another shape, parameters first; the
    first four, and how many more. ``words`` has ``missing``, ``extra`` and ``shape`` (a format of
    ``found`` and ``want``)."""
    problems = {p: words["missing"] for p in want if p not in found}
    problems |= {p: words["extra"] for p in found if p not in want}
    problems |= {
        p: words["shape"].format(found=list(found[p]), want=list(want[p]))
        for p in want
        if p in found and tuple(found[p]) != tuple(want[p])
    }
    lines = [f"{p}: {problems[p]}" for p in sorted(problems, key=lambda p: (not p.startswith("params/"), p))]
    return "; ".join(lines[:4]) + (f"; and {len(lines) - 4} more" if len(lines) > 4 else "")


_RESTORE_WORDS = {
    "missing": "missing from the checkpoint",
    "extra": "in the checkpoint, not in this model",
    "shape": "shape {found} in the checkpoint, {want} now",
}


@jax.jit
def _all_finite(tree: Any) -> jax.Array:
    leaves = [jnp.isfinite(x).all() for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.stack(leaves).all() if leaves else jnp.array(True)


class RunCheckpoints:
    """The checkpoints of one run directory, through one Orbax ``CheckpointManager``: save (atomic,
    optionally async), list, restore. What needs no manager of its own is a module function
    (:func:`written_by_jzero`), or of :mod:`jzero.checkpoint.catalog` and :mod:`jzero.checkpoint.verify`.

    An async save returns at once and commits in the background. :meth:`wait` blocks until it is
    committed, and :meth:`close` waits and releases Orbax's threads; a restore, a listing and the
    next save wait first. Used as a context manager it closes on leaving the block, and a save
    still in flight when the interpreter exits is committed first (:mod:`jzero.checkpoint.in_flight`),
    or its failure is one line and exit status 1.

    Example::

      with jzero.RunCheckpoints("runs/mine") as checkpoints:
          checkpoints.save(step, state)

    Args:
      run_dir: the run's folder; checkpoints live in ``<run_dir>/checkpoints/<step>/``.
      cfg: ``every``, ``keep`` and ``async_`` (default: every 100 steps, keep 3, async).
      read_only: only list and read (``jzero checkpoint info|export``); the folder must exist.

    Raises:
      CheckpointError: ``read_only`` and the run has no checkpoints folder.
    """

    def __init__(self, run_dir: str | Path, cfg: CheckpointConfig | None = None, *, read_only: bool = False):
        quiet_orbax()
        gate_replica_slices()
        cfg = cfg or CheckpointConfig()
        self.every = cfg.every
        self.directory = (Path(run_dir) / CHECKPOINTS).absolute()
        in_flight.wait_for(self.directory)  # else this manager would sweep its temporary folder away
        if read_only and not self.directory.is_dir():
            problem = not_a_folder(run_dir) or f"holds no checkpoints ({self.directory} does not exist)"
            raise CheckpointError(str(run_dir), problem)
        options = _manager_options(cfg.keep, read_only, seal=self._seal)
        self.async_ = cfg.async_
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)
        self._pending: int | None = None  # the step an async write is in flight for
        self._sealing: int | None = None  # the step whose manifest the commit callback writes

    def steps(self) -> list[int]:
        """Committed steps, oldest first. A write still in flight is waited for first: Orbax lists a
        step from the moment its write starts."""
        self.wait()
        return sorted(self.manager.all_steps())

    def step_dir(self, step: int) -> Path:
        """``<run_dir>/checkpoints/<step>``, absolute, committed or not."""
        return step_folder(self.directory.parent, step)

    def due(self, step: int) -> bool:
        """Whether ``checkpoint.every`` asks for a save at ``step``."""
        return self.every > 0 and step % self.every == 0

    def save(self, step: int, state: TrainState, data: dict[str, Any] | None = None, meta: Meta = None) -> bool:
        """Start writing ``step`` (in the background when async). A state that is not finite is never
        written: it returns False. A failed earlier write is raised here, in the caller's thread.
        ``meta``: jzero's :class:`~jzero.checkpoint.meta.RunMeta`, or any JSON object of yours.
        (Orbax waits for the previous write before starting one anyway; waiting here first names
        the failed step correctly.)"""
        self.wait()
        if not bool(_all_finite((state.params, state.opt_state))):
            return False
        args = _save_args(step, state, data, meta)
        self._sealing = step  # before the save: its background thread may commit before save returns
        try:
            self.manager.save(step, args=args, force=True)
        except Exception as err:
            raise _write_failed(step, self.step_dir(step), err) from err
        self._pending = step
        in_flight.track(self)
        if not self.async_:
            self.wait()
        return True

    def _verify(self, step: int, warn: Callable[[str], None]) -> None:
        verify_step(self.step_dir(step), warn)

    def _seal(self) -> None:
        """Orbax's commit callback, on the primary process once every process has written its files
        and before the folder is renamed into place: the manifest commits with the step."""
        step = self._sealing
        temporary = sorted(self.directory.glob(f"{step}.orbax-checkpoint-tmp*"))
        integrity.write_manifest(temporary[-1] if temporary else self.step_dir(step))

    def check(self) -> None:
        """Raise a finished background write's failure, if any."""
        if self._pending is not None:
            self._as_pending_write(self.manager.check_for_errors)

    def wait(self) -> None:
        """Block until the write in flight is committed; raise its failure."""
        if self._pending is not None:
            try:
                self._as_pending_write(self.manager.wait_until_finished, self.manager.check_for_errors)
            finally:
                in_flight.forget(self)
            self._pending = None

    def _as_pending_write(self, *calls: Callable[[], Any]) -> None:
        """Run ``calls`` in order; a failure is the write in flight's: raised naming its step, which
        is no longer pending."""
        try:
            for call in calls:
                call()
        except Exception as err:
            step, self._pending = self._pending, None
            raise _write_failed(step, self.step_dir(step), err) from err

    def close(self) -> None:
        """Wait for the write in flight (raising its failure), then release Orbax's threads."""
        self.wait()
        self.manager.close()

    def __enter__(self) -> RunCheckpoints:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()  # commits the write in flight even when the block raised

    def restore(self, step: int, target: TrainState, warn: Callable[[str], None] = print) -> Restored:
        """Read a committed step straight into the target's shardings (any mesh, stage or devices).

        Args:
          step: a committed step (a write in flight is waited for first).
          target: ``ShapeDtypeStruct`` leaves with ``sharding`` (:func:`jzero.sharding.placement.sharded_abstract`).
          warn: told, in one line, of a step that has no manifest to verify it.

        Returns:
          The :class:`Restored` state, data-iterator state and run metadata.

        Raises:
          DamagedCheckpoint: the step's files are not what was written (:func:`verify_step`).
          CheckpointError: the step is not committed, or its shapes are not the target's.
        """
        if step not in self.steps():  # waits for a write in flight
            raise CheckpointError(str(self.step_dir(step)), "is not a committed checkpoint")
        self._verify(step, warn)
        _check_shapes(self.step_dir(step), target)
        got = self.manager.restore(step, args=_restore_args(target))
        return Restored(step, got["state"], got["data"], got["meta"], [])

    def restore_latest(self, target: TrainState, warn: Callable[[str], None] = print) -> Restored | None:
        """The newest committed step that reads back; an unreadable one is named and skipped.

        None when there are no checkpoints. A shape mismatch is the config's fault, not the
        checkpoint's, and is raised at once, as is a step folder jzero did not write: nothing is
        set aside then."""
        return _restore_newest(self, target, warn)

    def written_by_jzero(self, step: int) -> bool:
        """Whether a committed step folder has jzero's items: the only folders jzero sets aside."""
        return written_by_jzero(self.step_dir(step))


def _manager_options(keep: int, read_only: bool, *, seal: Callable[[], None]) -> ocp.CheckpointManagerOptions:
    """Always Orbax's async checkpointer, as ``seal`` (the manifest) runs in its commit callback; a
    sync save just waits for the commit."""
    return ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        enable_async_checkpointing=True,
        async_options=ocp.AsyncOptions(post_finalization_callback=seal),
        create=not read_only,
        read_only=read_only,
        cleanup_tmp_directories=not read_only,  # half-written saves of a killed run
    )


def _save_args(step: int, state: TrainState, data: dict[str, Any] | None, meta: Meta) -> ocp.args.Composite:
    """The three items of a save; ``meta`` gains the step, the time and the manifest's name, and
    what it does not say of the state's layout (:func:`~jzero.checkpoint.meta.state_layout`)."""
    mine = to_json(meta) if isinstance(meta, RunMeta) else (meta or {})
    meta = {**state_layout(state), **mine, "step": step, "saved_at": time.time(), "manifest": integrity.MANIFEST}
    items = {"state": ocp.args.StandardSave(state), "data": ocp.args.JsonSave(data or {}), "meta": ocp.args.JsonSave(meta)}
    return ocp.args.Composite(**items)


def _restore_args(target: TrainState) -> ocp.args.Composite:
    return ocp.args.Composite(state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore())


def _check_shapes(step_dir: Path, target: TrainState) -> None:
    """Refuse a checkpoint whose arrays are not the target's, naming the first few that differ and
    what to do instead: a run resumes only the state it saved, while ``train.init_from`` reads a
    step's parameters into a new run of another state (adapters, other trainable parameters)."""
    found = {p: shape for p, (shape, _) in array_metadata(step_dir / "state").items()}
    differ = shape_differences(found, {p: x.shape for p, x in tree_paths(target).items()}, words=_RESTORE_WORDS)
    if differ:
        todo = f"to train LoRA adapters or other parameters from these weights, use a new run.dir with train.init_from={step_dir}"
        raise CheckpointError(str(step_dir), f"the model's shapes differ from the checkpoint's: {differ}; {todo}")


def written_by_jzero(step_dir: Path) -> bool:
    """Whether a step folder has jzero's items: the only folders jzero sets aside.

    Args:
      step_dir: a step's folder (:func:`step_folder`).

    Returns:
      True when it holds a ``state``, a ``data`` and a ``meta`` folder.
    """
    return all((step_dir / item).is_dir() for item in ITEMS)


def _restore_newest(checkpoints: RunCheckpoints, target: TrainState, warn: Callable[[str], None]) -> Restored | None:
    """:meth:`RunCheckpoints.restore_latest`: try the steps newest first, setting aside each that
    does not read back."""
    steps = checkpoints.steps()
    foreign = [step for step in steps if not checkpoints.written_by_jzero(step)]
    if foreign:
        raise CheckpointError(
            str(checkpoints.step_dir(foreign[-1])),
            f"was not written by jzero (no {' and '.join(f'{i}/' for i in ITEMS)} items); move it out of "
            f"{checkpoints.directory} or choose another run.dir",
        )
    skipped: list[tuple[int, str]] = []
    for step in reversed(steps):
        restored, problem = _try_restore(checkpoints, step, target, warn)
        if problem is None:
            restored.skipped = skipped
            return restored
        failure_reported()  # the warning below is its one report
        damaged = isinstance(problem, DamagedCheckpoint)
        reason = f"{problem.file} {problem.problem}" if damaged else error_line(problem)
        skipped.append((step, reason))
        aside = _set_aside(checkpoints, step)
        warn(f"jzero: warning: checkpoint {checkpoints.step_dir(step)} is {'damaged' if damaged else 'unreadable'} "
             f"({reason}); moved to {aside.name}, trying the previous one")  # fmt: skip
    if steps:
        tried = ", ".join(map(str, reversed(steps)))
        raise CheckpointError(str(checkpoints.directory), f"no committed checkpoint could be read (tried steps {tried})")
    return None


def _set_aside(checkpoints: RunCheckpoints, step: int) -> Path:
    """Rename an unreadable step out of Orbax's view (kept, not deleted), so it can be saved again."""
    aside = checkpoints.directory / f"{step}.unreadable-{int(time.time())}"
    if jax.process_index() == 0:
        checkpoints.step_dir(step).rename(aside)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"jzero-set-aside-{step}")
    checkpoints.manager.reload()
    return aside


def _try_restore(
    checkpoints: RunCheckpoints, step: int, target: TrainState, warn: Callable[[str], None]
) -> tuple[Restored | None, Exception | None]:
    """The one place a restore's failure is caught: damage, TensorStore, Orbax, OS, decoding.

    Every process gets the same answer, so all fall back from the same step. Only errors that
    are the config's or the user's (a shape mismatch, a step jzero did not write) are raised.
    """
    try:
        restored, problem = checkpoints.restore(step, target, warn), None
    except DamagedCheckpoint as err:
        restored, problem = None, err
    except JzeroError:
        raise
    except Exception as err:  # TensorStore raises plain Exceptions for unreadable data
        restored, problem = None, err
    failed = on_every_process(problem is not None)
    if problem is None and any(failed):
        problem = CheckpointError(str(checkpoints.step_dir(step)), f"could not be read on process {failed.index(True)}")
    return (None, problem) if problem is not None else (restored, None)


