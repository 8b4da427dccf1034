"""``jzero checkpoint import HF_DIR --out RUN_DIR``: a Hugging Face Llama as a jzero run at step 0.

The run's config is the defaults, the model's shape from ``config.json``
(:func:`jzero.checkpoint.hf.model_section`), ``train.init_from: HF_DIR`` and the ``--set`` overrides
(the stage and the mesh among them). Its weights stream from the safetensors files into the
shards of that stage and mesh (:func:`jzero.checkpoint.hf.placed_params`), and the state (a fresh
optimizer around them) is written as the run's step-0 checkpoint, with ``config.yaml``, the
checkpoint's ``tokenizer.json`` and its ``config.json`` (as ``hf_config.json``: what an export
keeps). Everything that can refuse the import (the folder, its names and shapes, the config, an
``--out`` that holds a run) does so before anything is written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from jzero.checkpoint.hf import CONFIG, TOKENIZER, is_hf_folder, model_section
from jzero.config.loading import load_config
from jzero.config.schema import Config
from jzero.distributed.runtime import lock_run_dir
from jzero.errors import ConfigError
from jzero.training.data import train_data
from jzero.training.hooks import writing
from jzero.training.job import build_job
from jzero.training.loop import prepare_run

__all__ = ["import_checkpoint", "import_config"]


def import_config(hf_dir: str | Path, out: str | Path, sets: list[str] | tuple[str, ...] = ()) -> Config:
    """The run's config for an import: the defaults, the model's shape from ``config.json``,
    ``run.dir: out``, ``train.init_from: hf_dir``, then ``sets``. Reads no weights and starts no JAX,
    so a command can size its CPU devices (``runtime.cpu_devices``) from it first.

    Raises:
      ConfigError: ``hf_dir`` has no Hugging Face ``config.json``, or a key is wrong.
    """
    hf_dir = Path(hf_dir)
    if not is_hf_folder(hf_dir):
        raise ConfigError(str(hf_dir), f"is not a folder with a Hugging Face {CONFIG}")
    words = [f"model.{key}={json.dumps(value)}" for key, value in model_section(hf_dir).items()]
    return load_config(None, [*words, f"run.dir={out}", f"train.init_from={hf_dir}", *sets])


def import_checkpoint(hf_dir: str | Path, out: str | Path, sets: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Write a run folder at step 0 from a Hugging Face Llama folder.

    Args:
      hf_dir: the folder: ``config.json``, ``model.safetensors`` or the index and its files, and
        ``tokenizer.json`` when there is one.
      out: the run folder to write (``run.dir``); it must not hold a run.
      sets: ``--set`` overrides, applied after the model's shape (``zero.stage=3``, ``mesh.axes=...``).

    Returns:
      ``{"run_dir", "parameters", "stage", "mesh", "tokenizer"}``: what was written.

    Raises:
      ConfigError: one line naming the file, tensor or key; nothing has been written then.
    """
    hf_dir = Path(hf_dir)
    config = import_config(hf_dir, out, sets)
    job = build_job(config)
    data = train_data(config)
    with lock_run_dir(config.run.dir):
        run = prepare_run(config, job, data, resume=False)
        with run.checkpoints:
            tokenizer = hf_dir / TOKENIZER
            if tokenizer.is_file():  # the run's own copy: jzero sample decodes with it
                with writing(run.folder.tokenizer):
                    shutil.copyfile(tokenizer, run.folder.tokenizer)
            with writing(run.folder.hf_config):  # what an export keeps beyond the shape
                shutil.copyfile(hf_dir / CONFIG, run.folder.hf_config)
            run.checkpoints.save(0, run.state, data.state(0), run.meta)
            run.checkpoints.wait()
    mesh = " x ".join(f"{k}={v}" for k, v in job.mesh.shape.items())
    return {"run_dir": str(run.folder.path), "parameters": job.plan.num_params, "stage": job.plan.zero.stage, "mesh": mesh,
            "tokenizer": tokenizer.is_file()}  # fmt: skip
