"""Consolidated parameters out of and into jzero: the equivalent of DeepSpeed's ``zero_to_fp32``.

``export_checkpoint`` writes a run's parameters (the fp32 master copy when there is one) as one
safetensors file, streaming: each tensor is read from the sharded Orbax checkpoint as one host
array, written, and dropped, so memory holds one tensor at a time. The file is written under a
temporary name of its own (created new, beside ``--out``, never a file of yours), checked against
the checkpoint (every tensor, its shape and its byte count), and only then linked into place: an
export is never empty or partial, and never replaces a file.

``load_params`` reads parameters to start a run from (``train.init_from``): a safetensors file, a
Flax msgpack file (``flax.serialization.to_bytes``), an Orbax params checkpoint, or a jzero
checkpoint step folder. Names are ``/``-joined tree paths, as in ``jzero plan``.

Why safetensors is written and read here rather than by the ``safetensors`` package: its writers
take the whole dict of tensors at once, and the export exists to hold one tensor at a time; its
reader, ``safe_open``, copies each tensor into memory when read, where a memory map here keeps
``init_from`` lazy until each tensor is placed on its devices. The header is checked against the
format (and the file's size) first, so a damaged file is one line naming it. The tests read the
exports back with the safetensors package, and load files it wrote.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import struct
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from jzero.checkpoint.catalog import read_newest
from jzero.checkpoint.quiet import failure_reported, quiet_orbax
from jzero.checkpoint.runs import array_metadata, shape_differences
from jzero.checkpoint.verify import verify_step
from jzero.config.loading import load_config
from jzero.config.run_folder import RunDir
from jzero.config.schema import EXPORT_DTYPES
from jzero.dtypes import array_bytes, by_name
from jzero.errors import CheckpointError, ConfigError, checked_path, clip, error_line, path_error, show_value
from jzero.models.lora import adapted_kernels, adapter_paths, is_adapter, lora_spec, merged_kernel
from jzero.trees import tree_paths

__all__ = [
    "MAX_HEADER_BYTES",
    "NUMPY_DTYPES",
    "SAFETENSORS_DTYPES",
    "export_checkpoint",
    "load_params",
    "lora_scale",
    "match_params",
    "parameter_arrays",
    "read_safetensors",
    "restore_numpy",
    "restore_placed",
    "unreadable_step",
    "safetensors_header",
    "write_safetensors",
]

# The types jzero reads from and writes to safetensors, by numpy's name: their codes from jzero.dtypes.
SAFETENSORS_DTYPES = {name: by_name(name).safetensors for name in ("float32", "bfloat16", "float16", "float64", "int32", "int64")}
NUMPY_DTYPES = {code: np.dtype(jnp.dtype(name)) for name, code in SAFETENSORS_DTYPES.items()}
MAX_HEADER_BYTES = 100_000_000  # the safetensors reference reader's own limit


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
        size = array_bytes(shape, NUMPY_DTYPES[SAFETENSORS_DTYPES[dtype]])
        header[name] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format's recommended alignment
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name, shape, dtype in tensors:
            array = np.ascontiguousarray(produce(name), dtype=jnp.dtype(dtype))
            if array.shape != tuple(shape):
                raise CheckpointError(name, f"read shape {list(array.shape)}, expected {list(shape)}")
            f.write(array.tobytes())
    return 8 + len(raw) + offset


def safetensors_header(path: Path, key: str | None = None) -> tuple[dict[str, Any], int]:
    """The header (without ``__metadata__``) and where the data starts, checked before any use:
    the header's length fits the file, it is a JSON object, and the tensors' byte ranges match their
    shapes and dtypes and tile the data exactly, to the file's end (as the format requires). A fault
    raises one :class:`ConfigError` naming ``key`` (default: the path) and the path."""
    key = str(path) if key is None else key

    def bad(problem: str) -> ConfigError:
        return ConfigError(key, f"{path} is not a readable safetensors file: {problem}")

    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise bad(f"{size} bytes, less than the 8-byte header length")
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                raise bad(f"its header length {n} exceeds the {size - 8} bytes after it")
            if n > MAX_HEADER_BYTES:
                raise bad(f"its header length {n} is over the format's limit of {MAX_HEADER_BYTES} bytes")
            raw = f.read(n)
    except OSError as err:
        raise ConfigError(key, f"{path} cannot be read: {err.strerror or err}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise bad(f"the header is not UTF-8 JSON ({clip(str(err))})") from None
    if not isinstance(header, dict):
        raise bad("the header is not a JSON object")
    header.pop("__metadata__", None)
    start = 8 + n
    ranges = []
    for name, info in header.items():
        ranges.append((*_tensor_range(name, info, bad), name))
    end = 0
    for begin, stop, name in sorted(ranges):
        if begin != end:
            raise bad(f"tensor {clip(name)} starts at byte {begin} of the data, not at {end}: a gap or an overlap")
        end = stop
    if end != size - start:
        raise bad(f"the header describes {end} bytes of data, the file holds {size - start} (truncated or padded)")
    return header, start


def _tensor_range(name: str, info: Any, bad: Callable[[str], ConfigError]) -> tuple[int, int]:
    """A header entry's ``data_offsets``, after checking them against its dtype and shape."""
    what = f"tensor {clip(name)}"
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
        raise bad(f"{what}: expected dtype, shape and data_offsets, got {show_value(info)}")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if dtype not in NUMPY_DTYPES:
        raise bad(f"{what} has dtype {show_value(dtype)}; jzero reads {', '.join(NUMPY_DTYPES)}")

    def count(values: Any, length: int | None) -> bool:  # a list of non-negative JSON integers
        return (
            isinstance(values, list)
            and (length is None or len(values) == length)
            and all(type(v) is int and v >= 0 for v in values)
        )

    if not count(shape, None) or len(shape) > 32:  # numpy's own limit; it keeps math.prod below cheap
        raise bad(f"{what} has shape {show_value(shape)}; expected a list of at most 32 sizes")
    if not count(offsets, 2) or offsets[0] > offsets[1]:
        raise bad(f"{what} has data_offsets {show_value(offsets)}; expected [begin, end]")
    nbytes = array_bytes(shape, NUMPY_DTYPES[dtype])
    if offsets[1] - offsets[0] != nbytes:
        raise bad(f"{what}: {offsets[1] - offsets[0]} bytes for shape {show_value(shape)} of {dtype} ({nbytes} bytes)")
    return offsets[0], offsets[1]


