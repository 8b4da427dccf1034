"""``jzero estimate``: per-device model-state memory at every stage, from the paper's formulas alone.

Nothing is built or compiled: the answer is (p + g + K)Ψ with the stage's parts over N_d, all over
N_m, where p and g are the parameter and gradient bytes and K the optimizer-state bytes per
parameter (the paper's Section 3 and Figure 1).
"""

from __future__ import annotations

import math
import re
from typing import Any

from jzero.checks import MAX_INT32, MAX_PARAMS
from jzero.errors import ConfigError, show_value
from jzero.records import omit_if_none, record
from jzero.sharding.stages import OFFLOADABLE, STAGES, paper_parts_per_device

__all__ = [
    "OPTIMIZER_STATE_BYTES",
    "PRECISIONS",
    "BytesPerParam",
    "Estimate",
    "EstimateRow",
    "HostParts",
    "bytes_per_param",
    "estimate",
    "format_estimate",
    "parse_count",
    "parse_memory",
]

# Bytes per parameter: (params, grads, optimizer state K). Mixed precision keeps 16-bit params and
# gradients and an fp32 master copy with the optimizer state (the paper's K = 12 for Adam).
PRECISIONS = ("mixed", "fp32")
# The optimizer's own fp32 state per parameter, bytes (the master copy comes on top in mixed precision).
# Not jzero.optimizers.OPTIMIZERS: these are the estimate's choices, with what each keeps.
OPTIMIZER_STATE_BYTES = {
    "adam": 8,  # momentum and variance
    "adafactor": 0,  # no momentum; factored second moments are O(rows + cols), not O(rows x cols)
    "sgd": 4,  # momentum
}
_SUFFIXES = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_MEMORY_UNITS = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


@record
class HostParts:
    """What an offload moves to pinned host memory, bytes per device.

    Attributes:
      optimizer: the optimizer state and master copy, where offloaded.
      params: the parameters, where offloaded.
      total: the two together.
    """

    optimizer: int | None = omit_if_none()
    params: int | None = omit_if_none()
    total: int = 0


@record
class EstimateRow:
    """One stage's model-state bytes per device, by the paper's formulas.

    Attributes:
      params: the parameters in device memory.
      grads: the gradients.
      optimizer: the optimizer state (with the master copy in mixed precision) in device memory.
      total: the three together, in device memory.
      host: with ``--offload``: what rests in pinned host memory.
      offloaded: with ``--offload``: the parts this stage can and does offload.
      fits: with ``--memory-per-device``: the device total within it.
    """

    params: int
    grads: int
    optimizer: int
    total: int
    host: HostParts | None = omit_if_none()
    offloaded: list[str] | None = omit_if_none()
    fits: bool | None = omit_if_none()


@record
class BytesPerParam:
    """Bytes per parameter: p, g and the optimizer state's K (the paper's Section 3).

    Attributes:
      params: p.
      grads: g.
      optimizer: K.
    """

    params: float
    grads: float
    optimizer: float


@record
class Estimate:
    """``jzero estimate``'s answer (its ``--json``).

    Attributes:
      params: Ψ, the parameter count.
      devices: the devices.
      data_parallel: N_d.
      model_parallel: N_m.
      precision: ``mixed`` or ``fp32``.
      optimizer: the optimizer whose state is counted.
      bytes_per_param: p, g and K.
      memory_per_device: the budget the rows are judged against, or None.
      offload: the parts asked to rest in host memory.
      stages: each stage's row, by stage number as text.
    """

    params: float
    devices: int
    data_parallel: int
    model_parallel: int
    precision: str
    optimizer: str
    bytes_per_param: BytesPerParam
    memory_per_device: float | None
    offload: list[str]
    stages: dict[str, EstimateRow]


def bytes_per_param(precision: str, optimizer: str) -> tuple[float, float, float]:
    """``(p, g, K)`` for a precision and optimizer."""
    if precision not in PRECISIONS:
        raise ConfigError("--precision", f"must be one of {', '.join(PRECISIONS)}, got {show_value(precision)}")
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ConfigError("--optimizer", f"must be one of {', '.join(OPTIMIZER_STATE_BYTES)}, got {show_value(optimizer)}")
    if precision == "mixed":
        return 2, 2, 4 + OPTIMIZER_STATE_BYTES[optimizer]
    return 4, 4, OPTIMIZER_STATE_BYTES[optimizer]


def parse_count(text: str, key: str = "--params") -> float:
    """``7.5e9``, ``7.5B``, ``350M``, ``124m`` -> a number of parameters."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*", str(text), re.IGNORECASE)
    if not match:
        raise ConfigError(key, f"expected a count like 7.5e9 or 7.5B, got {show_value(text)}")
    value = float(match.group(1)) * _SUFFIXES[match.group(2).lower()]
    _check_amount(value, text, key, "parameter", MAX_PARAMS)
    return value


def parse_memory(text: str, key: str = "--memory-per-device") -> float:
    """``80GB`` (10^9), ``80GiB`` (2^30), ``8e10`` (bytes) -> bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmgt]?i?b)?\s*", str(text), re.IGNORECASE)
    if not match:
        raise ConfigError(key, f"expected a size like 80GB or 80GiB, got {show_value(text)}")
    value = float(match.group(1)) * _MEMORY_UNITS[(match.group(2) or "b").lower()]
    _check_amount(value, text, key, "byte", math.inf)
    return value


