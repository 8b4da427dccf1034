"""``ledger.json``, what a run writes at start-up: the plan report of the step it compiled
(:func:`jzero.ledger.plan_report.plan_report`) with what its live state holds, per device and per
process, and at the end where its time went."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from jzero.ledger import hlo
from jzero.ledger.inputs import ReportInputs
from jzero.ledger.plan_report import plan_report
from jzero.ledger.report import PlanReport
from jzero.memory.offload import DEVICE, HOST
from jzero.records import extend, json_key, omit_if_none, record
from jzero.sharding.state import TrainState

__all__ = [
    "GoodputReport",
    "LiveBytes",
    "LiveProcessBytes",
    "ProcessBytes",
    "Processes",
    "StartupLedger",
    "process_figures",
    "startup_ledger",
]


@record
class LiveBytes:
    """What the live state holds per device, in one memory kind.

    Attributes:
      params: the parameters.
      optimizer: the optimizer state.
      total: both.
    """

    params: int
    optimizer: int
    total: int


@record
class ProcessBytes:
    """Planned model-state bytes of one process's devices and of all.

    Attributes:
      per_process: one process's devices'.
      global_: every device's (JSON key ``global``).
    """

    per_process: int
    global_: int = json_key("global")


@record
class LiveProcessBytes:
    """Live parameter and optimizer bytes each process holds, and all of them.

    Attributes:
      per_process: each process's, in process order.
      global_: their sum (JSON key ``global``).
    """

    per_process: list[int]
    global_: int = json_key("global")


@record
class Processes:
    """The job's processes and what their devices hold.

    Attributes:
      count: how many processes.
      devices_per_process: this process's devices.
      planned_model_state_bytes: the planned model states.
      live_bytes: the live parameters and optimizer state.
    """

    count: int
    devices_per_process: int
    planned_model_state_bytes: ProcessBytes
    live_bytes: LiveProcessBytes


@record
class GoodputReport:
    """Where a run's wall time went (:meth:`jzero.training.goodput.Goodput.report`).

    Attributes:
      wall_s: the run's wall time, seconds.
      goodput: the steps' share of it.
      seconds: seconds by kind: ``steps``, ``startup``, ``compile``, ``data``, ``checkpoint``, ...
    """

    wall_s: float
    goodput: float
    seconds: dict[str, float]


@record
class StartupLedger(PlanReport):
    """``ledger.json``: the plan report of the step a run compiled, with what its live state holds.

    Attributes:
      live_bytes_per_device: the live state in device memory.
      live_host_bytes_per_device: the live state in host memory.
      processes: the processes and their devices' bytes.
      goodput: where the run's time went; left out until the run ends.
    """

    live_bytes_per_device: LiveBytes
    live_host_bytes_per_device: LiveBytes
    processes: Processes
    goodput: GoodputReport | None = omit_if_none()


def startup_ledger(inputs: ReportInputs, compiled: Any, state: TrainState) -> StartupLedger:
    """The plan report of the step a run compiled (:func:`jzero.ledger.plan_report.plan_report`), with
    the bytes its live state really holds and what each process's devices hold (a collective when
    there are several processes)."""
    report = plan_report(inputs, compiled)
    live = {}
    for key, kind in (("live_bytes_per_device", DEVICE), ("live_host_bytes_per_device", HOST)):
        params = hlo.live_bytes_per_device(state.params, kind)
        optimizer = hlo.live_bytes_per_device(state.opt_state, kind)
        live[key] = LiveBytes(params=params, optimizer=optimizer, total=params + optimizer)
    processes = process_figures(inputs.plan.mesh, state, report.per_device_bytes.total)
    return extend(report, StartupLedger, **live, processes=processes)


def process_figures(mesh: Any, state: TrainState, planned_per_device: int) -> Processes:
    """The job's processes and what their devices hold: the planned model states of one process's
    devices and of all of them, and the live parameters and optimizer state each process holds
    (measured in every process and gathered, a collective when there are several)."""
    devices = list(mesh.devices.flat)
    local = sum(1 for d in devices if d.process_index == jax.process_index())
    live = hlo.live_bytes_per_process(state.params) + hlo.live_bytes_per_process(state.opt_state)
    if jax.process_count() > 1:
        # JAX runs in 32 bits: each count travels as two int32 digits base 2**30.
        pairs = np.asarray(multihost_utils.process_allgather(np.array(divmod(live, 2**30), np.int32)))
        gathered = [int(high) * 2**30 + int(low) for high, low in pairs.reshape(-1, 2)]
    else:
        gathered = [live]
    return Processes(
        count=jax.process_count(),
        devices_per_process=local,
        planned_model_state_bytes=ProcessBytes(per_process=planned_per_device * local, global_=planned_per_device * len(devices)),
        live_bytes=LiveProcessBytes(per_process=gathered, global_=sum(gathered)),
    )