def read_safetensors(path: Path, key: str | None = None) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file, memory-mapped (nothing is read until used); the header is
    checked first (:func:`safetensors_header`)."""
    header, start = safetensors_header(path, key)
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        dtype, shape = NUMPY_DTYPES[info["dtype"]], tuple(info["shape"])
        if end == begin:  # np.memmap cannot map zero bytes
            out[name] = np.zeros(shape, dtype)
        else:
            out[name] = np.memmap(path, dtype=dtype, mode="r", offset=start + begin, shape=shape)
    return out


# ---------------------------------------------------------------------------------------------
# Reading parts of an Orbax checkpoint as host arrays


def restore_numpy(pytree_dir: Path, paths: list[str] | None = None) -> dict[str, np.ndarray]:
    """A saved pytree's arrays as host arrays: all of them, or only ``paths`` (``/``-joined, each
    under nested dicts, as parameters are), reading nothing else."""
    quiet_orbax()
    if paths is None:
        tree = ocp.PyTreeCheckpointer().metadata(pytree_dir).item_metadata.tree
        restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
        return tree_paths(ocp.PyTreeCheckpointer().restore(pytree_dir, args=ocp.args.PyTreeRestore(restore_args=restore_args)))
    return _partial_restore(pytree_dir, {path: ocp.RestoreArgs(restore_type=np.ndarray) for path in paths})


def restore_placed(pytree_dir: Path, shardings: Mapping[str, jax.sharding.Sharding]) -> dict[str, jax.Array]:
    """Only the arrays ``shardings`` names (``/``-joined paths), each read straight into its
    sharding: every device reads its own shard, and no host holds a whole array."""
    quiet_orbax()
    return _partial_restore(pytree_dir, {path: ocp.ArrayRestoreArgs(sharding=s) for path, s in shardings.items()})


def _partial_restore(pytree_dir: Path, by_path: Mapping[str, Any]) -> dict[str, Any]:
    """The arrays at ``by_path``'s paths, each restored as its ``RestoreArgs`` says; nothing else is read."""
    item: dict[str, Any] = {}
    restore_args: dict[str, Any] = {}
    for path, how in by_path.items():
        node, args = item, restore_args
        *parents, leaf = path.split("/")
        for part in parents:
            node, args = node.setdefault(part, {}), args.setdefault(part, {})
        node[leaf], args[leaf] = 0, how
    restored = ocp.PyTreeCheckpointer().restore(
        pytree_dir, args=ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True)
    )
    return tree_paths(restored)


