"""TODO"""

from __future__ import annotations

from typing import Any

from jzero.ledger.collectives import AsyncCollective, CollectiveKind
from jzero.ledger.float8 import Float8, Float8Gathers
from jzero.ledger.flops import ModelFlops
from jzero.ledger.gathered import Gathered
from jzero.ledger.levels import Communication
from jzero.ledger.memory import CompiledHost, CompiledMemory
from jzero.ledger.saved import Activations
from jzero.ledger.tensors import TensorEntry, TensorRow
from jzero.ledger.timing import Prediction
from jzero.ledger.zeropp import GradientQuantization, Hierarchical, Quantization
from jzero.records import json_key, omit_if_none, record
from jzero.sharding.stages import HostBytes, StateBytes

__all__ = ["CheckedPlanReport", "Compiler", "PaperRow", "PaperTable", "PlanReport", "Scaling", "StagesReport", "XlaOption"]


@record
class PaperRow:
    """One stage's row of the paper's table.

    Attributes:
      stage: the ZeRO stage.
      partitioned: what it partitions, in words.
      bytes: model-state bytes per device by the paper's formula.
    """

    stage: int
    partitioned: str
    bytes: float


@record
class PaperTable:
    """The paper's per-stage model-state bytes for this model and mesh (Figure 1 / Table 1 style).

    Attributes:
      psi: Ψ, the parameter count.
      k: K, optimizer-state bytes per parameter that trains.
      param_bytes: bytes per parameter (and per gradient).
      n_d: N_d, the devices a stage partitions over.
      n_m: N_m, the model-parallel ways.
      rows: one row per stage.
      trainable: the parameters that train (``train.trainable``, LoRA), which alone have gradients
        and optimizer state: (p Ψ + (g + K) Ψ_t) per row; None when all of them train.
    """

    psi: int
    k: float
    param_bytes: float
    n_d: int
    n_m: int
    rows: list[PaperRow]
    trainable: int | None = None


@record
class XlaOption:
    """An XLA option the step compiles with.

    Attributes:
      value: its value.
      from_: where it comes from: ``jzero``, ``XLA_FLAGS`` or ``compiler.xla_options`` (JSON key ``from``).
    """

    value: Any
    from_: str = json_key("from")


@record
class Compiler:
    """How the step was compiled.

    Attributes:
      xla_options: the XLA options in effect, by name.
    """

    xla_options: dict[str, XlaOption]


@record
class Scaling:
    """Per-device work against one batch group's over N_d (``jzero plan``).

    Attributes:
      batch_groups: the batch groups (``replica`` x ``data``).
      flops_one_group: the per-device FLOPs of the step compiled for one group.
      flops_ratio_to_predicted: this step's per-device FLOPs over that / ``batch_groups``.
      temp_one_group: that step's temporaries.
      temp_ratio: this step's temporaries over those.
      flags: each figure that fails to shrink, in words.
    """

    batch_groups: int
    flops_one_group: float | None
    flops_ratio_to_predicted: float | None
    temp_one_group: int | None
    temp_ratio: float | None
    flags: list[str]


@record
class PlanReport:
    """The ``jzero plan --json`` report of one compiled step (:func:`jzero.training.report.plan_report`).

    Attributes:
      devices: how many devices the mesh has.
      backend: their platform.
      device_kind: their kind.
      hosts: how many hosts (processes) they are on.
      mesh: the mesh's axes and sizes.
      stage: the ZeRO stage.
      num_params: Ψ.
      per_device_bytes: model states per device in device memory, from the specs.
      host_bytes: what rests in pinned host memory per device.
      ideal_per_device_bytes: the paper's formula.
      activations: what the step saves for the backward.
      compiled: XLA's memory analysis.
      gathered_peak_bytes: the most gathered parameter bytes live at once.
      gathered: what the step holds gathered at once.
      compiled_host: the arguments and outputs in host memory.
      device_peak: the compiled peak without them.
      flops_per_device: XLA's cost analysis (a loop body once); None where it has none.
      model_flops: the FLOPs the model needs.
      predicted: the step-time model's prediction; None where the hardware is not known.
      collectives: the compiled HLO's collectives, by kind.
      collectives_in_loop: by kind, how many are inside loops.
      collective_groups: by kind, the group sizes.
      async_collectives: each asynchronous collective.
      notes: what the HLO shows about the gradient reduction.
      tensors: each tensor's specs and bytes.
      replicated: the tensors no dimension of which ``data`` divides.
      largest: the five largest tensors.
      not_on_model: the tensors the model rules leave whole.
      paper_table: the paper's table for this model.
      communication: the bytes sent per step.
      quantization: qwZ's part; None without it.
      gradient_quantization: qgZ's part; None without it.
      attention: the attention implementation; None for a model of yours.
      hierarchical: hpZ's part; None without it.
      compiler: the XLA options.
      attention_windows: cuDNN's fused attention calls in the program (forward and backward), by
        their sliding window's length (``"0"``: none); left out where the program has none.
      fp8: the program's float8 GEMMs against the projections that asked (``precision.fp8``); left
        out without float8 matmuls.
      fp8_gather: stage 3's parameter gathers by element type (``zero.fp8_gather``); left out without it.
    """

    devices: int
    backend: str
    device_kind: str
    hosts: int
    mesh: dict[str, int]
    stage: int
    num_params: int
    per_device_bytes: StateBytes
    host_bytes: HostBytes
    ideal_per_device_bytes: StateBytes
    activations: Activations
    compiled: CompiledMemory
    gathered_peak_bytes: int
    gathered: Gathered
    compiled_host: CompiledHost
    device_peak: int
    flops_per_device: float | None
    model_flops: ModelFlops
    predicted: Prediction | None
    collectives: dict[str, CollectiveKind]
    collectives_in_loop: dict[str, int]
    collective_groups: dict[str, list[int]]
    async_collectives: list[AsyncCollective]
    notes: list[str]
    tensors: list[TensorRow]
    replicated: list[TensorEntry]
    largest: list[TensorEntry]
    not_on_model: list[TensorEntry]
    paper_table: PaperTable
    communication: Communication
    quantization: Quantization | None
    gradient_quantization: GradientQuantization | None
    attention: str | None
    hierarchical: Hierarchical | None
    compiler: Compiler
    attention_windows: dict[str, int] | None = omit_if_none()
    fp8: Float8 | None = omit_if_none()
    fp8_gather: Float8Gathers | None = omit_if_none()


@record
class CheckedPlanReport(PlanReport):
    """A plan report with its verdict against a memory budget, and the scaling ``jzero plan`` adds.

    Attributes:
      memory_per_device: the budget in bytes; None without one.
      fits: whether the device peak is within it; None without one.
      scaling: per-device work against one batch group's; left out until measured.
    """

    memory_per_device: float | None
    fits: bool | None
    scaling: Scaling | None = omit_if_none()


@record
class StagesReport:
    """``jzero plan --all-stages --json``: every stage's report.

    Attributes:
      stages: each stage's report, by the stage's number.
    """

    stages: dict[str, CheckedPlanReport]
