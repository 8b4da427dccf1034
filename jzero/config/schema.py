"""What a run config is: :class:`Config`, the composition of its sections, each a frozen dataclass
with its keys' defaults, and the limits across them. A section that builds something lives beside it,
with its own ``check()`` and ``build()``: ``zero:`` in :mod:`jzero.sharding.stages`, ``optimizer:`` in
:mod:`jzero.optimizers`, ``precision:`` in :mod:`jzero.memory.config`, ``model:`` and ``lora:`` in
:mod:`jzero.models.config`, ``compiler:`` in :mod:`jzero.compiler.options`. The others are here. No
JAX and no I/O: :mod:`jzero.config.loading` reads a config from YAML and flags,
:mod:`jzero.config.validation` checks its values.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jzero.checks import MAX_INT32, PathText, at_least_zero, check_regex, check_regexes, positive
from jzero.compiler.options import CompilerConfig
from jzero.errors import ConfigError, show_value
from jzero.lazy import moved_names
from jzero.memory.config import PrecisionConfig
from jzero.models.config import LoraConfig, ModelConfig, RopeScalingConfig
from jzero.models.names import ADAPTERS
from jzero.optimizers import OptimizerConfig
from jzero.sharding.axes import DATA, KNOWN_MESH_AXES, MODEL, REPLICA, check_batch_divides
from jzero.sharding.stages import ZeroOptions

__getattr__ = moved_names(__name__, {
    "float32": "jzero.checks.float32", "SCHEDULES": "jzero.optimizers.SCHEDULES",
    "MAX_PARAMS": "jzero.checks.MAX_PARAMS", "DTYPE_NAMES": "jzero.dtypes.PRECISION_DTYPES",
})  # fmt: skip

__all__ = [
    "CheckpointConfig",
    "ClusterConfig",
    "CompilerConfig",
    "Config",
    "DataConfig",
    "MeshConfig",
    "ModelConfig",
    "OptimizerConfig",
    "PartitioningConfig",
    "PathText",
    "PrecisionConfig",
    "ProfileConfig",
    "RopeScalingConfig",
    "RunConfig",
    "RuntimeConfig",
    "TrainConfig",
    "ZeroConfig",
    "check_coordinator",
]



@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh axes in order, name -> size; one size may be -1 ("all remaining devices")."""

    axes: dict[str, int] = dataclasses.field(default_factory=lambda: {DATA: -1, MODEL: 1})
    # How many ways each axis spans processes (MaxText's dcn split; with one process per host, hosts);
    # the rest of it stays within a process.
    dcn: dict[str, int] = dataclasses.field(default_factory=dict)

    def check(self) -> None:
        """Known axes of positive sizes (one may be -1), ``data`` among them, each ``dcn`` split dividing its axis."""
        axes = self.axes
        if not axes:
            raise ConfigError("mesh.axes", f"must name at least the {DATA!r} axis")
        for name, size in axes.items():
            if name not in KNOWN_MESH_AXES:
                raise ConfigError(f"mesh.axes.{name}", f"unknown axis (known: {', '.join(KNOWN_MESH_AXES)})")
            if size == 0 or size < -1 or size > MAX_INT32:
                raise ConfigError(f"mesh.axes.{name}", f"size must be positive (at most {MAX_INT32}) or -1, got {size}")
        for name, ways in self.dcn.items():
            if name not in axes:
                raise ConfigError(f"mesh.dcn.{name}", f"is not a mesh axis (axes: {', '.join(axes)})")
            positive(ways, f"mesh.dcn.{name}")
            if axes[name] > 0 and axes[name] % ways:
                raise ConfigError(f"mesh.dcn.{name}", f"{ways} does not divide the axis size {axes[name]}")
        if DATA not in axes:
            raise ConfigError("mesh.axes", f"must include the {DATA!r} axis")
        if sum(1 for size in axes.values() if size == -1) > 1:
            raise ConfigError("mesh.axes", "only one axis size may be -1")