def parameter_arrays(saved: dict[str, tuple]) -> tuple[str, dict[str, tuple]]:
    """The checkpoint's parameters: the fp32 master copy when it has one, else the params."""
    prefix = "opt_state/master/" if any(p.startswith("opt_state/master/") for p in saved) else "params/"
    return prefix, {p[len(prefix) :]: v for p, v in saved.items() if p.startswith(prefix)}


def export_checkpoint(
    run_dir: str | Path,
    out: str | Path,
    step: int | None = None,
    dtype: str = "float32",
    warn: Callable[[str], None] = print,
    *,
    merge_lora: float | None = None,
) -> dict[str, Any]:
    """Write one checkpoint's parameters to ``out`` as one safetensors file: ``jzero checkpoint export``.

    The parameters are the fp32 master copy when the state has one (a 16-bit run), else the
    parameters, each named by its ``/``-joined tree path (``layers_0/attn/q/kernel``). Works on any
    run's checkpoints, ``jzero.train``'s or your own loop's (:class:`~jzero.checkpoint.runs.RunCheckpoints`).
    Memory holds one tensor at a time; the file is written under a temporary name beside ``out``
    and linked into place once checked, so it is never partial and never replaces a file.

    Args:
      run_dir: the run's folder (``<run_dir>/checkpoints/<step>/``).
      out: the ``.safetensors`` file to write; it must not exist, its folder must.
      step: the committed step to export (default: the newest).
      dtype: ``float32`` or ``bfloat16``.
      warn: told, in one line, of a step written before manifests (unverifiable).
      merge_lora: LoRA's scale (``alpha / rank``): each adapter is folded into its kernel,
        ``W + scale A B`` (:func:`jzero.models.lora.merged_adapters`), and not written itself.

    Returns:
      What was written: ``step``, ``source`` (``params`` or ``opt_state/master``), ``tensors``,
      ``bytes``, ``out`` and ``dtype``.

    Raises:
      ConfigError: ``dtype`` is not one of those, ``out`` exists, its folder does not or is a file,
        or it holds a NUL byte (named ``--dtype`` and ``--out``, the command's flags).
      OutputWriteError: the machine refused the write (a full disk, a read-only folder); nothing
        is left written.
      DamagedCheckpoint: the step's files are not what was written; nothing is written.
      CheckpointError: the run has no committed checkpoint, or the step holds no parameters.
    """
    if dtype not in EXPORT_DTYPES:
        raise ConfigError("--dtype", f"must be one of {', '.join(EXPORT_DTYPES)}, got {show_value(dtype)}")
    out = checked_path("--out", out)
    if out.exists():
        raise ConfigError("--out", f"{out} exists; not overwritten")
    if not out.parent.exists():  # one that is a file fails the write: "Not a directory"
        raise ConfigError("--out", f"folder {out.parent} does not exist")
    # A step the run's rotation deletes while it is read is exported from the new newest instead.
    return read_newest(run_dir, step, lambda step_dir: _export_step(step_dir, out, dtype, warn, merge_lora))


