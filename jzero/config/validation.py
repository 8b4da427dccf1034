"""What values a run config may hold: :func:`validate`, the checks that need no devices (the mesh
against the devices is :mod:`jzero.sharding.mesh`'s). Each refusal is one :class:`ConfigError` naming the key.
"""

from __future__ import annotations

import re

from jzero.checks import MAX_INT32, MAX_PARAMS, at_least_zero, check_regexes, in_range, positive
from jzero.config.schema import (
    DISTRIBUTED_MODES,
    MAX_CPU_DEVICES,
    MAX_SEED,
    MAX_TIMEOUT_S,
    CheckpointConfig,
    ClusterConfig,
    Config,
    DataConfig,
    MeshConfig,
    PartitioningConfig,
    RunConfig,
    RuntimeConfig,
    TrainConfig,
    ZeroConfig,
)
from jzero.errors import ConfigError, clip, show_value
from jzero.sharding.axes import DATA, KNOWN_MESH_AXES, REPLICA, check_batch_divides

__all__ = ["check_coordinator", "validate", "validate_cluster"]


def check_coordinator(address: str, key: str) -> tuple[str, int]:
    """``HOST:PORT`` -> ``(host, port)``; anything else is refused naming ``key``."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(key, f"must be HOST:PORT with a port in 1-65535, got {show_value(address)}")
    return host.strip("[]"), int(port)


def validate_cluster(cluster: ClusterConfig, keys: tuple[str, str, str] | None = None) -> None:
    """An explicit job's coordinator, process count and index; ``keys`` name them in errors
    (default: ``runtime.distributed.*``)."""
    where, count, index = keys or tuple(f"runtime.distributed.{f}" for f in ("coordinator", "num_processes", "process_id"))
    check_coordinator(cluster.coordinator, where)
    positive(cluster.num_processes, count)
    if not 0 <= cluster.process_id < cluster.num_processes:
        last = cluster.num_processes - 1
        raise ConfigError(index, f"must be in [0, {last}] (num_processes={cluster.num_processes}), got {cluster.process_id}")


def validate(config: Config) -> None:
    """Checks that need no devices; mesh-vs-device checks live in :mod:`jzero.sharding.mesh`.

    Every number is checked for range (floats are finite already): a value a run cannot use is
    refused here, naming its key, rather than failing deep inside JAX.

    Args:
      config: the whole run config.

    Raises:
      ConfigError: the first value a run cannot use, naming its key.
    """
    # One section after another, in this order: a config with several bad keys names the same one first.
    in_range(config.seed, "seed", 0, MAX_SEED)
    _check_mesh(config.mesh)
    _check_zero(config.zero, config.precision.master_copy, config.mesh.axes)
    config.model.check()
    config.optimizer.check()
    _check_nonfinite(config.train)  # before precision, the rest of train after it: the order it always had
    config.precision.check()
    _check_train(config.train, config.mesh.axes)
    _check_run(config.run)
    _check_checkpoint(config.checkpoint)
    _check_runtime(config.runtime)
    _check_data(config.data)
    _check_partitioning(config.partitioning, config.mesh.axes)
    config.lora.check(config.model.name)
    config.compiler.check()


def _check_mesh(mesh: MeshConfig) -> None:
    axes = mesh.axes
    if not axes:
        raise ConfigError("mesh.axes", f"must name at least the {DATA!r} axis")
    for name, size in axes.items():
        if name not in KNOWN_MESH_AXES:
            raise ConfigError(f"mesh.axes.{name}", f"unknown axis (known: {', '.join(KNOWN_MESH_AXES)})")
        if size == 0 or size < -1 or size > MAX_INT32:
            raise ConfigError(f"mesh.axes.{name}", f"size must be positive (at most {MAX_INT32}) or -1, got {size}")
    for name, ways in mesh.dcn.items():
        if name not in axes:
            raise ConfigError(f"mesh.dcn.{name}", f"is not a mesh axis (axes: {', '.join(axes)})")
        positive(ways, f"mesh.dcn.{name}")
        if axes[name] > 0 and axes[name] % ways:
            raise ConfigError(f"mesh.dcn.{name}", f"{ways} does not divide the axis size {axes[name]}")
    if DATA not in axes:
        raise ConfigError("mesh.axes", f"must include the {DATA!r} axis")
    if sum(1 for s in axes.values() if s == -1) > 1:
        raise ConfigError("mesh.axes", "only one axis size may be -1")


def _check_zero(zero: ZeroConfig, master_copy: bool, axes: dict[str, int]) -> None:
    zero.check(axes, master_copy=master_copy, error=ConfigError)
    in_range(zero.prefetch, "zero.prefetch", 0, MAX_INT32)
    in_range(zero.persist_below_bytes, "zero.persist_below_bytes", 0, MAX_PARAMS * 16)


def _check_nonfinite(train: TrainConfig) -> None:
    if train.nonfinite not in ("skip", "halt"):
        raise ConfigError("train.nonfinite", f"must be skip or halt, got {show_value(train.nonfinite)}")


def _check_train(train: TrainConfig, axes: dict[str, int]) -> None:
    """The step counts and the batch; ``nonfinite`` is :func:`_check_nonfinite`'s."""
    positive(train.steps, "train.steps")
    positive(train.global_batch_size, "train.global_batch_size")
    positive(train.microbatches, "train.microbatches")
    if train.max_skipped_in_a_row is not None:  # None: jzero.training.nonfinite.skip_limit's default
        positive(train.max_skipped_in_a_row, "train.max_skipped_in_a_row")
    at_least_zero(train.eval_every, "train.eval_every")
    positive(train.eval_batches, "train.eval_batches")
    if axes[DATA] > 0 and axes.get(REPLICA, 1) > 0:  # a -1 axis is sized against the devices later
        check_batch_divides(train.global_batch_size, axes, train.microbatches)
    check_regexes(train.trainable or (), "train.trainable")


