"""``jzero checkpoint export RUN_DIR --format hf --out DIR``: a decoder's run (Llama, Qwen, Mistral,
Gemma) as a Hugging Face folder.

The folder is what transformers' ``*ForCausalLM.from_pretrained(DIR)`` loads: ``config.json``,
the weights in PyTorch's naming and layout (:data:`jzero.checkpoint.hf.NAMES`), one
``model.safetensors`` or, over :data:`SHARD_BYTES`, numbered files and their index, and the run's
``tokenizer.json`` when it has one. It works from a run at any stage and mesh: each parameter is
read whole from the sharded checkpoint (one stacked parameter at a time: all layers of one matrix),
its layers written as tensors of their own, then dropped.

The folder is written under a hidden name beside ``--out`` and renamed into place once complete, so
a partial export never looks like one; an existing ``--out`` is refused unless ``force``, and then
replaced only once the new folder is complete.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from jzero.checkpoint.catalog import read_newest
from jzero.checkpoint.export import (
    NUMPY_DTYPES,
    SAFETENSORS_DTYPES,
    lora_scale,
    parameter_arrays,
    restore_numpy,
    safetensors_header,
    unreadable_step,
    write_safetensors,
)
from jzero.checkpoint.hf import CONFIG, INDEX, NAMES, SINGLE, TOKENIZER, hf_config, hf_tensors
from jzero.checkpoint.runs import array_metadata
from jzero.checkpoint.verify import verify_step
from jzero.config.loading import load_config
from jzero.config.run_folder import RunDir
from jzero.config.schema import EXPORT_DTYPES
from jzero.dtypes import array_bytes
from jzero.errors import CheckpointError, ConfigError, checked_path, path_error, show_value
from jzero.models.architectures import architecture
from jzero.models.lora import A, B, adapted_kernels, adapter_paths, is_adapter, lora_spec, merged_kernel
from jzero.models.names import DECODERS

__all__ = ["ADAPTER_FOLDER", "SHARD_BYTES", "export_hf"]

SHARD_BYTES = 5 * 10**9  # transformers' default max_shard_size, "5GB"
ADAPTER_FOLDER = "lora"  # an unmerged LoRA run's adapters, in PEFT's layout, under the exported folder
ADAPTER_WEIGHTS, ADAPTER_CONFIG = "adapter_model.safetensors", "adapter_config.json"  # PEFT's file names
PEFT_PREFIX = "base_model.model."  # PEFT's name for the model it wraps


def export_hf(
    run_dir: str | Path,
    out: str | Path,
    step: int | None = None,
    dtype: str = "float32",
    *,
    force: bool = False,
    merge_lora: bool = False,
    shard_bytes: int = SHARD_BYTES,
    warn: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Write a decoder run's committed step as a Hugging Face folder.

    A LoRA run's adapters are folded into their kernels (``merge_lora``: the folder is the model the
    run trained, in plain weights), or written on their own in PEFT's layout, in ``lora/``
    under the folder (:data:`ADAPTER_FOLDER`), beside the weights they adapt.

    Args:
      run_dir: the run's folder; its ``config.yaml`` must name a decoder row (``model.name: llama``, ``qwen2``, ...).
      out: the folder to write; it must not exist unless ``force``; its parent must.
      step: the committed step (default: the newest).
      dtype: the weights' dtype, ``float32`` or ``bfloat16``.
      force: replace an existing ``out`` (once the new folder is complete).
      merge_lora: fold LoRA's adapters into the weights instead of writing them on their own.
      shard_bytes: the most bytes of weights in one file.
      warn: told, in one line, of a step written before manifests (unverifiable).

    Returns:
      ``step``, ``tensors``, ``files``, ``bytes``, ``out``, ``dtype`` and ``adapters`` (the adapter
      tensors written on their own, 0 when merged or without LoRA), and ``family``, the row's
      Hugging Face class without ``ForCausalLM`` (``Llama``, ``Qwen2``, ``Gemma3``, ...).

    Raises:
      ConfigError: ``--dtype``, ``--out`` or the run's model (``model.name``) refused; nothing is written.
      CheckpointError: the run has no committed checkpoint, or it cannot be read.
    """
    if dtype not in EXPORT_DTYPES:
        raise ConfigError("--dtype", f"must be one of {', '.join(EXPORT_DTYPES)}, got {show_value(dtype)}")
    out = checked_path("--out", out)
    if out.exists() and not force:
        raise ConfigError("--out", f"{out} exists; not overwritten (--force replaces it)")
    parent = next((p for p in out.parents if p.exists() or p.is_symlink()), None)
    if parent is not None and not parent.is_dir():  # the folders up to it are made at the write
        raise ConfigError("--out", f"{parent} is not a folder")
    folder = RunDir(Path(run_dir))
    config = load_config(folder.config)
    if config.model.name not in DECODERS:
        rows = ", ".join(DECODERS)
        raise ConfigError("--format", f"hf writes the decoder's rows ({rows}); {run_dir} trained model.name: {config.model.name}")
    imported = json.loads(folder.hf_config.read_text()) if folder.hf_config.is_file() else None
    files = {CONFIG: json.dumps(hf_config(config.model, dtype, imported), indent=2) + "\n"}
    tokenizer = folder.tokenizer if folder.tokenizer.is_file() else None
    merge = lora_scale(run_dir) if merge_lora else None
    step_export = _StepExport(config.model.n_layers, dtype, shard_bytes, files, tokenizer, lora_spec(config.lora), merge)
    done = read_newest(run_dir, step, lambda step_dir: step_export.write(step_dir, out, force, warn))
    return {**done, "family": architecture(config.model.name).hf_class.removesuffix("ForCausalLM")}