def _export_step(step_dir: Path, out: Path, dtype: str, warn: Callable[[str], None], merge: float | None) -> dict[str, Any]:
    """:func:`export_checkpoint` of one committed step folder."""
    step = int(step_dir.name)
    state_dir = step_dir / "state"
    verify_step(step_dir, warn)
    try:
        prefix, params = parameter_arrays(array_metadata(state_dir))
    except Exception as err:  # tensorstore raises plain Exceptions for unreadable data
        raise unreadable_step(step_dir, err) from None
    if not params:
        raise CheckpointError(str(state_dir), "holds no parameters")
    adapted = set(adapted_kernels(list(params))) if merge is not None else set()
    tensors = [(name, params[name][0], dtype) for name in sorted(params) if not (adapted and is_adapter(name))]
    meta = {"format": "pt", "producer": "jzero", "step": str(step), "source": prefix.rstrip("/")}

    def read(names: list[str]) -> dict[str, np.ndarray]:
        try:
            found = restore_numpy(state_dir, [prefix + n for n in names])
        except Exception as err:
            raise unreadable_step(step_dir, err) from None
        return {n: found[prefix + n] for n in names}

    def produce(name: str) -> np.ndarray:
        if name not in adapted:
            return read([name])[name]
        a, b = adapter_paths(name)
        saved = read([name, a, b])
        return np.asarray(merged_kernel(saved[name], saved[a], saved[b], merge))

    # From here an OSError is about --out (a full disk, a read-only folder): reading the checkpoint
    # raises CheckpointErrors naming it.
    tmp = None
    try:
        tmp = _new_temporary(out)
        written = write_safetensors(tmp, tensors, produce, meta)
        _check_written(tmp, tensors, written, out)
        _publish(tmp, out)
    except OSError as err:
        raise path_error("--out", out, err, "write") from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    source = prefix.rstrip("/")
    return {"step": step, "source": source, "tensors": len(tensors), "bytes": written, "out": str(out), "dtype": dtype}


def lora_scale(run_dir: str | Path) -> float:
    """The scale ``--merge-lora`` folds each adapter in with: ``alpha / rank`` of the run's
    ``config.yaml``.

    Raises:
      ConfigError: naming ``--merge-lora``: the run trained no adapters.
    """
    folder = RunDir(Path(run_dir))
    lora = lora_spec(load_config(folder.config).lora) if folder.config.is_file() else None
    if lora is None:
        raise ConfigError("--merge-lora", f"{run_dir} trained no adapters (its config.yaml has no lora.rank)")
    return lora.scale


def unreadable_step(step_dir: Path, err: Exception) -> CheckpointError:
    """The one line for a committed step whose arrays cannot be read (Orbax's leftovers quieted)."""
    failure_reported()
    return CheckpointError(str(step_dir), f"is unreadable ({error_line(err)})")


def _new_temporary(out: Path) -> Path:
    """A new, empty, hidden file beside ``out``: created exclusively under a random name, so it is
    never a file of yours, and with the mode ``out`` would get (mkstemp's would be 0600)."""
    while True:
        tmp = out.with_name(f".{out.name[:200]}.jzero-export-{secrets.token_hex(6)}")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue


def _publish(tmp: Path, out: Path) -> None:
    """Give the finished file its name, never over a file that appeared at ``out`` meanwhile."""
    try:
        os.link(tmp, out)  # fails if ``out`` exists, atomically
    except FileExistsError:
        raise ConfigError("--out", f"{out} exists; not overwritten") from None
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
            raise
        # A filesystem without hard links: check, then rename (a file appearing in between is lost).
        if out.exists():
            raise ConfigError("--out", f"{out} exists; not overwritten") from None
        os.replace(tmp, out)


