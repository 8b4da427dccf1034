"""The plan's predicted step time, tokens/s and MFU: a compiled step's figures handed to the
step-time model (:mod:`jzero.ledger.timing`) with its GPU's hardware (:mod:`jzero.ledger.targets`).
On a backend whose hardware is not known (the CPU) there is no prediction, and where the FLOP
counter is wrong (:func:`counter_error`) the prediction says why instead of a step time."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from jzero.ledger import targets
from jzero.ledger.collectives import Collective, paper_bytes
from jzero.ledger.flops import MatmulFlops, ModelFlops, matmul_flops
from jzero.ledger.inputs import ReportInputs
from jzero.ledger.levels import group_shape
from jzero.ledger.memory import CompiledHost
from jzero.ledger.saved import Activations
from jzero.ledger.timing import Hardware, Prediction, StepCost, Transfer, predict
from jzero.ledger.traffic import hbm_bytes
from jzero.models.sizes import attention_flops_per_token

__all__ = ["COUNTER_TOLERANCE", "StepParts", "counter_error", "predicted", "step_cost", "transfers"]

# How far below the FLOPs causal attention explains the executed FLOPs may fall before the counter is
# called wrong: the model's 6 N + 12 L T d is not the program's exact GEMMs (docs/planner.md, "The
# step-time model", gives gpt-7b's ratios).
COUNTER_TOLERANCE = 0.05


class StepParts(NamedTuple):
    """The plan report's parts the time model reads (a :class:`jzero.ledger.report.PlanReport` has
    them, by the same names)."""

    model_flops: ModelFlops  # the FLOPs the model needs per device per step
    compiled_host: CompiledHost  # offloaded states: in and back each step
    activations: Activations  # offloaded activations: out and back


def step_cost(inputs: ReportInputs, parts: StepParts, hlo_text: str, ops: list[Collective]) -> StepCost:
    """What the compiled step asks of each device, for :func:`jzero.ledger.timing.predict`.

    Args:
      inputs: what the step was compiled from (:class:`jzero.ledger.inputs.ReportInputs`).
      parts: the plan report's parts the time model reads.
      hlo_text: the compiled step's HLO.
      ops: its collectives (:func:`jzero.ledger.hlo.parse_collectives`).
    """
    return _step_cost(inputs, parts, matmul_flops(hlo_text), ops, hbm_bytes(hlo_text), _hosts(inputs))


def transfers(ops: list[Collective], hosts: list[int], counted: MatmulFlops) -> tuple[Transfer, ...]:
    """Each collective's traffic per step for the step-time model: its paper bytes times its runs,
    its groups' shape over the hosts (:func:`jzero.ledger.levels.group_shape`) and, when async and
    overlapped, the compute of its window (:func:`jzero.ledger.flops.matmul_flops`).

    Args:
      ops: the program's collectives (:func:`jzero.ledger.hlo.parse_collectives`).
      hosts: the host of each of the program's devices, in their order.
      counted: the program's matmul FLOPs and windows.
    """
    out = []
    for op in ops:
        window, hiding = counted.windows.get(op.name, (None, 0))
        spanned, per_host = group_shape(op, hosts)
        out.append(
            Transfer(
                bytes=paper_bytes(op) * op.executions,
                devices=op.group_size or len(hosts),
                hosts=spanned,
                per_host=per_host,
                hiding_flops=hiding * op.executions if op.overlapped else None,
                window=window if op.overlapped else None,
            )
        )
    return tuple(out)


def _step_cost(
    inputs: ReportInputs, parts: StepParts, counted: MatmulFlops, ops: list[Collective], memory_bytes: int, hosts: list[int]
) -> StepCost:
    host = parts.compiled_host
    return StepCost(
        flops=counted.executed,
        float8_flops=counted.float8,
        model_flops=parts.model_flops.per_device_per_step,
        tokens=inputs.tokens,
        hbm_bytes=memory_bytes,
        transfers=transfers(ops, hosts, counted),
        # Offloaded states come in and go back each step; offloaded activations go out and come back.
        host_bytes=host.argument + host.output + 2 * parts.activations.host,
    )


def counter_error(counted: MatmulFlops, model_flops: float, attention_share: float, mfu: float | None) -> str | None:
    """Why the FLOP counter's figure cannot be a prediction, in one line; None when it can.

    Args:
      counted: what :func:`jzero.ledger.flops.matmul_flops` read.
      model_flops: the model's FLOPs per device per step.
      attention_share: the share of them that attention's scores and weighted values are (a causal
        kernel runs half of it).
      mfu: the prediction's MFU.
    """
    if counted.unknown_loops:
        return f"the FLOP counter cannot tell how often loop {', '.join(counted.unknown_loops)} runs (counted once)"
    ratio = counted.executed / model_flops if model_flops else None
    least = (1 - attention_share / 2) * (1 - COUNTER_TOLERANCE)
    if ratio is not None and ratio < least:
        why = (
            f"XLA lowered matmuls to an op jzero does not count: {', '.join(counted.uncounted)}"
            if counted.uncounted
            else "no op it skips looks like a matmul"
        )
        found = f"the FLOP counter found only {ratio:.2f}x the model's FLOPs"
        return f"{found}, below the {least:.2f}x causal attention explains ({why})"
    if mfu is not None and mfu > 1:
        return f"MFU {mfu:.1%} is above 100%: the FLOP counter or the model's FLOPs are wrong"
    return None


def _attention_share(inputs: ReportInputs) -> float:
    """Attention's share of the model's FLOPs per token (:func:`jzero.models.sizes.attention_flops_per_token`)."""
    per_token = inputs.flops_per_token
    return min(1.0, attention_flops_per_token(inputs.model) / per_token) if per_token else 0.0


def _hosts(inputs: ReportInputs) -> list[int]:
    return [d.process_index for d in inputs.plan.mesh.devices.flat]


def predicted(
    inputs: ReportInputs, parts: StepParts, hlo_text: str, ops: list[Collective], hardware: Hardware | None = None
) -> Prediction | None:
    """The report's ``predicted`` part (:func:`jzero.ledger.timing.predict`), with the executed FLOPs
    (remat's recomputation included) against the model's; None where the devices' hardware is not
    known. Where the FLOP counter is wrong (:func:`counter_error`), ``error`` says why and the step
    time, tokens/s, MFU and bound are None.

    ``hardware`` is the target's (:meth:`jzero.ledger.targets.Target.hardware`, with its network);
    by default the devices' GPU in hosts of as many devices as the first host has, a NIC per GPU.
    """
    hosts = _hosts(inputs)
    hardware = hardware or targets.device_hardware(inputs.plan.mesh.devices.flat[0], hosts.count(hosts[0]))
    if hardware is None:
        return None
    counted = matmul_flops(hlo_text)
    cost = _step_cost(inputs, parts, counted, ops, hbm_bytes(hlo_text), hosts)
    p = predict(cost, hardware)
    error = counter_error(counted, cost.model_flops, _attention_share(inputs), p.mfu)
    if error is None:
        return p
    return dataclasses.replace(p, step_time_s=None, tokens_per_sec=None, mfu=None, bound=None, error=error)
