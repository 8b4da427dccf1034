"""The step-time model: a compiled step's predicted time from its FLOPs, bytes and schedule.

A roofline in the JAX scaling book's manner (jax-ml/scaling-book, "rooflines"), one term per resource:

- **compute**: the matmul FLOPs the program executes per device (:func:`jzero.ledger.flops.program_flops`,
  remat's recomputation included) over the GPU's dense bf16 peak times one efficiency factor,
  :data:`EFFICIENCY`, calibrated once against published runs (docs/planner.md); float8 GEMMs' FLOPs
  over the float8 peak times their own, :data:`FLOAT8_EFFICIENCY` (docs/float8.md);
- **memory**: the bytes the non-matmul work reads and writes in HBM (every fusion, copy and
  reduce of the compiled program, the optimizer's update among them:
  :func:`jzero.ledger.traffic.hbm_bytes`) over HBM bandwidth;
- **communication**: each collective's bytes (the paper's accounting) times (n - 1) / n for its n
  devices, over the bus bandwidth NCCL reaches for its group's shape (:func:`bus_bandwidth`):
  NVLink within a host; across hosts, the share of the host's NICs its group's devices there own
  (NCCL's rings use every NIC of a host, one channel per NIC), at most NVLink's;
- **host transfers** (offload): the bytes that cross PCIe per step over its bandwidth, not hidden;
- **overlap**: async collectives whose start-done spans overlap form one window
  (:func:`jzero.ledger.flops.matmul_flops`): one communication stream runs them in turn, hidden
  up to the time of the compute scheduled in the window, which each FLOP hides once. The rest of
  them, and every synchronous collective, adds to the step.

The step is compute + memory + exposed communication + host transfers. It is never below its
floor, ``floor_s``: the compute, or the communication of either level, whichever is longest.
Nothing here runs JAX.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from jzero.records import omit_if_none, record

__all__ = ["EFFICIENCY", "FLOAT8_EFFICIENCY", "Hardware", "StepCost", "Transfer", "bus_bandwidth", "predict"]


@record
class BusBandwidth:
    """The bus bandwidth each level's collectives reach, bytes per second (nccl-tests' busbw,
    :func:`jzero.ledger.timing.bus_bandwidth`): theirs together, or a whole host's group where the
    level has none.

    Attributes:
      within_host: over NVLink.
      across_hosts: over the hosts' NICs.
    """

    within_host: float
    across_hosts: float


@record
class Prediction:
    """The step-time model's prediction (:func:`jzero.ledger.timing.predict`), seconds unless named.

    Attributes:
      step_time_s: the predicted step; None when ``error`` says why not.
      tokens_per_sec: tokens per second.
      mfu: model FLOPs per second over the peak.
      compute_s: the matmuls at the assumed efficiency.
      memory_s: the non-matmul work's HBM reads and writes (``hbm_bytes``) over HBM bandwidth.
      communication_s: every collective, as if none were hidden.
      exposed_communication_s: the collectives' time not hidden behind compute.
      communication_within_host_s: the collectives within a host.
      communication_across_hosts_s: the collectives across hosts.
      exposed_within_host_s: within a host, exposed.
      exposed_across_hosts_s: across hosts, exposed.
      hidden_communication_share: the share of ``communication_s`` hidden; None without communication.
      floor_s: the largest of compute and each level's communication.
      host_transfer_s: offloaded states and activations moving to and from host memory.
      efficiency: the share of the peak the matmuls are assumed to reach.
      float8_efficiency: the share of the float8 peak float8 GEMMs are assumed to reach; left out
        where the program has none.
      bound: the largest term: compute, memory, communication or host_transfer.
      error: why the FLOP counter's figure cannot be a prediction; None when it can.
      executed_flops_per_device: the FLOPs the program executes per device, recomputation included.
      executed_over_model_flops: those over the model's.
      float8_flops_per_device: the part of them float8 GEMMs run (priced at the float8 peak); left
        out where the program has none.
      host_transfer_bytes: the bytes moved to and from host memory per step.
      hbm_bytes: the bytes the non-matmul work reads and writes in HBM per step (the memory term's).
      bus_bandwidth: each level's predicted bus bandwidth.
    """

    step_time_s: float | None
    tokens_per_sec: float | None
    mfu: float | None
    compute_s: float
    memory_s: float
    communication_s: float
    exposed_communication_s: float
    communication_within_host_s: float
    communication_across_hosts_s: float
    exposed_within_host_s: float
    exposed_across_hosts_s: float
    hidden_communication_share: float | None
    floor_s: float
    host_transfer_s: float
    efficiency: float
    bound: str | None
    error: str | None
    executed_flops_per_device: float
    executed_over_model_flops: float | None
    host_transfer_bytes: float
    hbm_bytes: float
    bus_bandwidth: BusBandwidth
    float8_flops_per_device: float | None = omit_if_none()
    float8_efficiency: float | None = omit_if_none()


# The share of the dense bf16 peak jzero's matmuls reach: one value for every target, chosen from
# the calibration table of published runs (docs/planner.md, benchmarks/calibration.py) to balance its
# worst errors: the geometric mean of the lowest and highest matching efficiencies (0.457 and 0.590).
EFFICIENCY = 0.52

# The share of the dense float8 peak float8 GEMMs reach, fitted apart from EFFICIENCY on published
# pairs of one job in float8 and in bf16 (benchmarks/calibration.py --float8-fit, docs/float8.md):
# the float8 speedup each pair measured, with its bf16 run at EFFICIENCY, balanced over the worst two
# (0.409 and 0.471) of the pairs whose bf16 run the model predicts within the table's worst error.
FLOAT8_EFFICIENCY = 0.44


@dataclasses.dataclass(frozen=True)
class Hardware:
    """One GPU's figures and its cluster's network, bytes and FLOPs per second
    (:mod:`jzero.ledger.targets` holds them with sources).

    Attributes:
      peak_flops: the dense bf16 peak.
      hbm_bytes_per_s: HBM bandwidth.
      within_host_bytes_per_s: NCCL's ring bus bandwidth within a host (over NVLink).
      nic_bytes_per_s: what NCCL reaches on one NIC, per direction.
      host_bytes_per_s: PCIe, per direction.
      gpus_per_host: GPUs in a host.
      nics_per_host: NICs in a host (a DGX H100: one per GPU).
      float8_flops: the dense float8 peak; None where the GPU has no float8 tensor cores.
    """

    peak_flops: float
    hbm_bytes_per_s: float
    within_host_bytes_per_s: float
    nic_bytes_per_s: float
    host_bytes_per_s: float
    gpus_per_host: int = 8
    nics_per_host: int = 8
    float8_flops: float | None = None


@dataclasses.dataclass(frozen=True)
class Transfer:
    """One collective's traffic per step, as one device sees it.

    Attributes:
      bytes: what it sends per step in the paper's accounting (all its runs).
      devices: the devices of each of its groups (n).
      hosts: the hosts its largest group spans (1: within a host).
      per_host: the fewest devices of one group on one of its hosts (None: ``devices``, on one host).
      hiding_flops: the matmul FLOPs scheduled between its start and done (all its runs), or its
        window's; None for a synchronous op or one with no compute between.
      window: the window of overlapping collectives it shares ``hiding_flops`` with (None: its own).
    """

    bytes: float
    devices: int
    hosts: int = 1
    per_host: int | None = None
    hiding_flops: float | None = None
    window: str | None = None

    @property
    def cross_host(self) -> bool:
        """Whether a group spans hosts."""
        return self.hosts > 1


@dataclasses.dataclass(frozen=True)
class StepCost:
    """What one compiled step asks of a device.

    Attributes:
      flops: matmul FLOPs executed per device (recomputation included).
      float8_flops: the part of ``flops`` float8 GEMMs run.
      model_flops: the model's FLOPs per device (what MFU counts; no recomputation).
      tokens: tokens per step, all devices together.
      hbm_bytes: bytes per device the non-matmul work reads and writes in HBM.
      transfers: the collectives.
      host_bytes: bytes that cross PCIe per device per step.
    """

    flops: float
    model_flops: float
    tokens: int
    hbm_bytes: float = 0.0
    transfers: Sequence[Transfer] = ()
    host_bytes: float = 0.0
    float8_flops: float = 0.0


def bus_bandwidth(transfer: Transfer, hardware: Hardware) -> tuple[str, float]:
    """The algorithm NCCL runs for ``transfer``'s groups and the bus bandwidth it reaches (nccl-tests'
    busbw: a ring moves bytes x (n - 1) / n per device in this many seconds over it).

    Within a host, ``nvlink``: NCCL's ring over NVSwitch. Across hosts, a ring per channel: NCCL
    gives each host's NICs a channel of their own and NVLink carries the hops inside, so a host's
    cross-host bytes leave it once, over the NICs its group's devices own (every group of the op
    runs at once, each with its share): ``ring`` with several devices per host, ``rail`` with one
    (each GPU's ring runs over its own NIC). Never above NVLink's, which the ring also crosses.

    Returns:
      ``(algorithm, bytes per second)``.
    """
    if not transfer.cross_host:
        return "nvlink", hardware.within_host_bytes_per_s
    per_host = transfer.per_host or 1
    nics = hardware.nics_per_host * hardware.nic_bytes_per_s * min(per_host, hardware.gpus_per_host) / hardware.gpus_per_host
    return ("rail" if per_host == 1 else "ring"), min(nics, hardware.within_host_bytes_per_s)


def _seconds(transfer: Transfer, hardware: Hardware) -> float:
    n = max(transfer.devices, 1)
    return transfer.bytes * (n - 1) / n / bus_bandwidth(transfer, hardware)[1]


def _bus_bandwidths(cost: StepCost, hardware: Hardware) -> BusBandwidth:
    """Each level's bus bandwidth: its collectives' ring bytes over their seconds; for a level with
    none, what a group of every GPU of each host would reach."""
    whole_host = hardware.gpus_per_host
    out = {}
    for level, hosts in (("within_host", 1), ("across_hosts", 2)):
        members = [t for t in cost.transfers if (t.hosts > 1) == (hosts > 1) and t.bytes]
        seconds = sum(_seconds(t, hardware) for t in members)
        ring_bytes = sum(t.bytes * (t.devices - 1) / t.devices for t in members if t.devices)
        fallback = bus_bandwidth(Transfer(0.0, whole_host * hosts, hosts, whole_host), hardware)[1]
        out[level] = ring_bytes / seconds if seconds else fallback
    return BusBandwidth(within_host=out["within_host"], across_hosts=out["across_hosts"])


def _hidden(cost: StepCost, hardware: Hardware, flops_per_s: float) -> list[float]:
    """Each transfer's hidden seconds: a window's compute hides its transfers' sum, shared in
    proportion to their times, and all the hidden time together is at most the step's compute."""
    seconds = [_seconds(t, hardware) for t in cost.transfers]
    windows: dict[Any, list[int]] = {}
    for i, t in enumerate(cost.transfers):
        windows.setdefault(i if t.window is None else t.window, []).append(i)
    hidden = [0.0] * len(seconds)
    for members in windows.values():
        total = sum(seconds[i] for i in members)
        flops = max((cost.transfers[i].hiding_flops or 0.0) for i in members)
        covered = min(total, flops / flops_per_s)
        for i in members:
            hidden[i] = covered * seconds[i] / total if total else 0.0
    # Inconsistent figures (windows that claim more compute than the step has) still keep the floor.
    scale = min(1.0, cost.flops / flops_per_s / sum(hidden)) if sum(hidden) else 1.0
    return [h * scale for h in hidden]


def _levels(cost: StepCost, hardware: Hardware, flops_per_s: float) -> dict[str, list[float]]:
    """``[communication, exposed]`` seconds within a host and across hosts."""
    levels = {"within_host": [0.0, 0.0], "across_hosts": [0.0, 0.0]}
    for transfer, hidden in zip(cost.transfers, _hidden(cost, hardware, flops_per_s), strict=True):
        level = levels["across_hosts" if transfer.cross_host else "within_host"]
        level[0] += _seconds(transfer, hardware)
        level[1] += _seconds(transfer, hardware) - hidden
    return levels


def _compute_seconds(cost: StepCost, hardware: Hardware, efficiency: float, float8_efficiency: float) -> float:
    """The matmuls' seconds: float8 GEMMs at ``float8_efficiency`` of the float8 peak, the rest at
    ``efficiency`` of the bf16 peak (a GPU without float8 tensor cores runs them all so)."""
    float8 = min(cost.float8_flops, cost.flops)
    if not hardware.float8_flops:
        return cost.flops / (hardware.peak_flops * efficiency)
    bf16 = (cost.flops - float8) / (hardware.peak_flops * efficiency)
    return bf16 + float8 / (hardware.float8_flops * float8_efficiency)


def predict(
    cost: StepCost, hardware: Hardware, efficiency: float = EFFICIENCY, float8_efficiency: float = FLOAT8_EFFICIENCY
) -> Prediction:
    """The predicted step time of ``cost`` on ``hardware``, with its terms.

    Args:
      cost: the step's FLOPs, bytes and collectives.
      hardware: the GPU's figures.
      efficiency: the share of the peak the matmuls reach.
      float8_efficiency: the share of the float8 peak float8 GEMMs reach.

    Returns:
      A :class:`Prediction` (its ``error`` None): ``step_time_s``, ``tokens_per_sec``, ``mfu`` (model
      FLOPs over the step time at the peak), the step's executed FLOPs and bytes, and
      the terms in seconds: ``compute_s``, ``memory_s``, ``communication_s`` (every collective, if
      none were hidden), ``exposed_communication_s``, ``host_transfer_s``; per level,
      ``communication_within_host_s``, ``communication_across_hosts_s``, ``exposed_within_host_s``,
      ``exposed_across_hosts_s``; ``hidden_communication_share`` (of ``communication_s``, None
      without communication); ``floor_s``; ``bound``: the largest term; ``bus_bandwidth``: each
      level's (``within_host``, ``across_hosts``) in bytes per second (:func:`bus_bandwidth`; its
      collectives' together, or a whole host's group where the level has none).
    """
    compute = _compute_seconds(cost, hardware, efficiency, float8_efficiency)
    # The rate at which a window's matmuls hide collectives: the step's, float8's share included.
    flops_per_s = cost.flops / compute if compute else hardware.peak_flops * efficiency
    memory = cost.hbm_bytes / hardware.hbm_bytes_per_s
    levels = _levels(cost, hardware, flops_per_s)
    total = sum(t for t, _ in levels.values())
    exposed = sum(e for _, e in levels.values())
    host = cost.host_bytes / hardware.host_bytes_per_s
    step = compute + memory + exposed + host
    terms = {"compute": compute, "memory": memory, "communication": exposed, "host_transfer": host}
    return Prediction(
        step_time_s=step,
        tokens_per_sec=cost.tokens / step if step else None,
        mfu=cost.model_flops / (step * hardware.peak_flops) if step else None,
        compute_s=compute,
        memory_s=memory,
        communication_s=total,
        exposed_communication_s=exposed,
        communication_within_host_s=levels["within_host"][0],
        communication_across_hosts_s=levels["across_hosts"][0],
        exposed_within_host_s=levels["within_host"][1],
        exposed_across_hosts_s=levels["across_hosts"][1],
        hidden_communication_share=1 - exposed / total if total else None,
        floor_s=max(compute, *(t for t, _ in levels.values())),
        host_transfer_s=host,
        efficiency=efficiency,
        bound=max(terms, key=terms.get),
        error=None,
        executed_flops_per_device=cost.flops,
        float8_flops_per_device=cost.float8_flops or None,
        float8_efficiency=float8_efficiency if cost.float8_flops and hardware.float8_flops else None,
        executed_over_model_flops=cost.flops / cost.model_flops if cost.model_flops else None,
        host_transfer_bytes=cost.host_bytes,
        hbm_bytes=cost.hbm_bytes,
        bus_bandwidth=_bus_bandwidths(cost, hardware),
    )