def _check_written(path: Path, tensors: list[tuple[str, tuple[int, ...], str]], written: int, out: Path) -> None:
    """Every tensor is in the file ``path`` (to become ``out``) with its shape, and the file has
    every byte: never partial."""
    header, _ = safetensors_header(path, "--out")
    wrong = [n for n, shape, _ in tensors if n not in header or tuple(header[n]["shape"]) != tuple(shape)]
    if len(header) != len(tensors) or wrong or path.stat().st_size != written:
        found = f"{len(header)} of {len(tensors)} tensors; wrong: {show_value(wrong[:3])}"
        raise ConfigError("--out", f"writing {out} failed: the file read back does not match the checkpoint ({found})")


# ---------------------------------------------------------------------------------------------
# Parameters to start from


def load_params(path: str | Path) -> dict[str, np.ndarray]:
    """``/``-joined parameter paths -> host arrays, from any of the formats the module names. Every
    fault, from a missing file to a damaged one, is one :class:`ConfigError` naming ``train.init_from``."""
    path = Path(path)
    key = "train.init_from"
    try:
        if not path.exists():
            raise ConfigError(key, f"{path} does not exist")
        if path.is_file() and path.suffix == ".safetensors":
            return read_safetensors(path, key)
        if path.is_file() and path.suffix == ".msgpack":
            return _read_msgpack(path, key)
        if path.is_dir():
            return _read_orbax(path, key)
    except OSError as err:
        raise ConfigError(key, f"{path} cannot be read: {err.strerror or err}") from None
    raise ConfigError(key, f"{path}: expected a .safetensors or .msgpack file, or an Orbax checkpoint folder")


def _read_msgpack(path: Path, key: str) -> dict[str, Any]:
    from flax import serialization

    data = path.read_bytes()
    try:
        tree = serialization.msgpack_restore(data)
    except Exception as err:
        raise ConfigError(key, f"{path} is not a Flax msgpack file ({type(err).__name__})") from None
    flat = tree_paths(tree) if isinstance(tree, dict) else {}
    others = [p for p, v in flat.items() if not isinstance(v, (np.ndarray, np.generic))]
    if not flat or others:
        raise ConfigError(key, f"{path} holds no tree of arrays (not arrays: {show_value(others or tree)})")
    return _strip_params(flat)


def _read_orbax(path: Path, key: str) -> dict[str, np.ndarray]:
    run = RunDir(path)
    newest = run.newest_committed_step()
    if newest is not None:  # a run folder: its newest committed step, as a resume would take
        path = run.checkpoints / str(newest)
    path = path.absolute()  # Orbax finds no metadata under a relative path (runs/x/checkpoints/2)
    state_dir = path / "state" if (path / "state").is_dir() else path
    try:
        saved = array_metadata(state_dir)
        if state_dir != path:  # a jzero checkpoint step: its (master) parameters
            prefix, params = parameter_arrays(saved)
            arrays = restore_numpy(state_dir, [prefix + p for p in params])
            return {p[len(prefix) :]: a for p, a in arrays.items()}
        return _strip_params(restore_numpy(path))
    except Exception as err:  # tensorstore and Orbax raise plain Exceptions for unreadable data
        raise ConfigError(key, f"{path} is not a readable Orbax checkpoint ({error_line(err)})") from None


def _strip_params(flat: dict[str, Any]) -> dict[str, Any]:
    """Accept ``{"params": {...}}`` (a Flax variables dict) as well as the params tree itself."""
    if flat and all(p.startswith("params/") for p in flat):
        return {p[len("params/") :]: v for p, v in flat.items()}
    return flat


_INIT_WORDS = {"missing": "missing", "extra": "not in this model", "shape": "shape {found}, the model has {want}"}


def match_params(loaded: dict[str, np.ndarray], expected: dict[str, tuple[int, ...]], source: str) -> None:
    """Refuse parameters whose names or shapes are not the model's, listing what differs."""
    found = {p: array.shape for p, array in loaded.items()}
    differ = shape_differences(found, expected, words=_INIT_WORDS)
    if differ:
        raise ConfigError("train.init_from", f"{source} does not fit the model: {differ}")
