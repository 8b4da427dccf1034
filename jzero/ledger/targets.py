"""GPU targets: compile jzero's step for NVIDIA GPUs on a host that has none (deviceless AOT).

``h100x8`` names a GPU kind and a count. :func:`target_devices` returns compile-only devices for it,
from JAX's CUDA plugin and a ``GpuTargetConfig`` in ``jzero/ledger/gpu_targets/``; a mesh over them lowers
and compiles with XLA's real GPU pipeline, so the HLO, its collectives and ``memory_analysis()`` are
the GPU program's. Nothing runs: compile-only devices hold no memory.

It needs the plugin (``pip install 'jzero[gpu-target]'``, which also brings cuDNN for flash
attention and the CUDA runtime, whose absence the plugin reports on import), and JAX's platforms
must leave out ``cuda`` on a host without a GPU: otherwise the plugin's CUDA check fails when JAX
starts and no ``cuda`` topology is registered. ``import jzero`` and the command line ask for
``cpu`` there themselves (:mod:`jzero.compiler.platforms`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jzero.compiler.platforms import cuda_plugins, gpu_compiler_available, jax_plugin_modules
from jzero.errors import ConfigError
from jzero.lazy import moved_names
from jzero.ledger.timing import Hardware
from jzero.sharding.axes import mesh_text, resolve_axes

__getattr__ = moved_names(__name__, {
    "flash_attention_available": "jzero.compiler.platforms.flash_attention_available",
    **{name: f"jzero.compiler.options.{name}" for name in (
        "GPU_COMPILER_OPTIONS", "PIPELINED_GATHERS", "LAYERS_PER_COMBINED_OP", "gpu_compiler_options",
    )},
})  # fmt: skip

__all__ = [
    "GPUS",
    "GPUS_PER_HOST",
    "NIC_SHARE",
    "Gpu",
    "Target",
    "check_target_fits_mesh",
    "cuda_plugins",
    "device_hardware",
    "device_peak_flops",
    "float8_missing",
    "gpu_compiler_available",
    "gpu_of",
    "jax_plugin_modules",
    "parse_target",
    "peak_flops",
    "scheduler_slop_factor",
    "target_devices",
]

INSTALL = "pip install 'jzero[gpu-target]' (in a clone: pip install -e '.[gpu-target]')"

GPUS_PER_HOST = 8  # an HGX/DGX node; ``--gpus-per-host`` says otherwise


# The share of a NIC's line rate NCCL's transfers reach: 48 of NDR's 50 GB/s ("CX-7 NICs at NDR rate
# (400Gbps) should achieve up to 48-49GB/s per NIC", NVIDIA/nccl-tests#267; "46-48GB/s per NIC",
# nccl-tests#290) and 24 of HDR's 25 ("24GB/s inter-node", NVIDIA/nccl#412), both from NCCL's developers.
NIC_SHARE = 0.96


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One GPU kind: its target config file, its nominal memory (the fits verdict's default), its
    dense bf16 peak (what MFU divides by) and the bandwidths the step-time model divides by, in
    bytes per second unless named: HBM; NCCL's ring bus bandwidth within one host of 8 (over
    NVSwitch, as nccl-tests measure it: below NVLink's line rate); the line rate in Gb/s of the NIC
    NVIDIA's DGX/HGX hosts give each GPU; PCIe per direction to the host. Sources beside each entry."""

    config_file: str
    memory_bytes: int
    bf16_dense_flops: float
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float
    nic_gbps: float
    pcie_bytes_per_s: float
    float8_dense_flops: float | None = None  # None: no float8 tensor cores (before Ada and Hopper)

    def hardware(
        self, gpus_per_host: int = GPUS_PER_HOST, nics_per_host: int | None = None, nic_gbps: float | None = None
    ) -> Hardware:
        """The figures :func:`jzero.ledger.timing.predict` reads, in hosts of ``gpus_per_host`` GPUs
        with ``nics_per_host`` NICs of ``nic_gbps`` (default: one of this GPU's DGX NICs per GPU), each
        at :data:`NIC_SHARE` of its line rate."""
        nic = (nic_gbps or self.nic_gbps) * 1e9 / 8 * NIC_SHARE
        return Hardware(
            self.bf16_dense_flops, self.hbm_bytes_per_s, self.nvlink_bytes_per_s, nic, self.pcie_bytes_per_s,
            gpus_per_host, nics_per_host or gpus_per_host, self.float8_dense_flops,
        )  # fmt: skip


