"""Consolidated parameters out of and into jzero: the equivalent of DeepSpeed's ``zero_to_fp32``.

``export_checkpoint`` writes a run's parameters (the fp32 master copy when there is one) as one
safetensors file, streaming: each tensor is read from the sharded Orbax checkpoint as one host
array, written, and dropped, so memory holds one tensor at a time. The file is written under a
temporary name, checked against the checkpoint (every tensor, its shape and its byte count), and
only then renamed into place: an export is never empty or partial.

``load_params`` reads parameters to start a run from (``train.init_from``): a safetensors file, a
Flax msgpack file (``flax.serialization.to_bytes``), an Orbax params checkpoint, or a jzero
checkpoint step folder. Names are ``/``-joined tree paths, as in ``jzero plan``.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from jzero.checkpoint import RunCheckpoints, array_metadata, error_line, tree_paths
from jzero.config import ConfigError

SAFETENSORS_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "float64": "F64", "int32": "I32", "int64": "I64"}
NUMPY_DTYPES = {code: np.dtype(jnp.dtype(name)) for name, code in SAFETENSORS_DTYPES.items()}
EXPORT_DTYPES = ("float32", "bfloat16")


# ---------------------------------------------------------------------------------------------
# safetensors, written and read one tensor at a time


def write_safetensors(
    out: Path, tensors: Iterable[tuple[str, tuple[int, ...], str]], produce: Callable[[str], np.ndarray], metadata: dict[str, str]
) -> int:
    """Write a safetensors file whose header lists ``(name, shape, dtype)``; ``produce(name)``
    returns each tensor when its turn comes. Returns the bytes written."""
    tensors = list(tensors)
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name, shape, dtype in tensors:
        size = int(np.prod(shape, dtype=np.int64)) * NUMPY_DTYPES[SAFETENSORS_DTYPES[dtype]].itemsize
        header[name] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format's recommended alignment
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name, shape, dtype in tensors:
            array = np.ascontiguousarray(produce(name), dtype=jnp.dtype(dtype))
            if array.shape != tuple(shape):
                raise ConfigError(name, f"read shape {list(array.shape)}, expected {list(shape)}")
            f.write(array.tobytes())
    return 8 + len(raw) + offset


def safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    """The header (without ``__metadata__``) and where the data starts."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file, memory-mapped (nothing is read until used)."""
    header, start = safetensors_header(path)
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        dtype = NUMPY_DTYPES.get(info["dtype"])
        if dtype is None:
            raise ConfigError(str(path), f"tensor {name} has unsupported dtype {info['dtype']}")
        out[name] = np.memmap(path, dtype=dtype, mode="r", offset=start + begin, shape=tuple(info["shape"]))
        if out[name].nbytes != end - begin:
            raise ConfigError(str(path), f"tensor {name}: {end - begin} bytes for shape {info['shape']}")
    return out


# ---------------------------------------------------------------------------------------------
# Reading parts of an Orbax checkpoint as host arrays


def restore_numpy(pytree_dir: Path, paths: list[str] | None = None) -> dict[str, np.ndarray]:
    """A saved pytree's arrays as host arrays: all of them, or only ``paths`` (``/``-joined, each
    under nested dicts, as parameters are), reading nothing else."""
    if paths is None:
        tree = ocp.PyTreeCheckpointer().metadata(pytree_dir).item_metadata.tree
        restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
        return tree_paths(ocp.PyTreeCheckpointer().restore(pytree_dir, args=ocp.args.PyTreeRestore(restore_args=restore_args)))
    item: dict[str, Any] = {}
    restore_args = {}
    for path in paths:
        node, args = item, restore_args
        *parents, leaf = path.split("/")
        for part in parents:
            node, args = node.setdefault(part, {}), args.setdefault(part, {})
        node[leaf], args[leaf] = 0, ocp.RestoreArgs(restore_type=np.ndarray)
    restored = ocp.PyTreeCheckpointer().restore(
        pytree_dir, args=ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True)
    )
    return tree_paths(restored)


def parameter_arrays(saved: dict[str, tuple]) -> tuple[str, dict[str, tuple]]:
    """The checkpoint's parameters: the fp32 master copy when it has one, else the params."""
    prefix = "opt_state/master/" if any(p.startswith("opt_state/master/") for p in saved) else "params/"
    return prefix, {p[len(prefix) :]: v for p, v in saved.items() if p.startswith(prefix)}