def _check_run(run: RunConfig) -> None:
    positive(run.log_every, "run.log_every")
    if run.profile is not None:
        at_least_zero(run.profile.start, "run.profile.start")
        positive(run.profile.steps, "run.profile.steps")


def _check_checkpoint(checkpoint: CheckpointConfig) -> None:
    if not 0 <= checkpoint.every <= MAX_INT32:
        raise ConfigError("checkpoint.every", f"must be >= 0 (0: only at the end), got {checkpoint.every}")
    positive(checkpoint.keep, "checkpoint.keep")


def _check_runtime(runtime: RuntimeConfig) -> None:
    positive(runtime.cpu_devices, "runtime.cpu_devices", MAX_CPU_DEVICES)
    for field in ("initialization_timeout_s", "heartbeat_timeout_s", "shutdown_timeout_s"):
        positive(getattr(runtime, field), f"runtime.{field}", MAX_TIMEOUT_S)
    cache = runtime.compilation_cache
    if not isinstance(cache, str):  # a folder's text is the loader's (PathText)
        raise ConfigError("runtime.compilation_cache", f"must be auto, off or a folder, got {show_value(cache)}")
    cluster = runtime.distributed
    if isinstance(cluster, (str, bool)):
        if cluster not in DISTRIBUTED_MODES:
            raise ConfigError(
                "runtime.distributed",
                f"must be auto, off or {{coordinator: HOST:PORT, num_processes: N, process_id: I}}, got {show_value(cluster)}",
            )
        return
    validate_cluster(cluster)


def _check_data(data: DataConfig) -> None:
    positive(data.max_bytes, "data.max_bytes", 2**63 - 1)
    if data.tokens is not None and data.path is not None:
        raise ConfigError("data.tokens", "give data.path (bytes) or data.tokens (a prepared folder), not both")


def _check_partitioning(partitioning: PartitioningConfig, axes: dict[str, int]) -> None:
    for i, rule in enumerate(partitioning.path_rules):
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
    for i, rule in enumerate(partitioning.rules or ()):
        if len(rule) != 2 or not isinstance(rule[0], str):
            raise ConfigError(f"partitioning.rules[{i}]", f"must be [logical_name, mesh_axis_or_null], got {show_value(rule)}")
        targets = rule[1] if isinstance(rule[1], list) else [rule[1]]
        for axis in targets:
            if axis is not None and axis not in axes:
                raise ConfigError(f"partitioning.rules[{i}]", f"names mesh axis {show_value(axis)}, which the mesh lacks")