class _StepExport:
    """One committed step written as the folder :func:`export_hf` describes."""

    def __init__(
        self, layers: int, dtype: str, shard_bytes: int, files: dict[str, str], tokenizer: Path | None, lora: Any,
        merge: float | None,
    ):
        self.layers, self.dtype, self.shard_bytes, self.files, self.tokenizer = layers, dtype, shard_bytes, files, tokenizer
        self.lora, self.merge = lora, merge

    def write(self, step_dir: Path, out: Path, force: bool, warn: Callable[[str], None]) -> dict[str, Any]:
        verify_step(step_dir, warn)
        state_dir = step_dir / "state"
        try:
            prefix, params = parameter_arrays(array_metadata(state_dir))
        except Exception as err:  # tensorstore raises plain Exceptions for unreadable data
            raise unreadable_step(step_dir, err) from None
        tensors = self._tensors({p: v for p, v in params.items() if not is_adapter(p)})
        adapted = adapted_kernels(list(params))
        shards = _shards(tensors, NUMPY_DTYPES[SAFETENSORS_DTYPES[self.dtype]], self.shard_bytes)
        tmp = out.with_name(f".{out.name[:200]}.jzero-export-{secrets.token_hex(6)}")
        try:
            out.parent.mkdir(parents=True, exist_ok=True)  # as transformers' save_pretrained does
            tmp.mkdir()
            source = _Source(state_dir, prefix, self.merge, adapted)
            written = self._fill(tmp, source, tensors, shards)
            shapes = {p: tuple(params[p][0]) for p in params if is_adapter(p)}
            adapters = 0 if self.merge is not None or not adapted else _write_adapters(tmp / ADAPTER_FOLDER, source, self, shapes)
            _publish(tmp, out, force)
        except OSError as err:
            raise path_error("--out", out, err, "write") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return {"step": int(step_dir.name), "tensors": len(tensors), "files": len(shards), "bytes": written, "out": str(out),
                "dtype": self.dtype, "adapters": adapters}  # fmt: skip

    def _tensors(self, params: dict[str, tuple]) -> list[tuple[str, tuple[int, ...], str, int | None]]:
        """``(hf_name, shape, jzero_path, layer)``, each parameter's layers together (one read per parameter)."""
        tensors = []
        for path in sorted(params):
            if path not in NAMES:
                raise CheckpointError(path, "is not a parameter of jzero's decoder")
            tensors += [(hf, one, path, layer) for hf, one, layer in hf_tensors(path, tuple(params[path][0]), self.layers)]
        return tensors

    def _fill(self, tmp: Path, source: _Source, tensors: list, shards: list[list[int]]) -> int:
        """Write the weights, the index, config.json and the tokenizer into ``tmp``; the weights' bytes
        (the index's ``total_size``: tensors only, no headers)."""
        count = len(shards)
        names = [SINGLE] if count == 1 else [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]
        written, weight_map = 0, {}
        for name, members in zip(names, shards, strict=True):
            chosen = [tensors[i] for i in members]
            header = [(hf, shape, self.dtype) for hf, shape, _, _ in chosen]
            places = {hf: (path, layer) for hf, _, path, layer in chosen}
            write_safetensors(tmp / name, header, partial(_produce, source, places), {"format": "pt"})
            found, _ = safetensors_header(tmp / name, "--out")  # read back: every tensor, its shape
            if [(n, tuple(found[n]["shape"])) for n, _, _ in header] != [(n, s) for n, s, _ in header]:
                raise ConfigError("--out", f"writing {name} failed: the file read back does not match")
            written += sum(end - begin for begin, end in (info["data_offsets"] for info in found.values()))
            weight_map.update(dict.fromkeys(places, name))
        if len(shards) > 1:
            index = {"metadata": {"total_size": written}, "weight_map": dict(sorted(weight_map.items()))}
            (tmp / INDEX).write_text(json.dumps(index, indent=2) + "\n")
        for name, text in self.files.items():
            (tmp / name).write_text(text)
        if self.tokenizer is not None:
            shutil.copyfile(self.tokenizer, tmp / TOKENIZER)
        return written


