"""Hugging Face checkpoints of the decoder's families (Llama, Qwen2, Qwen3, Mistral, Gemma 2 and 3):
``config.json`` and safetensors in PyTorch's naming and layout.

A Hugging Face folder holds ``config.json``, the weights as one ``model.safetensors`` or several
files listed in ``model.safetensors.index.json``, and often ``tokenizer.json``. jzero's decoder
(:mod:`jzero.models.decoder`) names its parameters after Hugging Face's; :data:`NAMES`, from the
architecture table, is the one table between the two. PyTorch's ``Linear`` keeps its weight ``[out, in]`` and Flax's ``Dense`` its
kernel ``[in, out]``, so matrices are transposed; jzero's layers are one stacked tensor
``[n_layers, ...]`` where Hugging Face has one tensor per layer.

Reading streams: :class:`HFCheckpoint` memory-maps each file (:func:`jzero.checkpoint.export.read_safetensors`)
and :func:`slice_of` reads only the rows and columns one device's shard needs, then unmaps the
pages it read, so a process holds what its own shards need, never the whole model.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding

from jzero.checkpoint.export import read_safetensors
from jzero.data.tokens import TOKENIZER_FILE, release_pages
from jzero.errors import ConfigError, clip, show_value
from jzero.models.architectures import ARCHITECTURES, Architecture, architecture, by_hf_class, hf_names
from jzero.models.sizes import head_size, kv_heads, mlp_units, sliding_layers
from jzero.sharding.plan import Plan

__all__ = [
    "CONFIG",
    "INDEX",
    "NAMES",
    "SINGLE",
    "TOKENIZER",
    "HFCheckpoint",
    "hf_config",
    "hf_names",
    "hf_tensors",
    "is_hf_folder",
    "model_section",
    "placed_params",
    "slice_of",
]

CONFIG, INDEX, SINGLE = "config.json", "model.safetensors.index.json", "model.safetensors"
TOKENIZER = TOKENIZER_FILE  # the tokenizer's file, as in a token folder
FLOAT32 = np.dtype(np.float32)  # what a run starts from (its master copy, when it keeps one)
MAX_SEQ_LEN = 4096  # model.seq_len from max_position_embeddings, at most this (--set model.seq_len=N)

# jzero's decoder parameter -> (Hugging Face's tensor, "{}" the layer for stacked ones; transposed):
# the same path has the same name in every row, so one table serves them all.
NAMES: dict[str, tuple[str, bool]] = {
    path: name for row in ARCHITECTURES if row.hf_class for path, name in hf_names(row, tied=False).items()
}

# config.json's keys -> the model: section's (a row reads those of its keys; the rest are read or checked below)
_KEYS = {
    "vocab_size": "vocab_size",
    "hidden_size": "d_model",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "num_key_value_heads": "n_kv_heads",
    "intermediate_size": "mlp_hidden",
    "head_dim": "head_dim",
    "rope_theta": "rope_theta",
    "rms_norm_eps": "rms_norm_eps",
    "tie_word_embeddings": "tie_embeddings",
    "sliding_window": "sliding_window",
    "query_pre_attn_scalar": "attn_scalar",
    "attn_logit_softcapping": "attn_softcap",
    "final_logit_softcapping": "final_softcap",
    "rope_local_base_freq": "rope_local_theta",
}
_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
_SCALING = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
_LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding"}  # Hugging Face's -> model.layer_types'
_ACTIVATIONS = {"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh"}  # a row's activation -> hidden_act's name


def is_hf_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder with a Hugging Face ``config.json``."""
    return (Path(path) / CONFIG).is_file()


