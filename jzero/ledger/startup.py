"""TODO"""

from __future__ import annotations

from jzero.ledger.report import PlanReport
from jzero.records import json_key, omit_if_none, record

__all__ = ["GoodputReport", "LiveBytes", "LiveProcessBytes", "ProcessBytes", "Processes", "StartupLedger"]


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
