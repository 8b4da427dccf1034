"""Where a run's state starts: its newest committed checkpoint, ``train.init_from``'s weights (a
jzero run, an export, plain Flax parameters or a Hugging Face folder of the decoder's families), or a fresh init."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import NamedSharding

from jzero.checkpoint.export import load_params, match_params
from jzero.checkpoint.hf import TOKENIZER, is_hf_folder, model_section, placed_params
from jzero.checkpoint.meta import RunMeta, changes
from jzero.checkpoint.runs import RunCheckpoints
from jzero.config.schema import Config
from jzero.errors import ConfigError
from jzero.models.lora import is_adapter
from jzero.sharding.mesh import mesh_shape
from jzero.sharding.placement import state_from_params
from jzero.sharding.state import TrainState
from jzero.training.data import TextBatches
from jzero.training.job import Job
from jzero.trees import tree_paths

__all__ = ["init_tokenizer", "initial_state"]


def initial_state(
    job: Job, checkpoints: RunCheckpoints | None, data: TextBatches, note: Callable[[str], None]
) -> tuple[TrainState, int]:
    """The latest committed checkpoint (onto this run's mesh and stage), else ``train.init_from``,
    else a fresh init. Returns the state and the step it is at."""
    restored = checkpoints.restore_latest(job.abstract_state(), warn=note) if checkpoints is not None else None
    if restored is not None:
        start = data.check_state(restored.data)
        changed = changes(RunMeta.read(restored.meta), mesh_shape(job.mesh), job.plan.zero.stage)
        note(f"resumed from {checkpoints.step_dir(restored.step)}" + (f" ({changed})" if changed else ""))
        return restored.state, start
    source = job.config.train.init_from
    if source:
        params = _hf_params(job, source) if is_hf_folder(source) else _loaded_params(job, source)
        note(f"parameters from {source}")
        return state_from_params(params, job.tx, job.plan, job.precision), 0
    return job.init_state(), 0


def _loaded_params(job: Job, source: str) -> Any:
    """``train.init_from``'s parameters (:func:`jzero.checkpoint.export.load_params`) on the plan's
    shardings; LoRA's adapters, which a model without them lacks, freshly initialised."""
    loaded, fresh = load_params(source), _fresh_adapters(job)
    loaded = {path: array for path, array in loaded.items() if path not in fresh}  # a LoRA run's own: fresh ones
    match_params(loaded, {t.path: t.shape for t in job.plan.tensors if t.path not in fresh}, source)
    def placed(t):
        return jax.device_put(np.asarray(loaded[t.path], np.float32), NamedSharding(job.mesh, t.param_spec))

    arrays = [fresh[t.path] if t.path in fresh else placed(t) for t in job.plan.tensors]
    return jax.tree.unflatten(jax.tree.structure(job.plan.params), arrays)


def init_tokenizer(config: Config) -> Path | None:
    """The tokenizer of the Hugging Face folder ``train.init_from`` names, where it has one: the
    model's own, which a run on bytes keeps for decoding."""
    source = config.train.init_from
    found = Path(source) / TOKENIZER if source and is_hf_folder(source) else None
    return found if found is not None and found.is_file() else None


def _hf_params(job: Job, source: str) -> Any:
    """A Hugging Face folder's weights, streamed into the plan's shards (:func:`jzero.checkpoint.hf.placed_params`)."""
    row = model_section(source)["name"]
    if job.config.model.name != row:
        why = f"jzero checkpoint import writes a run with its config, or set model.name: {row} and its shape"
        raise ConfigError("train.init_from", f"{source} is a Hugging Face {row}; model.name is {job.config.model.name}: {why}")
    return placed_params(source, job.plan, _fresh_adapters(job))


def _fresh_adapters(job: Job) -> dict[str, jax.Array]:
    """LoRA's adapters as a fresh init makes them (B zero: the model starts as the one loaded), by
    path, on the plan's shardings; XLA computes only them. Empty without LoRA."""
    shardings = {t.path: NamedSharding(job.mesh, t.param_spec) for t in job.plan.tensors if is_adapter(t.path)}
    if not shardings:
        return {}

    def init(key):
        flat = tree_paths(nn.unbox(job.init_fn(key)))
        return {path: flat[path].astype(np.float32) for path in shardings}

    return jax.jit(init, out_shardings=shardings)(job.rng)