def _read_json(path: Path, key: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(key, f"cannot read {path}: {err.strerror or err}") from None
    except ValueError as err:
        raise ConfigError(key, f"{path} is not JSON: {clip(str(err))}") from None


def model_section(folder: str | Path) -> dict[str, Any]:
    """The ``model:`` section of a Hugging Face checkpoint's ``config.json`` (YAML-shaped): its row
    of the architecture table (:func:`jzero.models.architectures.by_hf_class`) and its sizes.

    Raises:
      ConfigError: naming ``config.json``'s key: an architecture jzero does not read (the message
        lists those it does), or a choice its row does not make (another activation, biases where
        it has none, a kind of layer or rope scaling it does not compute).
    """
    path = Path(folder) / CONFIG
    raw = _read_json(path, str(path))
    if not isinstance(raw, dict):
        raise ConfigError(str(path), "is not a JSON object")

    def bad(key: str, problem: str) -> ConfigError:
        return ConfigError(f"{path}: {key}", problem)

    row = by_hf_class(list(raw.get("architectures") or []), raw.get("model_type"))
    if row is None:
        got = show_value(raw.get("architectures") or raw.get("model_type"))
        known = ", ".join(r.hf_class for r in ARCHITECTURES if r.hf_class)
        raise bad("architectures", f"jzero reads {known}; got {got}")
    missing = next((k for k in _REQUIRED if k not in raw), None)
    if missing:
        raise bad(missing, "is missing")
    raw = {**dict(row.hf_defaults), **raw}
    _check_choices(raw, row, bad)
    section: dict[str, Any] = {"name": row.name}
    read = [(theirs, ours) for theirs, ours in _KEYS.items() if ours in row.keys and ours != "sliding_window"]  # _window's
    section |= {ours: raw[theirs] for theirs, ours in read if raw.get(theirs) is not None}
    section["seq_len"] = min(int(raw.get("max_position_embeddings", MAX_SEQ_LEN)), MAX_SEQ_LEN)
    section |= _window(raw, row, bad)
    if raw.get("rope_scaling") and raw["rope_scaling"].get("rope_type", raw["rope_scaling"].get("type")) != "default":
        section["rope_scaling"] = _rope_scaling(raw["rope_scaling"], bad)
    return section


def _check_choices(raw: dict[str, Any], row: Architecture, bad: Callable[[str, str], ConfigError]) -> None:
    """What a row computes and ``config.json`` may say otherwise: the activation, the biases."""
    activation = raw.get("hidden_activation") or raw.get("hidden_act") or _ACTIVATIONS[row.activation]
    if activation != _ACTIVATIONS[row.activation]:
        key = "hidden_activation" if "hidden_activation" in raw else "hidden_act"
        raise bad(key, f"jzero's {row.name} has {json.dumps(_ACTIVATIONS[row.activation])}, got {clip(json.dumps(activation))}")
    for key, want in (("attention_bias", row.qkv_bias), ("mlp_bias", False)):
        if key in raw and raw[key] != want:
            raise bad(key, f"jzero's {row.name} has {json.dumps(want)}, got {clip(json.dumps(raw[key]))}")


def _window(raw: dict[str, Any], row: Architecture, bad: Callable[[str, str], ConfigError]) -> dict[str, Any]:
    """``sliding_window`` and ``layer_types`` as the row reads them: Qwen's ``use_sliding_window``
    and ``max_window_layers``, Gemma's pattern, or ``config.json``'s own ``layer_types``."""
    window = raw.get("sliding_window")
    if "sliding_window" not in row.keys or window is None or raw.get("use_sliding_window") is False:
        return {}
    if "layer_types" not in row.keys:
        return {"sliding_window": window}  # Mistral: every layer
    layers = raw["num_hidden_layers"]
    kinds = raw.get("layer_types")
    if kinds is None and "max_window_layers" in raw:
        kinds = ["sliding_attention" if i >= raw["max_window_layers"] else "full_attention" for i in range(layers)]
    if kinds is None:
        every = raw.get("sliding_window_pattern", row.sliding_every)
        kinds = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(layers)]
    other = next((k for k in kinds if k not in _LAYER_TYPES), None)
    if other is not None:
        raise bad("layer_types", f"jzero computes {' and '.join(_LAYER_TYPES)}, got {show_value(other)}")
    ours = [_LAYER_TYPES[k] for k in kinds]
    return {"sliding_window": window, "layer_types": ours} if "sliding" in ours else {}