GPUS: dict[str, Gpu] = {
    # A100 SXM4 80GB datasheet: 312 TFLOPS bf16 dense, 2,039 GB/s; NVLink 3 (300 GB/s per direction):
    # one 8-GPU node's all_reduce busbw 230.77 GB/s at 1 GiB (NVIDIA/nccl#527); DGX A100: one 200 Gb/s
    # HDR NIC per GPU ("8x200Gbit/s IB cards and we measure 192GB/s AllReduce BusBW", nccl#812);
    # PCIe Gen4 x16 (32 GB/s per direction).
    "a100": Gpu("a100.txtpb", 80 * 10**9, 312e12, 2.039e12, 230e9, 200, 32e9),
    # H100 SXM datasheet: 1,979 TFLOPS bf16 with sparsity (989 dense), 3.35 TB/s; NVLink 4 (450 GB/s
    # per direction): "NCCL can get an effective NVLink bandwidth of 370GB/s, which you can observe as
    # BusBw when running non-allreduce operations" (NCCL's developer, NVIDIA/nccl-tests#212; 365-370 GB/s
    # with NCCL_ALGO=RING on 2 to 8 GPUs, nccl#1455); DGX H100: one 400 Gb/s NDR NIC per GPU; PCIe Gen5
    # x16 (64 GB/s). FP8: 3,958 TFLOPS with sparsity, 1,979 dense.
    "h100": Gpu("h100.txtpb", 80 * 10**9, 989e12, 3.35e12, 370e9, 400, 64e9, 1979e12),
    # The H100 SXM5 96GB HBM2e at 500 W of torchtitan's benchmarks (h100hbm2e.txtpb): 2.4 TB/s; its
    # peak is "between SXM and NVL" (their footnote), taken here at the H100 NVL datasheet's: 1,671
    # TFLOPS bf16 and 3,341 FP8 with sparsity (835.5 and 1,670.5 dense). Its NVLink and NICs as DGX H100's.
    "h100hbm2e": Gpu("h100hbm2e.txtpb", 96 * 10**9, 835.5e12, 2.4e12, 370e9, 400, 64e9, 1670.5e12),
    # H200 SXM datasheet: the H100's tensor cores and NVLink, 4.8 TB/s HBM3e; DGX H200 as DGX H100.
    "h200": Gpu("h200.txtpb", 141 * 10**9, 989e12, 4.8e12, 370e9, 400, 64e9, 1979e12),
}


def device_peak_flops(device: Any) -> float | None:
    """A JAX device's dense bf16 peak (:func:`peak_flops` of its kind), or None off GPUs."""
    return peak_flops(device.device_kind) if device.platform == "gpu" else None


def device_hardware(device: Any, gpus_per_host: int = GPUS_PER_HOST) -> Hardware | None:
    """A JAX device's figures for the step-time model (:meth:`Gpu.hardware`, in hosts of
    ``gpus_per_host`` with one NIC per GPU), or None where its GPU is not known (:func:`gpu_of`) or
    it is no GPU."""
    gpu = gpu_of(device.device_kind) if device.platform == "gpu" else None
    return gpu.hardware(gpus_per_host) if gpu else None


def gpu_of(device_kind: str) -> Gpu | None:
    """The :data:`GPUS` entry of a device of this ``device_kind`` (JAX's, e.g. ``NVIDIA H100 80GB HBM3``),
    or None where it is not known: a CPU, or a part whose figures differ from the SXM one's (PCIe, NVL)."""
    kind = device_kind.lower()
    exact = [gpu for gpu in GPUS.values() if _DESCRIPTION.search(_target_config(gpu)).group(1).lower() == kind]
    if exact:
        return exact[0]
    if "pcie" in kind or "nvl" in kind:
        return None
    names = [name for name in GPUS if name in kind]
    return GPUS[names[0]] if len(names) == 1 else None


def float8_missing(devices: Any) -> str:
    """Why ``devices`` cannot run float8 GEMMs, or '' when they can: GPUs with float8 tensor cores
    (compute capability 8.9 or later: a known GPU's :attr:`Gpu.float8_dense_flops`, else the
    device's own ``compute_capability``). CPUs compute float8 dots exactly, which tests need."""
    first = next(iter(devices), None)
    if first is None or first.platform != "gpu":
        return ""
    gpu = gpu_of(first.device_kind)
    if gpu is not None:
        ok = gpu.float8_dense_flops is not None
    else:
        major, _, minor = str(getattr(first, "compute_capability", "0.0")).partition(".")
        ok = (int(major or 0), int(minor or 0)) >= (8, 9)
    float8 = ", ".join(name for name, g in GPUS.items() if g.float8_dense_flops)
    return "" if ok else f"{first.device_kind} has no float8 tensor cores (compute capability 8.9 or later: {float8})"