def export_checkpoint(run_dir: str | Path, out: str | Path, step: int | None = None, dtype: str = "float32") -> dict[str, Any]:
    """Write one checkpoint's parameters to ``out`` as safetensors; returns what was written."""
    if dtype not in EXPORT_DTYPES:
        raise ConfigError("--dtype", f"must be one of {', '.join(EXPORT_DTYPES)}, got {dtype!r}")
    out = Path(out)
    if out.exists():
        raise ConfigError("--out", f"{out} exists; not overwritten")
    if not out.parent.is_dir():
        raise ConfigError("--out", f"folder {out.parent} does not exist")
    checkpoints = RunCheckpoints(run_dir, read_only=True)
    steps = checkpoints.steps()
    checkpoints.close()  # only its listing is needed; the tensors are read one by one below
    if not steps:
        raise ConfigError(str(run_dir), "holds no committed checkpoint")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise ConfigError("--step", f"no committed checkpoint at step {step} (committed: {', '.join(map(str, steps))})")
    state_dir = checkpoints.step_dir(step) / "state"
    tmp = out.with_name(out.name + ".partial")
    try:
        prefix, params = parameter_arrays(array_metadata(state_dir))
        if not params:
            raise ConfigError(str(state_dir), "holds no parameters")
        tensors = [(name, params[name][0], dtype) for name in sorted(params)]
        meta = {"format": "pt", "producer": "jzero", "step": str(step), "source": prefix.rstrip("/")}
        written = write_safetensors(tmp, tensors, lambda name: restore_numpy(state_dir, [prefix + name])[prefix + name], meta)
        _check_written(tmp, tensors, written)
        os.replace(tmp, out)
    except ConfigError:
        raise
    except Exception as err:  # tensorstore raises plain Exceptions for unreadable data
        raise ConfigError(str(checkpoints.step_dir(step)), f"is unreadable ({error_line(err)})") from None
    finally:
        tmp.unlink(missing_ok=True)
    source = prefix.rstrip("/")
    return {"step": step, "source": source, "tensors": len(tensors), "bytes": written, "out": str(out), "dtype": dtype}


def _check_written(path: Path, tensors: list[tuple[str, tuple[int, ...], str]], written: int) -> None:
    """Every tensor is in the file with its shape, and the file has every byte: never partial."""
    header, _ = safetensors_header(path)
    wrong = [n for n, shape, _ in tensors if n not in header or tuple(header[n]["shape"]) != tuple(shape)]
    if len(header) != len(tensors) or wrong or path.stat().st_size != written:
        found = f"{len(header)} of {len(tensors)} tensors; wrong: {wrong[:3]}"
        raise ConfigError(str(path), f"does not match the checkpoint ({found})")


# ---------------------------------------------------------------------------------------------
# Parameters to start from


def load_params(path: str | Path) -> dict[str, np.ndarray]:
    """``/``-joined parameter paths -> host arrays, from any of the formats the module names."""
    path = Path(path)
    key = "train.init_from"
    if not path.exists():
        raise ConfigError(key, f"{path} does not exist")
    if path.is_file() and path.suffix == ".safetensors":
        return read_safetensors(path)
    if path.is_file() and path.suffix == ".msgpack":
        from flax import serialization

        try:
            tree = serialization.msgpack_restore(path.read_bytes())
        except Exception as err:
            raise ConfigError(key, f"{path} is not a Flax msgpack file ({type(err).__name__})") from None
        return _strip_params(tree_paths(tree))
    if path.is_dir():
        state_dir = path / "state" if (path / "state").is_dir() else path
        try:
            saved = array_metadata(state_dir)
        except Exception as err:
            raise ConfigError(key, f"{path} is not a readable Orbax checkpoint ({type(err).__name__})") from None
        if state_dir != path:  # a jzero checkpoint step: its (master) parameters
            prefix, params = parameter_arrays(saved)
            arrays = restore_numpy(state_dir, [prefix + p for p in params])
            return {p[len(prefix) :]: a for p, a in arrays.items()}
        return _strip_params(restore_numpy(path))
    raise ConfigError(key, f"{path}: expected a .safetensors or .msgpack file, or an Orbax checkpoint folder")


def _strip_params(flat: dict[str, Any]) -> dict[str, Any]:
    """Accept ``{"params": {...}}`` (a Flax variables dict) as well as the params tree itself."""
    if flat and all(p.startswith("params/") for p in flat):
        return {p[len("params/") :]: v for p, v in flat.items()}
    return flat


def match_params(loaded: dict[str, np.ndarray], expected: dict[str, tuple[int, ...]], source: str) -> None:
    """Refuse parameters whose names or shapes are not the model's, listing what differs."""
    lines = [f"{p}: missing" for p in expected if p not in loaded]
    lines += [f"{p}: not in this model" for p in loaded if p not in expected]
    lines += [
        f"{p}: shape {list(loaded[p].shape)}, the model has {list(expected[p])}"
        for p in expected
        if p in loaded and tuple(loaded[p].shape) != tuple(expected[p])
    ]
    if lines:
        more = f"; and {len(lines) - 4} more" if len(lines) > 4 else ""
        raise ConfigError("train.init_from", f"{source} does not fit the model: {'; '.join(lines[:4])}{more}")