def _rope_scaling(scaling: dict[str, Any], bad: Callable[[str, str], ConfigError]) -> dict[str, Any]:
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        return {"rope_type": kind, "factor": scaling["factor"]}
    if kind != "llama3":
        raise bad("rope_scaling", f"jzero reads rope_type llama3 or linear, got {show_value(kind)}")
    return {"rope_type": kind, **{k: scaling[k] for k in _SCALING if k in scaling}}


def hf_config(model: Any, dtype: str, imported: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``config.json`` for a ``model:`` section of a decoder row (its fields resolved), weights in
    ``dtype``: the ``config.json`` it was ``imported`` from (its token ids, its names), with the
    shape and dtype the run has, every key jzero reads written out."""
    row = architecture(model.name)
    activation = "hidden_activation" if row.sandwich_norms else "hidden_act"
    out: dict[str, Any] = {
        **(imported or {}),
        "architectures": [row.hf_class],
        "model_type": row.model_types[0],
        activation: _ACTIVATIONS[row.activation],
        # the positions the model knows: the original's, or more if the run trained longer (or its
        # rope scaling's original context, which transformers wants under it)
        "max_position_embeddings": max(
            model.seq_len, int((imported or {}).get("max_position_embeddings", 0)), _scaled_context(model.rope_scaling)
        ),
        "torch_dtype": dtype,
    }
    out |= {"attention_bias": False} if not row.qkv_bias else {}
    out |= {"mlp_bias": False} if row.name == "llama" else {}
    values = {"n_kv_heads": kv_heads(model), "mlp_hidden": mlp_units(model), "head_dim": head_size(model)}
    out.update({theirs: values.get(ours, getattr(model, ours)) for theirs, ours in _KEYS.items() if ours in row.keys})
    if "layer_types" in row.keys:
        slides = sliding_layers(model)
        out["layer_types"] = [f"{'sliding' if s else 'full'}_attention" for s in slides]
        out |= {"use_sliding_window": any(slides)} if row.name.startswith("qwen") else {}  # layer_types say which
    s = model.rope_scaling
    out["rope_scaling"] = None if s is None else {"rope_type": s.rope_type, "factor": s.factor} if s.rope_type == "linear" else {
        "rope_type": s.rope_type, **{k: getattr(s, k) for k in _SCALING}}  # fmt: skip
    return out


def _scaled_context(scaling: Any) -> int:
    return scaling.original_max_position_embeddings if scaling is not None and scaling.rope_type == "llama3" else 0


def hf_names(path: str, layers: int) -> list[str]:
    """Hugging Face's tensors for one of jzero's decoder parameters: one per layer for a stacked one."""
    name, _ = NAMES[path]
    return [name.format(i) for i in range(layers)] if "{}" in name else [name]


def hf_tensors(path: str, shape: tuple[int, ...], layers: int) -> list[tuple[str, tuple[int, ...], int | None]]:
    """``(name, shape, layer)`` of each of Hugging Face's tensors for jzero's parameter ``path`` of
    ``shape``: one per layer of a stacked one (``layer`` None for the others), matrices transposed."""
    name, transposed = NAMES[path]
    stacked = "{}" in name
    one = tuple(shape[1:] if stacked else shape)
    one = tuple(reversed(one)) if transposed else one
    return [(hf, one, i if stacked else None) for i, hf in enumerate(hf_names(path, layers))]


class HFCheckpoint:
    """A Hugging Face folder's tensors, memory-mapped: nothing is read until sliced.

    Raises (on construction):
      ConfigError: naming the file: no weights, a shard file the index lists that is missing or
        damaged, or a tensor the index and the file disagree on.
    """

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        index, single = self.folder / INDEX, self.folder / SINGLE
        if index.is_file():
            weight_map = _read_json(index, str(index)).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ConfigError(str(index), "has no weight_map")
            files = sorted(set(weight_map.values()))
        elif single.is_file():
            weight_map, files = None, [SINGLE]
        else:
            raise ConfigError(str(self.folder), f"holds no {SINGLE} and no {INDEX}")
        self.tensors: dict[str, np.ndarray] = {}
        for name in files:
            path = self.folder / name
            if not path.is_file():
                raise ConfigError(str(path), f"is missing: {INDEX} lists it")
            for tensor, array in read_safetensors(path).items():
                if weight_map is not None and weight_map.get(tensor) != name:
                    raise ConfigError(str(path), f"holds {tensor}, which {INDEX} puts in {show_value(weight_map.get(tensor))}")
                self.tensors[tensor] = array
        if weight_map is not None and (absent := sorted(set(weight_map) - set(self.tensors))):
            raise ConfigError(str(self.folder / weight_map[absent[0]]), f"does not hold {absent[0]}, which {INDEX} lists there")

    def check(self, shapes: Mapping[str, tuple[int, ...]], layers: int) -> None:
        """Every tensor maps to one of ``shapes`` (jzero's parameter paths and shapes) and has its shape.

        Raises:
          ConfigError: naming the first tensor that does not map, is missing, or has another shape.
        """
        want = {}
        for path, shape in shapes.items():
            if path not in NAMES:
                raise ConfigError(path, "is not a parameter of jzero's decoder")
            want |= {hf: one for hf, one, _ in hf_tensors(path, shape, layers)}
        unmapped = sorted(set(self.tensors) - set(want))
        if unmapped:
            why = "maps to no parameter of jzero's decoder (config.json's row and shape)"
            raise ConfigError(f"{self.folder}: {unmapped[0]}", why)
        for hf, shape in want.items():
            if hf not in self.tensors:
                raise ConfigError(f"{self.folder}: {hf}", "is missing")
            if tuple(self.tensors[hf].shape) != shape:
                got = list(self.tensors[hf].shape)
                raise ConfigError(f"{self.folder}: {hf}", f"has shape {got}, config.json gives {list(shape)}")

    def nbytes(self) -> int:
        """The weights' bytes."""
        return sum(a.nbytes for a in self.tensors.values())


def slice_of(checkpoint: HFCheckpoint, path: str, layers: int, dtype: Any) -> Callable[[tuple[slice, ...]], np.ndarray]:
    """A callback for ``jax.make_array_from_callback``: the part ``index`` of jzero's parameter
    ``path``, read from the checkpoint's tensors (only the rows and columns asked for) as ``dtype``."""
    name, transposed = NAMES[path]
    stacked = "{}" in name

    def one(tensor: np.ndarray, index: tuple[slice, ...]) -> np.ndarray:
        part = np.array(tensor[index[1], index[0]]).T if transposed else np.array(tensor[index])
        release_pages(tensor)  # the file's pages read leave this process: RSS holds the copy only
        return part

    def read(index: tuple[slice, ...]) -> np.ndarray:
        if not stacked:
            return one(checkpoint.tensors[name], index).astype(dtype)
        rows = range(*index[0].indices(layers))
        parts = [one(checkpoint.tensors[name.format(i)], index[1:]).astype(dtype) for i in rows]
        return np.stack(parts) if parts else np.zeros((0,), dtype)

    return read


def placed_params(folder: str | Path, plan: Plan, given: Mapping[str, jax.Array] | None = None) -> Any:
    """A Hugging Face checkpoint's weights as ``plan``'s float32 parameters, each device's shard read
    from the files by itself (``jax.make_array_from_callback``): a process reads only what its
    devices hold.

    Args:
      folder: the Hugging Face folder.
      plan: the parameters' paths, shapes and shardings.
      given: parameters already placed, by path, which the folder does not hold (LoRA's adapters).

    Raises:
      ConfigError: the folder's tensors do not map onto the plan's parameters (:meth:`HFCheckpoint.check`).
    """
    given = given or {}
    checkpoint = HFCheckpoint(folder)
    layers = next((t.shape[0] for t in plan.tensors if t.path.startswith("layers/")), 0)
    read = [t for t in plan.tensors if t.path not in given]
    checkpoint.check({t.path: t.shape for t in read}, layers)
    arrays = {
        t.path: jax.make_array_from_callback(
            t.shape, NamedSharding(plan.mesh, t.param_spec), slice_of(checkpoint, t.path, layers, FLOAT32)
        )
        for t in read
    }
    return jax.tree.unflatten(jax.tree.structure(plan.params), [given.get(t.path, arrays.get(t.path)) for t in plan.tensors])