def peak_flops(device_kind: str) -> float | None:
    """The dense bf16 peak of a device of this ``device_kind`` (:func:`gpu_of`), or None where it is not known."""
    gpu = gpu_of(device_kind)
    return gpu.bf16_dense_flops if gpu else None


# XLA's latency-hiding scheduler keeps a program's buffers within (80% of the device's memory - its
# arguments and outputs) x xla_gpu_memory_limit_slop_factor / 100 (GetSchedulerMemoryLimit in
# xla/service/gpu/gpu_hlo_schedule.cc; the slop factor's default is 95), about JAX's default pool of
# 75% of the GPU. The fits verdict gives a program the GPU's nominal memory. Between the two, the
# scheduler stops overlapping the layer loop's collectives to save memory the verdict would allow:
# MPT-70B on h100x32 (docs/planner.md) exposed 14.0 s of its collectives at 95, 9.4 s at 100 and
# 0.15 s at 120, its peak 64.2, 64.6 and 65.9 GB (benchmarks/calibration.py's run, this host).
XLA_SCHEDULER_SHARE = 0.8
_DEVICE_MEMORY = re.compile(r"device_memory_size:\s*(\d+)")
_DESCRIPTION = re.compile(r'device_description_str:\s*"([^"]*)"')
XLA_DEFAULT_SLOP_FACTOR = 95


def scheduler_slop_factor(gpu: Gpu, io_bytes: int) -> int:
    """The ``xla_gpu_memory_limit_slop_factor`` that sets XLA's scheduler limit to what the fits
    verdict allows a step with ``io_bytes`` of live arguments on ``gpu`` (its nominal memory, less
    those), never below XLA's default.

    Args:
      gpu: the GPU; its driver's total memory is its target config's ``device_memory_size``.
      io_bytes: the step's live arguments per device.
    """
    total = int(_DEVICE_MEMORY.search(_target_config(gpu)).group(1))
    room = XLA_SCHEDULER_SHARE * total - io_bytes
    if room <= 0:
        return XLA_DEFAULT_SLOP_FACTOR
    return max(XLA_DEFAULT_SLOP_FACTOR, math.floor(100 * (gpu.memory_bytes - io_bytes) / room))


@functools.cache  # read for every GPU compile's options: once a process
def _target_config(gpu: Gpu) -> str:
    return (Path(__file__).parent / "gpu_targets" / gpu.config_file).read_text()


@dataclasses.dataclass(frozen=True)
class Target:
    """``hosts`` x ``gpus_per_host`` GPUs of one kind, with ``nics_per_host`` NICs of ``nic_gbps``
    Gb/s each per host (None: the GPU's DGX default, one NIC per GPU at :attr:`Gpu.nic_gbps`)."""

    gpu: str
    hosts: int
    gpus_per_host: int
    nics_per_host: int | None = None
    nic_gbps: float | None = None

    def hardware(self) -> Hardware:
        """The figures of its GPU and its network, for :func:`jzero.ledger.timing.predict`."""
        return GPUS[self.gpu].hardware(self.gpus_per_host, self.nics_per_host, self.nic_gbps)

    @property
    def count(self) -> int:
        return self.hosts * self.gpus_per_host

    @property
    def name(self) -> str:
        return f"{self.gpu}x{self.count}"

    @property
    def memory_bytes(self) -> int:
        return GPUS[self.gpu].memory_bytes

    @property
    def peak_flops(self) -> float:
        return GPUS[self.gpu].bf16_dense_flops


_SPEC = re.compile(r"(?P<gpu>[a-z][a-z0-9]*?)(?:x(?P<count>\d+))?")


def parse_target(
    spec: str,
    hosts: int | None = None,
    gpus_per_host: int | None = None,
    nics_per_host: int | None = None,
    nic_gbps: float | None = None,
) -> Target:
    """``h100x8``, ``h100x64`` or ``h100`` (with ``hosts``/``gpus_per_host``) -> a :class:`Target`.

    A count up to 8 is one host; a larger count is hosts of 8 GPUs unless ``gpus_per_host`` says
    otherwise. ``nics_per_host`` and ``nic_gbps`` (Gb/s per NIC) describe the network; by default a
    host has one NIC per GPU at the GPU's DGX speed (:data:`GPUS`).

    Raises:
      ConfigError: an unknown GPU, a count of 0, a count that hosts x GPUs per host do not make, or
        a network figure that is not positive.
    """
    if nic_gbps is not None and not (nic_gbps > 0 and math.isfinite(nic_gbps)):
        raise ConfigError("--nic-gbps", f"must be a positive number of Gb/s per NIC, got {nic_gbps}")
    if nics_per_host is not None and nics_per_host < 1:
        raise ConfigError("--nics-per-host", f"must be at least 1, got {nics_per_host}")
    target = _hosts_of(spec, hosts, gpus_per_host)
    return dataclasses.replace(target, nics_per_host=nics_per_host, nic_gbps=nic_gbps)


