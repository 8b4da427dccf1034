"""The step-time model: a compiled step's predicted time from its FLOPs, bytes and schedule.

A roofline in the JAX scaling book's manner (jax-ml/scaling-book, "rooflines"), one term per resource:

- **compute**: the matmul FLOPs the program executes per device (:func:`jzero.ledger.flops.program_flops`,
  remat's recomputation included) over the GPU's dense bf16 peak times one efficiency factor,
  :data:`EFFICIENCY`, calibrated once against published runs (docs/planner.md);
- **memory**: the bytes the optimizer update reads and writes (the model states per device, twice)
  over HBM bandwidth: elementwise work the matmul count leaves out;
- **communication**: each collective's bytes (the paper's accounting) times (n - 1) / n for its n
  devices, over its level's bandwidth: NVLink within a host, the GPU's NIC across hosts;
- **host transfers** (offload): the bytes that cross PCIe per step over its bandwidth, not hidden;
- **overlap**: an async collective the ledger shows with compute scheduled between its start and
  done is hidden up to that compute's time (:func:`jzero.ledger.flops.flops_between`); the rest of
  it, and every synchronous collective, adds to the step.

The step is compute + memory + exposed communication + host transfers. Nothing here runs JAX.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

__all__ = ["EFFICIENCY", "Hardware", "StepCost", "Transfer", "predict"]

# The share of the dense bf16 peak jzero's matmuls reach: one value for every target, chosen from
# the calibration table of published runs (docs/planner.md, benchmarks/calibration.py).
EFFICIENCY = 0.52


@dataclasses.dataclass(frozen=True)
class Hardware:
    """One GPU's figures, bytes and FLOPs per second (:mod:`jzero.ledger.targets` holds them with sources)."""

    peak_flops: float
    hbm_bytes_per_s: float
    within_host_bytes_per_s: float  # NVLink, per direction per GPU
    cross_host_bytes_per_s: float  # the GPU's NIC
    host_bytes_per_s: float  # PCIe, per direction


@dataclasses.dataclass(frozen=True)
class Transfer:
    """One collective's traffic per step, as one device sees it.

    Attributes:
      bytes: what it sends per step in the paper's accounting (all its runs).
      devices: the devices of each of its groups (n).
      cross_host: whether a group spans hosts.
      hiding_flops: the matmul FLOPs scheduled between its start and done (all its runs); None for a
        synchronous op or one with no compute between.
    """

    bytes: float
    devices: int
    cross_host: bool
    hiding_flops: float | None = None


@dataclasses.dataclass(frozen=True)
class StepCost:
    """What one compiled step asks of a device.

    Attributes:
      flops: matmul FLOPs executed per device (recomputation included).
      model_flops: the model's FLOPs per device (what MFU counts; no recomputation).
      tokens: tokens per step, all devices together.
      state_bytes: model-state bytes per device the optimizer update reads and writes.
      transfers: the collectives.
      host_bytes: bytes that cross PCIe per device per step.
    """

    flops: float
    model_flops: float
    tokens: int
    state_bytes: float = 0.0
    transfers: Sequence[Transfer] = ()
    host_bytes: float = 0.0


def _seconds(transfer: Transfer, hardware: Hardware) -> float:
    bandwidth = hardware.cross_host_bytes_per_s if transfer.cross_host else hardware.within_host_bytes_per_s
    n = max(transfer.devices, 1)
    return transfer.bytes * (n - 1) / n / bandwidth


def predict(cost: StepCost, hardware: Hardware, efficiency: float = EFFICIENCY) -> dict[str, Any]:
    """The predicted step time of ``cost`` on ``hardware``, with its terms.

    Args:
      cost: the step's FLOPs, bytes and collectives.
      hardware: the GPU's figures.
      efficiency: the share of the peak the matmuls reach.

    Returns:
      ``step_time_s``, ``tokens_per_sec``, ``mfu`` (model FLOPs over the step time at the peak), and
      the terms in seconds: ``compute_s``, ``memory_s``, ``communication_s`` (every collective, if
      none were hidden), ``exposed_communication_s``, ``host_transfer_s``; ``bound``: the largest term.
    """
    flops_per_s = hardware.peak_flops * efficiency
    compute = cost.flops / flops_per_s
    memory = 2 * cost.state_bytes / hardware.hbm_bytes_per_s
    total = exposed = 0.0
    for transfer in cost.transfers:
        seconds = _seconds(transfer, hardware)
        hidden = min(seconds, transfer.hiding_flops / flops_per_s) if transfer.hiding_flops else 0.0
        total += seconds
        exposed += seconds - hidden
    host = cost.host_bytes / hardware.host_bytes_per_s
    step = compute + memory + exposed + host
    terms = {"compute": compute, "memory": memory, "communication": exposed, "host_transfer": host}
    return {
        "step_time_s": step,
        "tokens_per_sec": cost.tokens / step if step else None,
        "mfu": cost.model_flops / (step * hardware.peak_flops) if step else None,
        "compute_s": compute,
        "memory_s": memory,
        "communication_s": total,
        "exposed_communication_s": exposed,
        "host_transfer_s": host,
        "efficiency": efficiency,
        "bound": max(terms, key=terms.get),
    }