@dataclasses.dataclass(frozen=True)
class ProfileConfig:
    """``run.profile:``: a ``jax.profiler`` trace of steps ``start + 1`` to ``start + steps`` (the
    steps run after ``start`` steps are done) into ``<run.dir>/profile/``."""

    start: int = 10
    steps: int = 3


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """``run:``: the run folder (:class:`~jzero.config.run_folder.RunDir`) and what is logged there."""

    dir: PathText = "runs/default"
    log_every: int = 10
    tensorboard: bool = True  # scalars in <dir>/tensorboard/ (tensorboard --logdir runs/)
    profile: ProfileConfig | None = None  # none: no trace

    def check(self) -> None:
        positive(self.log_every, "run.log_every")
        if self.profile is not None:
            at_least_zero(self.profile.start, "run.profile.start")
            positive(self.profile.steps, "run.profile.steps")


# ``zero:`` is the one record of the ZeRO options, in the layer below (the plan takes it as it is).
ZeroConfig = ZeroOptions


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """``train:``: how long, on how big a batch, and what a non-finite gradient does."""

    steps: int = 100
    global_batch_size: int = 32
    nonfinite: str = "skip"  # a NaN/Inf gradient: skip the step, or halt naming it
    # Skipped steps in a row past which the run stops (exit status 4). None: 32 with fp16's dynamic
    # loss scale, which halves once per skipped step (2**15 to 1 is 15 in a row, so 32 finds a scale
    # from any start up to 2**32); 3 without one, where nothing but the batch changes between a skipped
    # step and the next (jzero.training.nonfinite.skip_limit).
    max_skipped_in_a_row: int | None = None
    microbatches: int = 1  # gradient accumulation: slices of the global batch run in sequence
    eval_every: int = 0  # validation loss every N steps and at the last step (0: never)
    eval_batches: int = 4  # global batches of the validation split, the same ones each time
    init_from: PathText | None = None  # start from exported (.safetensors) or plain Flax (.msgpack, Orbax dir) params
    # Path regexes (re.search) of the parameters that train; the rest are frozen: no gradient and no
    # optimizer state. None: all train (with lora.rank > 0: the adapters only).
    trainable: list[str] | None = None

    def check(self, axes: dict[str, int]) -> None:
        """The counts, and the batch over the mesh's batch ``axes`` (:func:`jzero.sharding.axes.check_batch_divides`)."""
        if self.nonfinite not in NONFINITE:
            raise ConfigError("train.nonfinite", f"must be skip or halt, got {show_value(self.nonfinite)}")
        positive(self.steps, "train.steps")
        positive(self.global_batch_size, "train.global_batch_size")
        positive(self.microbatches, "train.microbatches")
        if self.max_skipped_in_a_row is not None:  # None: jzero.training.nonfinite.skip_limit's default
            positive(self.max_skipped_in_a_row, "train.max_skipped_in_a_row")
        at_least_zero(self.eval_every, "train.eval_every")
        positive(self.eval_batches, "train.eval_batches")
        if axes[DATA] > 0 and axes.get(REPLICA, 1) > 0:  # a -1 axis is sized against the devices later
            check_batch_divides(self.global_batch_size, axes, self.microbatches)
        check_regexes(self.trainable or (), "train.trainable")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpoints under ``<run.dir>/checkpoints``. ``async_`` is spelled ``async`` in YAML."""

    every: int = 100  # save every N steps (0: only at the end and on preemption)
    keep: int = 3  # committed checkpoints kept, newest first
    async_: bool = True  # write in the background; the loop blocks only for the device-to-host copy

    def check(self) -> None:
        if not 0 <= self.every <= MAX_INT32:
            raise ConfigError("checkpoint.every", f"must be >= 0 (0: only at the end), got {self.every}")
        positive(self.keep, "checkpoint.keep")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """``data:``: byte-level text (``path``: a file, a folder or a glob; None means the Python stdlib's
    own sources) or a token folder written by ``jzero data prepare`` (``tokens``)."""

    path: PathText | None = None
    max_bytes: int = 8_000_000  # bytes read from ``path``
    tokens: PathText | None = None  # a ``jzero data prepare`` folder; then ``path`` and ``max_bytes`` are unused
    # The validation data, read as the training data is (files of bytes, or a token folder). None:
    # the token folder's own validation split, or for bytes the last windows, held out of training.
    eval_path: PathText | None = None

    def check(self) -> None:
        positive(self.max_bytes, "data.max_bytes", 2**63 - 1)
        if self.tokens is not None and self.path is not None:
            raise ConfigError("data.tokens", "give data.path (bytes) or data.tokens (a prepared folder), not both")


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """An explicit multi-process job: where process 0 serves JAX's coordinator, how many processes
    there are and which one this is."""

    coordinator: str = ""  # HOST:PORT
    num_processes: int = 1
    process_id: int = 0

    def check(self, keys: tuple[str, str, str] | None = None) -> None:
        """The coordinator, the process count and this process's index; ``keys`` name them in
        errors (default: ``runtime.distributed.*``)."""
        where, count, index = keys or tuple(f"runtime.distributed.{f}" for f in ("coordinator", "num_processes", "process_id"))
        check_coordinator(self.coordinator, where)
        positive(self.num_processes, count)
        if not 0 <= self.process_id < self.num_processes:
            last = self.num_processes - 1
            raise ConfigError(index, f"must be in [0, {last}] (num_processes={self.num_processes}), got {self.process_id}")


def check_coordinator(address: str, key: str) -> tuple[str, int]:
    """``HOST:PORT`` -> ``(host, port)``; anything else is refused naming ``key``."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(key, f"must be HOST:PORT with a port in 1-65535, got {show_value(address)}")
    return host.strip("[]"), int(port)


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """How this process runs: simulated CPU devices and the multi-process runtime (``jax.distributed``)."""

    cpu_devices: int = 8  # simulated CPU devices per process, when there is no accelerator
    # auto: jzero launch's variables or JAX's cluster detection (SLURM, Open MPI, Kubernetes...),
    # else one process. off: one process. A mapping: an explicit ClusterConfig.
    distributed: str | bool | ClusterConfig = "auto"
    initialization_timeout_s: int = 300  # how long every process waits for all to connect
    heartbeat_timeout_s: int = 60  # a process silent this long is lost: the others exit, naming it
    shutdown_timeout_s: int = 300  # how long the processes wait for each other at the end
    # JAX's persistent compilation cache: auto (~/.cache/jzero/jax), off, or a folder (jzero.compiler.cache).
    compilation_cache: PathText | bool = "auto"

    def check(self) -> None:
        positive(self.cpu_devices, "runtime.cpu_devices", MAX_CPU_DEVICES)
        for field in ("initialization_timeout_s", "heartbeat_timeout_s", "shutdown_timeout_s"):
            positive(getattr(self, field), f"runtime.{field}", MAX_TIMEOUT_S)
        if not isinstance(self.compilation_cache, str):  # a folder's text is the loader's (PathText)
            got = show_value(self.compilation_cache)
            raise ConfigError("runtime.compilation_cache", f"must be auto, off or a folder, got {got}")
        cluster = self.distributed
        if not isinstance(cluster, (str, bool)):
            cluster.check()
        elif cluster not in DISTRIBUTED_MODES:
            explicit = "{coordinator: HOST:PORT, num_processes: N, process_id: I}"
            raise ConfigError("runtime.distributed", f"must be auto, off or {explicit}, got {show_value(cluster)}")


