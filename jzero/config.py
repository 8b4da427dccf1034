"""Typed run configuration: YAML files plus dotted ``--set`` overrides.

Loading never imports JAX, so the CLI can read ``runtime.cpu_devices`` before JAX starts.
Every problem is raised as one :class:`ConfigError` that names the dotted key.
"""

from __future__ import annotations

import dataclasses
import math
import re
import reprlib
import types
import typing
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A bad config value, file or flag. ``str(err)`` is one line naming the key."""

    def __init__(self, key: str, message: str):
        self.key = key
        text = f"{key}: {message}" if key else message
        super().__init__(" ".join(text.splitlines()))  # one line even when a path or value holds a newline


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple, _REPR.maxset = 3, 4, 4, 4, 4
_REPR.maxstring, _REPR.maxlong, _REPR.maxother = 60, 40, 60


def show_value(value: Any, limit: int = 80) -> str:
    """A value's repr for an error message, at most about ``limit`` characters.

    The repr is built by a bounded walk (``reprlib``): a few hundred bytes of YAML aliases can
    expand to a value whose full repr is megabytes, and building it would be the problem itself.
    """
    return clip(_REPR.repr(value), limit)


def clip(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters, marked with ``...`` when cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclasses.dataclass
class MeshConfig:
    """Mesh axes in order, name -> size; one size may be -1 ("all remaining devices")."""

    axes: dict[str, int] = dataclasses.field(default_factory=lambda: {"data": -1, "model": 1})
    # How many ways each axis spans hosts (MaxText's dcn split); the rest of it stays within a host.
    dcn: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RunConfig:
    dir: str = "runs/default"
    log_every: int = 10


@dataclasses.dataclass
class ZeroConfig:
    stage: int = 0


@dataclasses.dataclass
class ModelConfig:
    name: str = "gpt"
    vocab_size: int = 256
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: int = 4
    seq_len: int = 128
    remat: bool = True
    tie_embeddings: bool = False


@dataclasses.dataclass
class OptimizerConfig:
    name: str = "adamw"  # adamw, adam, adafactor, lion or sgd (momentum b1)
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    schedule: str = "constant"  # constant or cosine (to min_lr_ratio x learning_rate at train.steps)
    warmup_steps: int = 0  # linear warmup from 0
    min_lr_ratio: float = 0.1
    clip_norm: float | None = None  # clip by the global gradient norm


@dataclasses.dataclass
class TrainConfig:
    steps: int = 100
    global_batch_size: int = 32
    nonfinite: str = "skip"  # a NaN/Inf gradient: skip the step, or halt naming it
    microbatches: int = 1  # gradient accumulation: slices of the global batch run in sequence
    init_from: str | None = None  # start from exported (.safetensors) or plain Flax (.msgpack, Orbax dir) params


@dataclasses.dataclass
class CheckpointConfig:
    """Orbax checkpoints under ``<run.dir>/checkpoints``. ``async_`` is spelled ``async`` in YAML."""

    every: int = 100  # save every N steps (0: only at the end and on preemption)
    keep: int = 3  # committed checkpoints kept, newest first
    async_: bool = True  # write in the background; the loop blocks only for the device-to-host copy


@dataclasses.dataclass
class PrecisionConfig:
    param_dtype: str = "float32"  # the working parameters: float32, bfloat16 or float16
    compute_dtype: str | None = None  # activations and matmuls; None: param_dtype
    master_dtype: str = "float32"  # kept with the optimizer state when params are narrower
    grad_reduce_dtype: str | None = None  # dtype gradients are reduced in; None: param_dtype
    loss_scale: float = 32768.0  # initial dynamic loss scale (used when anything is float16)
    loss_scale_window: int = 1000  # finite steps before the scale doubles


@dataclasses.dataclass
class DataConfig:
    """``path`` is a file, a folder or a glob; None means the Python stdlib's own sources."""

    path: str | None = None
    max_bytes: int = 8_000_000


