"""The plan's predicted step time, tokens/s and MFU: a compiled step's figures handed to the
step-time model (:mod:`jzero.ledger.timing`) with its GPU's hardware (:mod:`jzero.ledger.targets`).
On a backend whose hardware is not known (the CPU) there is no prediction."""

from __future__ import annotations

from typing import Any

from jzero.ledger import hlo as ledger
from jzero.ledger import targets
from jzero.ledger.flops import matmul_flops
from jzero.ledger.levels import spans_hosts
from jzero.ledger.timing import StepCost, Transfer, predict
from jzero.training.job import Job

__all__ = ["predicted", "step_cost"]


def step_cost(job: Job, report: dict[str, Any], hlo_text: str, ops: list[ledger.Collective]) -> StepCost:
    """What the compiled step asks of each device, for :func:`jzero.ledger.timing.predict`.

    Args:
      job: the built job.
      report: the plan report's memory part (``model_flops``, ``per_device_bytes``, ``compiled_host``, ``activations``).
      hlo_text: the compiled step's HLO.
      ops: its collectives (:func:`jzero.ledger.hlo.parse_collectives`).
    """
    hosts = [d.process_index for d in job.mesh.devices.flat]
    executed, hiding = matmul_flops(hlo_text)
    transfers = [
        Transfer(
            bytes=ledger.paper_bytes(op) * op.executions,
            devices=op.group_size or len(hosts),
            cross_host=spans_hosts(op, hosts) is not False,
            hiding_flops=hiding.get(op.name, 0) * op.executions if op.overlapped else None,
        )
        for op in ops
    ]
    host = report["compiled_host"]
    return StepCost(
        flops=executed,
        model_flops=report["model_flops"]["per_device_per_step"],
        tokens=job.config.train.global_batch_size * job.config.model.seq_len,
        state_bytes=report["per_device_bytes"]["total"],
        transfers=tuple(transfers),
        # Offloaded states come in and go back each step; offloaded activations go out and come back.
        host_bytes=host["argument"] + host["output"] + 2 * report["activations"]["host"],
    )


def predicted(job: Job, report: dict[str, Any], hlo_text: str, ops: list[ledger.Collective]) -> dict[str, Any] | None:
    """The report's ``predicted`` part (:func:`jzero.ledger.timing.predict`), with the executed FLOPs
    (remat's recomputation included) against the model's; None where the devices' hardware is not known."""
    hardware = targets.device_hardware(job.mesh.devices.flat[0])
    if hardware is None:
        return None
    cost = step_cost(job, report, hlo_text, ops)
    return {
        **predict(cost, hardware),
        "executed_flops_per_device": cost.flops,
        "executed_over_model_flops": cost.flops / cost.model_flops if cost.model_flops else None,
        "host_transfer_bytes": cost.host_bytes,
    }