@dataclasses.dataclass(frozen=True)
class PartitioningConfig:
    """``rules``: ordered ``[logical_name, mesh_axis | [axes] | null]`` pairs, the first match wins;
    None means the planner's defaults for the mesh (:func:`jzero.sharding.rules.default_rules`)."""

    rules: list[list[str | list[str] | None]] | None = None
    # ``[regex, [mesh_axis_or_null per dim]]``: place parameters by path, e.g. an unannotated model's.
    path_rules: list[list[str | list[str | None]]] = dataclasses.field(default_factory=list)

    def check(self, axes: dict[str, int]) -> None:
        """Each rule's form, its regex, and the mesh ``axes`` it names."""
        for i, rule in enumerate(self.path_rules):
            key = f"partitioning.path_rules[{i}]"
            if len(rule) != 2 or not isinstance(rule[0], str) or not isinstance(rule[1], list):
                raise ConfigError(key, f"must be [path_regex, [mesh_axis_or_null, ...]], got {show_value(rule)}")
            check_regex(rule[0], key)
            _names_mesh_axes(rule[1], axes, key)
        for i, rule in enumerate(self.rules or ()):
            key = f"partitioning.rules[{i}]"
            if len(rule) != 2 or not isinstance(rule[0], str):
                raise ConfigError(key, f"must be [logical_name, mesh_axis_or_null], got {show_value(rule)}")
            _names_mesh_axes(rule[1] if isinstance(rule[1], list) else [rule[1]], axes, key)