def _check_amount(value: float, text: Any, key: str, unit: str, most: float) -> None:
    """A count of parameters or bytes: at least one, and finite (``1e400`` reads as infinity)."""
    if value == 0:
        raise ConfigError(key, f"must be positive, got {show_value(text)}")
    if not 1 <= value < math.inf:  # NaN fails too
        raise ConfigError(key, f"must be a finite number of at least 1 {unit}, got {show_value(text)}")
    if value > most:  # a config's model has the same limit
        raise ConfigError(key, f"must be at most {most:.3g} {unit}s, got {show_value(text)}")


def estimate(
    params: float,
    devices: int,
    model_parallel: int = 1,
    precision: str = "mixed",
    optimizer: str = "adam",
    memory_per_device: float | None = None,
    offload: tuple[str, ...] = (),
) -> Estimate:
    """Per-device model-state bytes for stages 0-3: each stage's :class:`EstimateRow` (device
    memory; with a memory size, whether it fits; with ``offload``, what rests in host memory).

    ``offload``: ``optimizer`` (stages 1-3, with the master copy) and/or ``params`` (stage 3), as
    ``zero.offload_optimizer`` and ``zero.offload_params`` do.
    """
    for part in offload:
        if part not in OFFLOADABLE:
            raise ConfigError("--offload", f"must be one of {', '.join(OFFLOADABLE)}, got {show_value(part)}")
    _check_amount(params, params, "--params", "parameter", MAX_PARAMS)
    if memory_per_device is not None:
        _check_amount(memory_per_device, memory_per_device, "--memory-per-device", "byte", math.inf)
    if devices < 1:
        raise ConfigError("--devices", f"must be positive, got {devices}")
    if devices > MAX_INT32:  # like every count in a config
        raise ConfigError("--devices", f"must be at most {MAX_INT32}, got {devices}")
    if model_parallel < 1 or devices % model_parallel:
        raise ConfigError("--model-parallel", f"{model_parallel} does not divide --devices {devices}")
    p, g, k = bytes_per_param(precision, optimizer)
    n_d = devices // model_parallel
    stages = {}
    for stage in STAGES:
        parts = paper_parts_per_device(params, stage, n_d, k=k, param_bytes=p, grad_bytes=g, n_m=model_parallel)
        stages[str(stage)] = _row({name: int(round(v)) for name, v in parts.items()}, stage, offload, memory_per_device)
    return Estimate(
        params=params,
        devices=devices,
        data_parallel=n_d,
        model_parallel=model_parallel,
        precision=precision,
        optimizer=optimizer,
        bytes_per_param=BytesPerParam(params=p, grads=g, optimizer=k),
        memory_per_device=memory_per_device,
        offload=list(offload),
        stages=stages,
    )


def _row(parts: dict[str, int], stage: int, offload: tuple[str, ...], memory_per_device: float | None) -> EstimateRow:
    """A stage's row: with ``offload``, the parts it can offload moved to the host (the rows keep
    their shape without it)."""
    moved = [part for part in OFFLOADABLE if part in offload and STAGES[stage].can_offload(part)]
    on_host = {part: parts[part] if part in moved else None for part in OFFLOADABLE}
    host = HostParts(optimizer=on_host["optimizer"], params=on_host["params"], total=sum(parts[p] for p in moved))
    on_device = {part: 0 if part in moved else parts[part] for part in ("params", "grads", "optimizer")}
    total = parts["total"] - host.total
    return EstimateRow(
        params=on_device["params"],
        grads=on_device["grads"],
        optimizer=on_device["optimizer"],
        total=total,
        host=host if offload else None,
        offloaded=moved if offload else None,
        fits=None if memory_per_device is None else total <= memory_per_device,
    )


def format_estimate(result: Estimate) -> str:
    """The estimate as ``jzero estimate`` prints it: a row per stage, in GB to the paper's 3 digits."""
    gb = 1e9
    b = result.bytes_per_param
    lines = [
        f"model states per device: Ψ = {result.params:,.0f} parameters, N_d = {result.data_parallel}, "
        f"N_m = {result.model_parallel}, {result.precision} precision, {result.optimizer} "
        f"({b.params:g} + {b.grads:g} + K={b.optimizer:g} bytes per parameter)",
        "",
        f"  {'stage':<6} {'partitioned':<16} {'params':>10} {'grads':>10} {'optimizer':>10} {'total':>10}"
        + (f" {'host':>10}  {'offloaded':<16}" if result.offload else "")
        + ("  fits" if result.memory_per_device else ""),
    ]
    for stage, row in result.stages.items():
        cells = " ".join(f"{n / gb:>7.3g} GB" for n in (row.params, row.grads, row.optimizer, row.total))
        if row.host is not None:
            cells += f" {row.host.total / gb:>7.3g} GB  {'+'.join(row.offloaded or ()) or '-':<16}"
        fits = "" if row.fits is None else "  yes" if row.fits else "  no"
        lines.append(f"  {stage:<6} {STAGES[int(stage)].partitioned:<16} {cells}{fits}")
    if result.offload:
        lines += ["", "params, grads, optimizer and total are device memory; host: pinned host memory per device"
                  " (optimizer offload at stages 1-3, parameter offload at stage 3)"]  # fmt: skip
    if result.memory_per_device:
        fitting = [s for s, row in result.stages.items() if row.fits]
        budget = f"{result.memory_per_device / gb:g} GB"
        lines += ["", f"fits in {budget} per device: " + (f"stages {', '.join(fitting)}" if fitting else "no stage")
                  + " (model states only; activations and temporaries come on top)"]  # fmt: skip
    return "\n".join(lines)