def _hosts_of(spec: str, hosts: int | None, gpus_per_host: int | None) -> Target:
    match = _SPEC.fullmatch(spec.strip().lower())
    known = ", ".join(GPUS)
    if not match or match.group("gpu") not in GPUS:
        raise ConfigError("--target", f"unknown GPU target {spec!r}: give a GPU and a count, e.g. h100x8 (GPUs: {known})")
    for flag, value in (("--hosts", hosts), ("--gpus-per-host", gpus_per_host)):
        if value is not None and value < 1:
            raise ConfigError(flag, f"must be at least 1, got {value}")
    count = int(match.group("count")) if match.group("count") else None
    if count is not None and count < 1:
        raise ConfigError("--target", f"{spec!r} has no GPUs")
    if count is None:
        hosts, per_host = hosts or 1, gpus_per_host or GPUS_PER_HOST
    elif gpus_per_host is not None:
        per_host = gpus_per_host
        if count % per_host:
            raise ConfigError("--gpus-per-host", f"{per_host} does not divide the {count} GPUs of {spec}")
        hosts = hosts or count // per_host
    elif hosts is not None:
        if count % hosts:
            raise ConfigError("--hosts", f"{hosts} hosts do not divide the {count} GPUs of {spec}")
        per_host = count // hosts
    elif count <= GPUS_PER_HOST:
        hosts, per_host = 1, count
    elif count % GPUS_PER_HOST:
        raise ConfigError("--target", f"{count} GPUs are not whole hosts of {GPUS_PER_HOST}: give --gpus-per-host")
    else:
        hosts, per_host = count // GPUS_PER_HOST, GPUS_PER_HOST
    if count is not None and hosts * per_host != count:
        raise ConfigError("--hosts", f"{hosts} hosts x {per_host} GPUs is not the {count} GPUs of {spec}")
    return Target(match.group("gpu"), hosts, per_host)


def check_target_fits_mesh(target: Target, axes: Mapping[str, int]) -> None:
    """The mesh must use every GPU of the target: a plan for 64 GPUs that uses 8 would mislead.

    Raises:
      ConfigError: the mesh's axes (a -1 filled in) do not multiply to the target's count.
    """
    sizes = resolve_axes(axes, target.count)
    used = math.prod(sizes.values())
    if used != target.count:
        raise ConfigError("--target", f"{target.name} has {target.count} GPUs but mesh.axes {mesh_text(sizes)} uses {used}")


def target_devices(target: str | Target, hosts: int | None = None, gpus_per_host: int | None = None) -> list:
    """Compile-only devices of a GPU target, for :func:`jzero.make_mesh` or :func:`jzero.build_job` (``devices=``).

    Args:
      target: ``"h100x8"`` and the like, or a :class:`Target`.
      hosts: hosts, for a target given without a count or to split a count other than by 8.
      gpus_per_host: GPUs per host.

    Returns:
      ``hosts x gpus_per_host`` devices in process (host) order; their ``device_kind`` is the GPU's
      name. Compiling for them needs no GPU.

    Raises:
      ConfigError: an unknown target, the plugin not installed, or JAX started with a platform list
        that let the plugin fail its CUDA check.
    """
    if not isinstance(target, Target):
        target = parse_target(target, hosts, gpus_per_host)
    if not gpu_compiler_available():
        raise ConfigError("--target", f"compiling for a GPU needs JAX's CUDA compiler plugin: {INSTALL}")
    from jax.experimental import topologies

    config = _target_config(GPUS[target.gpu])
    try:
        topology = topologies.get_topology_desc(
            target.gpu, "cuda", target_config=config, topology=f"1x{target.hosts}x{target.gpus_per_host}"
        )
    except NotImplementedError:
        raise ConfigError(
            "--target", "JAX registered no CUDA topology: set JAX_PLATFORMS=cpu before JAX starts on a host without a GPU"
        ) from None
    return list(topology.devices)