def _names_mesh_axes(names: list[str | None], axes: dict[str, int], key: str) -> None:
    for axis in names:
        if axis is not None and axis not in axes:
            raise ConfigError(key, f"names mesh axis {show_value(axis)}, which the mesh lacks")


@dataclasses.dataclass(frozen=True)
class Config:
    """A whole run config: one frozen dataclass per YAML section, each key with its default.

    Read one with :func:`jzero.load_config` (YAML and ``--set`` overrides, validated); ``to_dict``
    gives back the YAML-shaped mapping that ``config.yaml`` and checkpoints record.
    """

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
    lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)
    compiler: CompilerConfig = dataclasses.field(default_factory=CompilerConfig)

    def batch_shape(self) -> tuple[int, int]:
        """A global batch's shape: ``train.global_batch_size`` windows of ``model.seq_len + 1`` token
        ids (the inputs, and the targets one position on)."""
        return (self.train.global_batch_size, self.model.seq_len + 1)

    def trainable_patterns(self) -> tuple[str, ...] | None:
        """The path regexes of the parameters that train: ``train.trainable``, else LoRA's adapters
        (:data:`jzero.models.names.ADAPTERS`) when ``lora.rank`` is set, else None (all of them)."""
        if self.train.trainable is not None:
            return tuple(self.train.trainable)
        return ADAPTERS if self.lora.rank else None

    def to_dict(self) -> dict[str, Any]:
        """The YAML-shaped mapping: keywords such as ``async`` lose their field's trailing ``_``."""
        return _yaml_names(dataclasses.asdict(self))


def _yaml_names(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k.removesuffix("_") if k.isidentifier() and k.endswith("_") else k: _yaml_names(v) for k, v in tree.items()}
    return tree


EXPORT_DTYPES = ("float32", "bfloat16")  # what ``jzero checkpoint export --dtype`` writes
EXPORT_FORMATS = ("safetensors", "hf")  # what ``jzero checkpoint export --format`` writes: one file, or a Hugging Face folder


# grain's shuffle takes a uint32 seed, and jax.random.key keeps only the low 32 bits, so a larger
# seed would repeat a smaller one's keys (docs/design.md, "Facts behind the code").
MAX_SEED = 2**32 - 1
# Every float key reaches the step as a float32 (optax's hyperparameters, the schedule, the loss
# scale): a value must stay finite there, and a nonzero one must stay a normal number, as XLA on
# the CPU flushes subnormals to 0 (docs/design.md, "The CPU backend", "Subnormals are 0").
MAX_FLOAT32 = 3.4028234663852886e38
MIN_NORMAL_FLOAT32 = 2.0**-126
# Simulated CPU devices cost host memory and start-up time each; no test mesh needs more than this
# (docs/design.md, "The CPU backend", "Simulated devices cost memory and start-up").
MAX_CPU_DEVICES = 4096
NONFINITE = ("skip", "halt")  # what train.nonfinite may say
DISTRIBUTED_MODES = ("auto", "off")  # or an explicit ClusterConfig mapping
MAX_TIMEOUT_S = 7 * 24 * 3600  # a week: any longer is a typo