@dataclasses.dataclass
class RuntimeConfig:
    cpu_devices: int = 8


def default_rules(axis_names) -> list[list]:
    """Megatron-style defaults: heads, MLP hidden and vocabulary on ``model``; the batch on
    ``data`` (and ``replica`` when the mesh has one); everything else unsharded by the rules."""
    batch = ["replica", "data"] if "replica" in axis_names else "data"
    return [
        ["batch", batch],
        ["vocab", "model"],
        ["embed", None],
        ["heads", "model"],
        ["kv", None],
        ["mlp", "model"],
        ["layers", None],
        ["length", None],
    ]


@dataclasses.dataclass
class PartitioningConfig:
    """``rules``: ordered ``[logical_name, mesh_axis | [axes] | null]`` pairs, the first match wins;
    None means :func:`default_rules` for the mesh."""

    rules: list[list[str | list[str] | None]] | None = None
    # ``[regex, [mesh_axis_or_null per dim]]``: place parameters by path, e.g. an unannotated model's.
    path_rules: list[list[str | list[str | None]]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Config:
    seed: int = 0
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    zero: ZeroConfig = dataclasses.field(default_factory=ZeroConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    precision: PrecisionConfig = dataclasses.field(default_factory=PrecisionConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)
    partitioning: PartitioningConfig = dataclasses.field(default_factory=PartitioningConfig)

    def to_dict(self) -> dict[str, Any]:
        """The YAML-shaped mapping: keywords such as ``async`` lose their field's trailing ``_``."""
        return _yaml_names(dataclasses.asdict(self))


def _yaml_names(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k.removesuffix("_") if k.isidentifier() and k.endswith("_") else k: _yaml_names(v) for k, v in tree.items()}
    return tree


KNOWN_MESH_AXES = ("replica", "data", "model")
OPTIMIZERS = ("adamw", "adam", "adafactor", "lion", "sgd")
SCHEDULES = ("constant", "cosine")
DTYPE_NAMES = ("float32", "bfloat16", "float16")
EXPORT_DTYPES = ("float32", "bfloat16")  # what ``jzero checkpoint export --dtype`` writes

# JAX runs with 32-bit integers (jax_enable_x64 is off): token ids, positions, optax's step count and
# the loss scale's step counter are int32, so every size and count that reaches JAX stays below 2**31.
MAX_INT32 = 2**31 - 1
# Parameter counts are exact as floats below 2**53 (the ledger and the estimate use floats), and
# 16 bytes per parameter (fp32 Adam) x 2**53 = 2**57 stays inside int64 byte counts.
MAX_PARAMS = 2**53
MAX_SEED = 2**32 - 1  # grain's shuffle takes a uint32 seed (jax.random.key takes more)
MAX_FLOAT32 = 3.4028234663852886e38  # the loss scale is a float32
# Simulated CPU devices cost host memory and start-up time each: 4096 took 0.6 GB and 3 s here,
# 65536 took 10 GB and aborted after 200 s. No test mesh needs more.
MAX_CPU_DEVICES = 4096
MAX_YAML_BYTES = 1 << 20  # configs are a few KB; a bigger file is the wrong path (data, a checkpoint)


# ---------------------------------------------------------------------------------------------
# Reading files and overrides


def _read_yaml(path: Path, key: str) -> Any:
    """A YAML file's content; every way reading it can fail is one ConfigError naming ``key`` and the path."""
    try:
        if path.is_dir():
            raise ConfigError(key, f"{path} is a directory, not a YAML file")
        if not path.exists():
            raise ConfigError(key, f"file not found: {path}")
        if not path.is_file():  # a FIFO or a device would block or never end
            raise ConfigError(key, f"{path} is not a regular file")
        with open(path, "rb") as f:
            data = f.read(MAX_YAML_BYTES + 1)
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
        raise ConfigError(key, f"cannot read {path}: {getattr(err, 'strerror', None) or err}") from None
    if len(data) > MAX_YAML_BYTES:
        raise ConfigError(key, f"{path} is over {MAX_YAML_BYTES >> 20} MiB; a config is a small YAML file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ConfigError(key, f"{path} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})") from None
    try:
        return yaml.safe_load(text)
    except RecursionError:
        raise ConfigError(key, f"{path} is nested too deeply to read") from None
    except Exception as err:  # also YAML Python cannot build: the date 2001-13-01, a 5000-digit int
        mark, problem = getattr(err, "problem_mark", None), getattr(err, "problem", None)
        detail = f"line {mark.line + 1}: {problem}" if mark and problem else (str(err).strip() or type(err).__name__)
        raise ConfigError(key, f"{path} is not valid YAML ({clip(detail.splitlines()[0])})") from None


def parse_override(text: str) -> tuple[str, Any]:
    """``"a.b=3"`` -> ``("a.b", 3)``; the value is read as a YAML scalar."""
    if "=" not in text:
        raise ConfigError("--set", f"expected KEY=VALUE, got {show_value(text)}")
    key, _, raw = text.partition("=")
    key = key.strip()
    if not key:
        raise ConfigError("--set", f"empty key in {show_value(text)}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except RecursionError:
        raise ConfigError(key, "value is nested too deeply to read") from None
    except Exception:  # not YAML, or YAML Python cannot build (the date 2001-13-01): the text itself
        value = raw
    return key, value


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    node = tree
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(".".join(parts[: i + 1]), "is a value, not a section")
        node = child
    node[parts[-1]] = value


def _resolve_mesh(raw: dict[str, Any], base: Path) -> None:
    """A ``mesh:`` that is a string names a mesh file, relative to the config file's folder."""
    if isinstance(raw.get("mesh"), str):
        mesh_path = base / raw["mesh"]
        mesh = _read_yaml(mesh_path, "mesh")
        if not isinstance(mesh, dict):
            raise ConfigError("mesh", f"{mesh_path} must hold a mapping with 'axes:'")
        raw["mesh"] = mesh


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML config (or the defaults when ``path`` is None) and apply ``KEY=VALUE`` overrides.

    A ``mesh:`` that is a string, in the file or from ``--set mesh=...``, names a mesh file relative
    to the config file's folder (the working directory when there is no file).
    """
    raw: dict[str, Any] = {}
    base = Path.cwd()
    if path is not None:
        path = Path(path)
        loaded = _read_yaml(path, "config")
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError("config", f"{path} must hold a mapping of sections")
        raw = loaded
        base = path.parent
    for item in overrides or []:
        key, value = parse_override(item)
        _resolve_mesh(raw, base)  # so that mesh.axes.* overrides apply inside a named mesh file
        _set_dotted(raw, key, value)
    _resolve_mesh(raw, base)
    return from_dict(raw)


# ---------------------------------------------------------------------------------------------
# Typed conversion and validation


def _coerce(value: Any, hint: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        inner = [o for o in options if o is not type(None)]
        if len(inner) > 1:  # e.g. str | list[str]: pick by the value's own shape
            by_kind = [o for o in inner if (typing.get_origin(o) is list) == isinstance(value, list)]
            inner = by_kind or inner
        return _coerce(value, inner[0], key)
    if dataclasses.is_dataclass(hint):
        if value is None:
            return hint()
        if not isinstance(value, dict):
            raise ConfigError(key, f"must be a section (mapping), got {show_value(value)}")
        return _build(hint, value, key)
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(key, f"must be true or false, got {show_value(value)}")
    if hint is int:
        return _integer(value, key)
    if hint is float:
        return _finite(value, key)
    if hint is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(key, f"must be a string, got {show_value(value)}")
        return str(value)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, f"must be a mapping, got {show_value(value)}")
        _, val_hint = typing.get_args(hint)
        return {str(k): _coerce(v, val_hint, f"{key}.{_name(k)}") for k, v in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(key, f"must be a list, got {show_value(value)}")
        (item_hint,) = typing.get_args(hint)
        return [_coerce(v, item_hint, f"{key}[{i}]") for i, v in enumerate(value)]
    raise TypeError(f"unsupported config type {hint!r} at {key}")


def _integer(value: Any, key: str) -> int:
    """An int from an int, an integral float or text (YAML 1.1 reads ``1e3`` as text); never past int64."""
    number: Any = value
    if isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:  # "1e3", or more digits than Python converts
            digits = value.strip().lstrip("+-").isdigit()
            try:
                number = 2**63 if digits else float(value)
            except ValueError:
                number = None
    if isinstance(number, float) and math.isfinite(number) and number.is_integer():
        number = int(number)
    if isinstance(number, bool) or not isinstance(number, int):
        raise ConfigError(key, f"must be an integer, got {show_value(value)}")
    if not -(2**63) <= number < 2**63:
        raise ConfigError(key, f"is out of range (more than 64 bits), got {show_value(value)}")
    return number


def _finite(value: Any, key: str) -> float:
    """A finite float: no config number means anything as NaN or infinity."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(key, f"must be a number, got {show_value(value)}")
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(key, f"must be a number, got {show_value(value)}") from None
    except OverflowError:  # an int beyond any float
        number = math.inf
    if not math.isfinite(number):
        raise ConfigError(key, f"must be a finite number, got {show_value(value)}")
    return number


def _name(key: Any) -> str:
    """A mapping key as it appears in a dotted error key, cut short."""
    return clip(key) if isinstance(key, str) else show_value(key)


def _build(cls: type, raw: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name.removesuffix("_"): f.name for f in dataclasses.fields(cls)}  # YAML name -> field
    kwargs = {}
    for name, value in raw.items():
        key = f"{prefix}.{_name(name)}" if prefix else _name(name)
        if name not in fields:
            raise ConfigError(key, f"unknown key (known: {', '.join(sorted(fields))})")
        kwargs[fields[name]] = _coerce(value, hints[fields[name]], key)
    return cls(**kwargs)


def from_dict(raw: dict[str, Any]) -> Config:
    """Build and validate a :class:`Config` from a plain (YAML-shaped) mapping."""
    config = _build(Config, raw, "")
    validate(config)
    return config


def _in_range(value: float, key: str, low: float, high: float, *, open_low: bool = False, open_high: bool = False) -> None:
    """``low <= value <= high`` (or strictly, per end); written so that NaN fails too."""
    above = value > low if open_low else value >= low
    below = value < high if open_high else value <= high
    if not (above and below):
        ends = f"{'(' if open_low else '['}{_num(low)}, {_num(high)}{')' if open_high else ']'}"
        want = f">= {_num(low)}" if high == math.inf and not open_low else f"in {ends}"
        raise ConfigError(key, f"must be {want}, got {_num(value)}")


def _positive(value: float, key: str, high: float = MAX_INT32) -> None:
    if not 0 < value <= high:  # False for NaN too
        bound = "" if high == math.inf else f" and at most {_num(high)}"
        raise ConfigError(key, f"must be positive{bound}, got {_num(value)}")


def _num(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def _param_count(m: ModelConfig) -> int:
    """The GPT's parameter count, to the leading terms: embedding and head, then per layer the
    attention (4 d^2) and MLP (2 r d^2) kernels."""
    return 2 * m.vocab_size * m.d_model + m.n_layers * (4 + 2 * m.mlp_ratio) * m.d_model**2


def check_batch_divides(global_batch_size: int, axes: dict[str, int], microbatches: int = 1) -> None:
    """The batch is split over ``data`` (and ``replica``), and each microbatch too."""
    ways = axes["data"] * axes.get("replica", 1)
    if global_batch_size % ways:
        name = "replica x data" if "replica" in axes else "data"
        raise ConfigError("train.global_batch_size", f"{global_batch_size} is not divisible by the {name} axis ({ways})")
    if global_batch_size % (ways * microbatches):
        raise ConfigError(
            "train.microbatches",
            f"{microbatches} microbatches of the {global_batch_size}-row batch do not split evenly over {ways} devices",
        )


def validate(config: Config) -> None:
    """Checks that need no devices; mesh-vs-device checks live in :mod:`jzero.mesh`.

    Every number is checked for range (floats are finite already): a value a run cannot use is
    refused here, naming its key, rather than failing deep inside JAX.
    """
    _in_range(config.seed, "seed", 0, MAX_SEED)
    axes = config.mesh.axes
    if not axes:
        raise ConfigError("mesh.axes", "must name at least the 'data' axis")
    for name, size in axes.items():
        if name not in KNOWN_MESH_AXES:
            raise ConfigError(f"mesh.axes.{name}", f"unknown axis (known: {', '.join(KNOWN_MESH_AXES)})")
        if size == 0 or size < -1 or size > MAX_INT32:
            raise ConfigError(f"mesh.axes.{name}", f"size must be positive (at most {MAX_INT32}) or -1, got {size}")
    for name, ways in config.mesh.dcn.items():
        if name not in axes:
            raise ConfigError(f"mesh.dcn.{name}", f"is not a mesh axis (axes: {', '.join(axes)})")
        _positive(ways, f"mesh.dcn.{name}")
        if axes[name] > 0 and axes[name] % ways:
            raise ConfigError(f"mesh.dcn.{name}", f"{ways} does not divide the axis size {axes[name]}")
    if "data" not in axes:
        raise ConfigError("mesh.axes", "must include the 'data' axis")
    if sum(1 for s in axes.values() if s == -1) > 1:
        raise ConfigError("mesh.axes", "only one axis size may be -1")
    axes.setdefault("model", 1)

    if config.zero.stage not in (0, 1, 2, 3):
        raise ConfigError("zero.stage", f"must be 0, 1, 2 or 3, got {config.zero.stage}")

    m = config.model
    if m.name != "gpt":
        raise ConfigError("model.name", f"unknown model {show_value(m.name)} (known: gpt)")
    for field in ("vocab_size", "d_model", "n_layers", "n_heads", "mlp_ratio", "seq_len"):
        _positive(getattr(m, field), f"model.{field}")
    if m.mlp_ratio * m.d_model > MAX_INT32:  # the MLP's hidden width is a dimension too
        raise ConfigError("model.mlp_ratio", f"the MLP width mlp_ratio x d_model = {m.mlp_ratio * m.d_model} is over {MAX_INT32}")
    if m.d_model % m.n_heads:
        raise ConfigError("model.n_heads", f"{m.n_heads} does not divide model.d_model={m.d_model}")
    if (m.d_model // m.n_heads) % 2:
        raise ConfigError("model.n_heads", f"head size d_model/n_heads={m.d_model // m.n_heads} must be even (rotary)")
    if m.vocab_size < 256:
        raise ConfigError("model.vocab_size", f"byte-level data needs at least 256, got {m.vocab_size}")
    if _param_count(m) > MAX_PARAMS:
        sizes = f"d_model={m.d_model}, n_layers={m.n_layers}, mlp_ratio={m.mlp_ratio}, vocab_size={m.vocab_size}"
        raise ConfigError("model", f"{sizes} make {_param_count(m):.3g} parameters, over the limit of 2**53 ({MAX_PARAMS:.3g})")

    o = config.optimizer
    if o.name not in OPTIMIZERS:
        raise ConfigError("optimizer.name", f"unknown optimizer {show_value(o.name)} (known: {', '.join(OPTIMIZERS)})")
    _positive(o.learning_rate, "optimizer.learning_rate", math.inf)
    _in_range(o.weight_decay, "optimizer.weight_decay", 0, math.inf, open_high=True)
    _in_range(o.b1, "optimizer.b1", 0, 1, open_high=True)  # decay rates: 1 would never forget, above it diverges
    _in_range(o.b2, "optimizer.b2", 0, 1, open_high=True)
    _positive(o.eps, "optimizer.eps", math.inf)
    _in_range(o.min_lr_ratio, "optimizer.min_lr_ratio", 0, 1)
    _in_range(o.warmup_steps, "optimizer.warmup_steps", 0, MAX_INT32)
    if o.schedule not in SCHEDULES:
        raise ConfigError("optimizer.schedule", f"unknown schedule {show_value(o.schedule)} (known: {', '.join(SCHEDULES)})")
    if o.clip_norm is not None:
        _positive(o.clip_norm, "optimizer.clip_norm", math.inf)
    if config.train.nonfinite not in ("skip", "halt"):
        raise ConfigError("train.nonfinite", f"must be skip or halt, got {show_value(config.train.nonfinite)}")
    pr = config.precision
    for field in ("param_dtype", "compute_dtype", "master_dtype", "grad_reduce_dtype"):
        value = getattr(pr, field)
        if value is not None and value not in DTYPE_NAMES:
            raise ConfigError(f"precision.{field}", f"unknown dtype {show_value(value)} (known: {', '.join(DTYPE_NAMES)})")
    if pr.master_dtype != "float32":
        raise ConfigError("precision.master_dtype", f"must be float32, got {show_value(pr.master_dtype)}")
    _positive(pr.loss_scale, "precision.loss_scale", MAX_FLOAT32)
    _positive(pr.loss_scale_window, "precision.loss_scale_window")

    _positive(config.train.steps, "train.steps")
    _positive(config.train.global_batch_size, "train.global_batch_size")
    _positive(config.train.microbatches, "train.microbatches")
    if axes["data"] > 0 and axes.get("replica", 1) > 0:
        check_batch_divides(config.train.global_batch_size, axes, config.train.microbatches)
    _positive(config.run.log_every, "run.log_every")
    if not 0 <= config.checkpoint.every <= MAX_INT32:
        raise ConfigError("checkpoint.every", f"must be >= 0 (0: only at the end), got {config.checkpoint.every}")
    _positive(config.checkpoint.keep, "checkpoint.keep")
    _positive(config.runtime.cpu_devices, "runtime.cpu_devices", MAX_CPU_DEVICES)
    _positive(config.data.max_bytes, "data.max_bytes", 2**63 - 1)

    for i, rule in enumerate(config.partitioning.path_rules):
        key = f"partitioning.path_rules[{i}]"
        if len(rule) != 2 or not isinstance(rule[0], str) or not isinstance(rule[1], list):
            raise ConfigError(key, f"must be [path_regex, [mesh_axis_or_null, ...]], got {show_value(rule)}")
        try:
            re.compile(rule[0])
        except (re.error, RecursionError, OverflowError) as err:
            raise ConfigError(key, f"bad regex {show_value(rule[0])}: {clip(str(err))}") from None
        for axis in rule[1]:
            if axis is not None and axis not in axes:
                raise ConfigError(key, f"names mesh axis {show_value(axis)}, which the mesh lacks")
    if config.partitioning.rules is None:
        config.partitioning.rules = default_rules(axes)
    for i, rule in enumerate(config.partitioning.rules):
        if len(rule) != 2 or not isinstance(rule[0], str):
            raise ConfigError(f"partitioning.rules[{i}]", f"must be [logical_name, mesh_axis_or_null], got {show_value(rule)}")
        targets = rule[1] if isinstance(rule[1], list) else [rule[1]]
        for axis in targets:
            if axis is not None and axis not in axes:
                raise ConfigError(f"partitioning.rules[{i}]", f"names mesh axis {show_value(axis)}, which the mesh lacks")


def dump_config(config: Config) -> str:
    """The resolved config as YAML, mesh inline, loadable by :func:`load_config`."""
    return yaml.safe_dump(config.to_dict(), sort_keys=False)