class _Source:
    """Reads one jzero parameter at a time from the checkpoint and hands out its layers; with
    ``merge`` (LoRA's scale), an adapted kernel comes with its adapter folded in."""

    def __init__(self, state_dir: Path, prefix: str, merge: float | None = None, adapted: list[str] = ()):
        self.state_dir, self.prefix, self.merge, self.adapted = state_dir, prefix, merge, set(adapted)
        self.path, self.array = None, None

    def read(self, path: str, layer: int | None) -> np.ndarray:
        """Layer ``layer`` of jzero's parameter ``path`` (the whole of it for None), in Hugging Face's layout."""
        array = self.whole(path)
        array = array if layer is None else array[layer]
        return array.T if NAMES[path][1] else array

    def whole(self, path: str) -> np.ndarray:
        """jzero's parameter ``path`` as saved (merged with its adapter when asked)."""
        if path != self.path:
            self.array = None  # drop the last one before reading the next
            self.array = self._merged(path) if self.merge is not None and path in self.adapted else self._read([path])[path]
            self.path = path
        return self.array

    def _merged(self, kernel: str) -> np.ndarray:
        a, b = adapter_paths(kernel)
        saved = self._read([kernel, a, b])
        return np.asarray(merged_kernel(saved[kernel], saved[a], saved[b], self.merge))

    def _read(self, paths: list[str]) -> dict[str, np.ndarray]:
        try:
            found = restore_numpy(self.state_dir, [self.prefix + p for p in paths])
        except Exception as err:  # tensorstore raises plain Exceptions for unreadable data
            raise unreadable_step(self.state_dir.parent, err) from None
        return {p: found[self.prefix + p] for p in paths}


def _write_adapters(folder: Path, source: _Source, export: _StepExport, shapes: dict[str, tuple[int, ...]]) -> int:
    """LoRA's adapters (``shapes``: their paths and stacked shapes) in PEFT's layout
    (``adapter_model.safetensors``, ``adapter_config.json``), for ``PeftModel.from_pretrained(model,
    folder)``: per layer, ``lora_A`` [rank, in] and ``lora_B`` [out, rank] under the name of the
    module they adapt. Returns the tensors written."""
    places, header = {}, []
    for path, shape in sorted(shapes.items()):  # one adapter's layers together: one read each
        kernel, part = path.rsplit("/", 1)[0] + "/kernel", {A: "lora_A", B: "lora_B"}[path.rsplit("/", 1)[1]]
        for weight, _, layer in hf_tensors(kernel, shape, export.layers):
            name = f"{PEFT_PREFIX}{weight.removesuffix('.weight')}.{part}.weight"
            places[name] = (path, layer)
            header.append((name, tuple(reversed(shape[1:])), export.dtype))
    folder.mkdir()
    def produce(name: str) -> np.ndarray:
        path, layer = places[name]
        return source.whole(path)[layer].T

    write_safetensors(folder / ADAPTER_WEIGHTS, header, produce, {"format": "pt"})
    modules = sorted({name.split(".")[-3] for name in places})  # ...q_proj.lora_A.weight
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": export.lora.rank, "lora_alpha": export.lora.alpha,
        "target_modules": modules, "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
        "base_model_name_or_path": None,
    }  # fmt: skip
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return len(places)


def _produce(source: _Source, places: dict[str, tuple[str, int | None]], hf: str) -> np.ndarray:
    return source.read(*places[hf])


def _shards(tensors: list[tuple[str, tuple[int, ...], str, int | None]], dtype: np.dtype, limit: int) -> list[list[int]]:
    """The tensors' indices grouped into files of at most ``limit`` bytes (a larger tensor alone)."""
    shards: list[list[int]] = [[]]
    size = 0
    for i, (_, shape, _, _) in enumerate(tensors):
        nbytes = array_bytes(shape, dtype)
        if shards[-1] and size + nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(i)
        size += nbytes
    return shards


def _publish(tmp: Path, out: Path, force: bool) -> None:
    """Rename the complete folder into place; an existing ``out`` (``force``) is moved aside first
    and deleted after."""
    aside = None
    if out.exists() or out.is_symlink():
        if not force:
            raise ConfigError("--out", f"{out} exists; not overwritten (--force replaces it)")
        aside = out.with_name(f".{out.name[:200]}.jzero-replaced-{secrets.token_hex(6)}")
        os.replace(out, aside)
    os.replace(tmp, out)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True) if aside.is_dir() else aside.unlink()
