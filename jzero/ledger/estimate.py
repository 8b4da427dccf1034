"""``jzero estimate``: per-device model-state memory at every stage, from the paper's formulas alone.

Nothing is built or compiled: the answer is (p + g + K)Ψ with the stage's parts over N_d, all over
N_m, where p and g are the parameter and gradient bytes and K the optimizer-state bytes per
parameter (the paper's Section 3 and Figure 1).
"""

from __future__ import annotations

import math
import re
from typing import Any

from jzero.config.schema import MAX_INT32, MAX_PARAMS
from jzero.errors import ConfigError, show_value
from jzero.sharding.stages import OFFLOADABLE, STAGES, paper_parts_per_device

__all__ = [
    "OPTIMIZER_STATE_BYTES",
    "PRECISIONS",
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
) -> dict[str, Any]:
    """Per-device model-state bytes for stages 0-3; ``stages["0"..."3"]`` each hold ``params``,
    ``grads``, ``optimizer``, ``total`` (device memory) and, with a memory size, ``fits`` (the
    device total within it). With ``offload``, also ``host`` (the offloaded parts' bytes per device,
    in pinned host memory) and ``offloaded`` (the parts this stage can offload).

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
        row: dict[str, Any] = {name: int(round(v)) for name, v in parts.items()}
        if offload:  # the rows keep their shape without --offload
            moved = [part for part in OFFLOADABLE if part in offload and STAGES[stage].can_offload(part)]
            row["host"] = {part: row[part] for part in moved}
            row["host"]["total"] = sum(row["host"].values())
            for part in moved:
                row[part] = 0
            row["total"] -= row["host"]["total"]
            row["offloaded"] = moved
        if memory_per_device is not None:
            row["fits"] = row["total"] <= memory_per_device
        stages[str(stage)] = row
    return {
        "params": params,
        "devices": devices,
        "data_parallel": n_d,
        "model_parallel": model_parallel,
        "precision": precision,
        "optimizer": optimizer,
        "bytes_per_param": {"params": p, "grads": g, "optimizer": k},
        "memory_per_device": memory_per_device,
        "offload": list(offload),
        "stages": stages,
    }


def format_estimate(result: dict[str, Any]) -> str:
    gb = 1e9
    b = result["bytes_per_param"]
    lines = [
        f"model states per device: Ψ = {result['params']:,.0f} parameters, N_d = {result['data_parallel']}, "
        f"N_m = {result['model_parallel']}, {result['precision']} precision, {result['optimizer']} "
        f"({b['params']:g} + {b['grads']:g} + K={b['optimizer']:g} bytes per parameter)",
        "",
        f"  {'stage':<6} {'partitioned':<16} {'params':>10} {'grads':>10} {'optimizer':>10} {'total':>10}"
        + (f" {'host':>10}  {'offloaded':<16}" if result.get("offload") else "")
        + ("  fits" if result["memory_per_device"] else ""),
    ]
    for stage, row in result["stages"].items():
        cells = " ".join(f"{row[k] / gb:>7.3g} GB" for k in ("params", "grads", "optimizer", "total"))  # the paper's 3 digits
        if result.get("offload"):
            cells += f" {row['host']['total'] / gb:>7.3g} GB  {'+'.join(row['offloaded']) or '-':<16}"
        fits = ("  yes" if row["fits"] else "  no") if "fits" in row else ""
        lines.append(f"  {stage:<6} {STAGES[int(stage)].partitioned:<16} {cells}{fits}")
    if result.get("offload"):
        lines += ["", "params, grads, optimizer and total are device memory; host: pinned host memory per device"
                  " (optimizer offload at stages 1-3, parameter offload at stage 3)"]  # fmt: skip
    if result["memory_per_device"]:
        fitting = [s for s, row in result["stages"].items() if row["fits"]]
        budget = f"{result['memory_per_device'] / gb:g} GB"
        lines += ["", f"fits in {budget} per device: " + (f"stages {', '.join(fitting)}" if fitting else "no stage")
                  + " (model states only; activations and temporaries come on top)"]  # fmt: skip
    return "\n".join(lines)
