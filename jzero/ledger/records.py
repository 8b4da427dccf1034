"""The plan report as records: ``jzero plan --json``, its ``--all-stages`` form and the start-up
ledger (``ledger.json``), each a tree of dataclasses whose field names are the JSON keys.

:mod:`jzero.training.report` builds them, :mod:`jzero.ledger.render` renders them, and :func:`to_json`
gives the JSON object the command line prints. :func:`from_json` reads one back, strictly, and
:func:`json_schema` is the JSON Schema (draft 2020-12) of a record, generated from the type hints
(``jzero plan --json-schema`` prints :class:`PlanReport`'s family's, see docs/training.md).

Two field metadata keys shape the JSON: ``key``, the JSON name of a field whose name is a Python
keyword (``async``, ``from``, ``global``), and ``omit``: the key is left out while the field is None
(a part only some programs have: the GPT's formula beside the saved activations, the scaling that
``jzero plan`` adds), so such a key is the one kind a schema does not require.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from typing import Any

__all__ = [
    "BusBandwidth",
    "Activations",
    "AsyncCollective",
    "CheckedPlanReport",
    "CollectiveKind",
    "Communication",
    "CompiledHost",
    "CompiledMemory",
    "Compiler",
    "ExcludedTensor",
    "Gathered",
    "GatherMismatch",
    "GoodputReport",
    "GradientQuantization",
    "GradientReductions",
    "Hierarchical",
    "HostBytes",
    "LiveBytes",
    "LiveProcessBytes",
    "ModelFlops",
    "PaperRow",
    "PaperTable",
    "ParameterGathers",
    "PlanReport",
    "Prediction",
    "ProcessBytes",
    "Processes",
    "Quantization",
    "RecordError",
    "ReductionMismatch",
    "SavedKind",
    "Scaling",
    "StagesReport",
    "StartupLedger",
    "StateBytes",
    "TensorEntry",
    "TensorRow",
    "XlaOption",
    "from_json",
    "json_schema",
    "to_json",
]


def _omit() -> Any:
    """A field left out of the JSON while None (and so not required by the schema)."""
    return dataclasses.field(default=None, metadata={"omit": True})


def _key(name: str) -> Any:
    """A field whose JSON key, ``name``, is a Python keyword."""
    return dataclasses.field(metadata={"key": name})


_record = dataclasses.dataclass(kw_only=True)


@_record
class StateBytes:
    """Model-state bytes per device, by part.

    Attributes:
      params: the parameters.
      grads: the gradients.
      optimizer: the optimizer state.
      total: the three together.
    """

    params: int
    grads: int
    optimizer: int
    total: int


@_record
class HostBytes(StateBytes):
    """Bytes per device resting in pinned host memory: model states by part, and saved activations.

    Attributes:
      activations: the activations the layer loops save in host memory.
    """

    activations: int


@_record
class SavedKind:
    """One kind of value saved for the backward: a layer loop's residual stack, or an unrolled model's.

    Attributes:
      kind: what the value is (the op that makes it, or the model's input).
      dtype: its HLO element type.
      shape: one layer's shape.
      layers: how many layers (or gathering units) save it.
      bytes_per_layer: one layer's bytes.
      role: the GPT formula's kind it counts toward; only beside a formula.
      in_units: whether it is saved within a gathering unit; only for an unrolled model.
    """

    kind: str
    dtype: str
    shape: list[int]
    layers: int
    bytes_per_layer: int
    role: str | None = _omit()
    in_units: bool | None = _omit()


@_record
class Activations:
    """What the step saves for the backward, per device, and against the GPT's formula where it applies.

    Attributes:
      device: bytes saved in device memory.
      host: bytes saved in host memory.
      remat: the remat policy in effect.
      partitioned: whether the saved inputs are split over ``model``.
      host_from: where the host bytes come from: ``compiled`` (the layout) or ``policy`` (the traced program).
      saved_by: ``layer loops`` or ``gathering units``.
      by_kind: the saved values by kind.
      formula: the GPT formula's bytes for all layers; GPT layer loops only.
      formula_by_kind: the formula's bytes per layer, by role.
      over_formula: the roles saved above the formula.
      korthikanti_none: Korthikanti et al.'s 34 s b h per layer, 16-bit, without recomputation.
    """

    device: int
    host: int
    remat: str
    partitioned: bool
    host_from: str
    saved_by: str
    by_kind: list[SavedKind]
    formula: int | None = _omit()
    formula_by_kind: dict[str, int] | None = _omit()
    over_formula: list[str] | None = _omit()
    korthikanti_none: int | None = _omit()


@_record
class CompiledMemory:
    """XLA's memory analysis of the compiled step, bytes per device.

    Attributes:
      argument: the arguments.
      output: the outputs.
      temp: the temporaries.
      peak: arguments + temporaries + unaliased outputs.
    """

    argument: int
    output: int
    temp: int
    peak: int


@_record
class CompiledHost:
    """The compiled step's arguments and outputs that rest in host memory, bytes per device.

    Attributes:
      argument: the arguments in host memory.
      output: the outputs in host memory.
    """

    argument: int
    output: int


@_record
class TensorEntry:
    """A tensor named in a list.

    Attributes:
      path: its path in the parameter tree.
      shape: its global shape.
      bytes: its whole bytes.
    """

    path: str
    shape: list[int]
    bytes: int


@_record
class ExcludedTensor(TensorEntry):
    """A tensor a ZeRO++ technique leaves out, and why.

    Attributes:
      why: the reason, in words.
    """

    why: str


@_record
class Gathered:
    """What the step holds gathered at once (:func:`jzero.ledger.gathered.gathered_at_once`).

    Attributes:
      peak_bytes: the most gathered bytes live at once, per device.
      share_of_params: that over the whole parameters in the compute dtype.
      layer_bytes: one layer's gathered bytes; None without units or a scanned stack.
      layers: the peak in layers' worth.
      units: how many gathering units are in effect.
      merged: a line per group of units the loss could not split.
      prefetch: how many units ahead are gathered.
      unit_tensors: each gathering unit by name, with its tensors' paths.
      persistent: the parameters resting whole below ``zero.persist_below_bytes``.
    """

    peak_bytes: int
    share_of_params: float | None
    layer_bytes: int | None
    layers: float | None
    units: int
    merged: list[str]
    prefetch: int
    unit_tensors: dict[str, list[str]]
    persistent: list[TensorEntry]


@_record
class ModelFlops:
    """The FLOPs one step needs by the model's formula.

    Attributes:
      per_token: the model's FLOPs per token.
      per_step: the global batch's.
      per_device_per_step: one device's share.
      peak_flops: the device's dense bf16 peak, FLOP/s; None where unknown.
      peak_floor_s: the step's seconds at that peak, a floor no real step reaches.
    """

    per_token: float
    per_step: float
    per_device_per_step: float
    peak_flops: float | None
    peak_floor_s: float | None


@_record
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


@_record
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
      bound: the largest term: compute, memory, communication or host_transfer.
      error: why the FLOP counter's figure cannot be a prediction; None when it can.
      executed_flops_per_device: the FLOPs the program executes per device, recomputation included.
      executed_over_model_flops: those over the model's.
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


@_record
class CollectiveKind:
    """One kind of collective in the compiled HLO (a loop body's ops count once).

    Attributes:
      count: how many ops.
      bytes: their result bytes.
      dtypes: their element types.
      async_: how many are asynchronous (JSON key ``async``).
      overlapped: how many asynchronous ones overlap compute.
    """

    count: int
    bytes: int
    dtypes: list[str]
    async_: int = _key("async")
    overlapped: int


@_record
class AsyncCollective:
    """An asynchronous collective of the compiled step.

    Attributes:
      name: its HLO name.
      kind: its op kind.
      dtype: its element type.
      bytes: its result bytes.
      computation: the HLO computation it is in.
      executions: how often it runs per step.
      overlapped: whether compute runs between its start and done.
    """

    name: str
    kind: str
    dtype: str
    bytes: int
    computation: str
    executions: int
    overlapped: bool


@_record
class TensorRow:
    """One tensor of the plan: its shape, dtype, three specs and parameter bytes per device.

    Attributes:
      path: its path in the parameter tree.
      shape: its global shape.
      dtype: the parameter's dtype.
      param_spec: the parameter's ``PartitionSpec``.
      grad_spec: the gradient's (``frozen`` for a parameter that does not train).
      optimizer_spec: the optimizer state's.
      param_bytes_per_device: the parameter's bytes on one device.
    """

    path: str
    shape: list[int]
    dtype: str
    param_spec: str
    grad_spec: str
    optimizer_spec: str
    param_bytes_per_device: int


@_record
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


@_record
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


@_record
class Communication:
    """Bytes each device sends per step, against the paper's volume, and by level.

    Attributes:
      bytes_per_step: by op kind (an all-reduce counts twice, loops times their trip counts).
      by_dtype: by op kind, then element type.
      total: all kinds together.
      paper: the paper's 2Ψ or 3Ψ, in bytes.
      paper_model: which of the two, in words.
      ratio: ``total`` over ``paper``.
      hosts: how many hosts the devices are on.
      within_host_bytes: the bytes of collectives within a host.
      cross_host_bytes: the bytes of collectives whose group spans hosts.
      cross_host_ratio: those over ``paper``.
      zeropp_cross_host_bytes: ZeRO++'s 0.75Ψ cross-host figure; None below stage 3.
    """

    bytes_per_step: dict[str, int]
    by_dtype: dict[str, dict[str, int]]
    total: int
    paper: float
    paper_model: str
    ratio: float | None
    hosts: int
    within_host_bytes: int
    cross_host_bytes: int
    cross_host_ratio: float | None
    zeropp_cross_host_bytes: float | None


@_record
class GatherMismatch:
    """A gather of a quantized parameter's size sent at another element type.

    Attributes:
      name: the op's HLO name.
      dtype: the element type it sends.
      elements: its elements.
    """

    name: str
    dtype: str
    elements: int


@_record
class ParameterGathers:
    """What the compiled parameter gathers send (:func:`jzero.ledger.element_types.parameter_gathers`).

    Attributes:
      type: the HLO type the quantized values travel as.
      quantized_bytes: the bytes of those gathers per device per step.
      mismatched: the gathers of a quantized parameter's size sent otherwise.
    """

    type: str
    quantized_bytes: int
    mismatched: list[GatherMismatch]


@_record
class Quantization:
    """qwZ: what is quantized, what is gathered at full precision and why, and what the gathers send.

    Attributes:
      weights: the quantization asked for (``int8``).
      block: elements per scale.
      quantized: how many parameters are gathered quantized.
      quantized_bytes: their whole bytes.
      not_quantized: those gathered at full precision.
      gathers: what the compiled gathers send.
    """

    weights: str
    block: int
    quantized: int
    quantized_bytes: int
    not_quantized: list[ExcludedTensor]
    gathers: ParameterGathers


@_record
class ReductionMismatch:
    """A gradient reduction not sent as a quantized all-to-all.

    Attributes:
      name: the op's HLO name.
      kind: its op kind.
      dtype: its element type.
      bytes: its bytes per step.
    """

    name: str
    kind: str
    dtype: str
    bytes: int


@_record
class GradientReductions:
    """What the compiled gradient reductions send (:func:`jzero.ledger.element_types.gradient_reductions`).

    Attributes:
      type: the HLO type the values travel as.
      width: the quantization asked for.
      quantized_bytes: the all-to-alls' values, bytes per step.
      scale_bytes: their scales, bytes per step.
      mismatched: the reductions sent otherwise.
    """

    type: str
    width: str
    quantized_bytes: int
    scale_bytes: int
    mismatched: list[ReductionMismatch]


@_record
class GradientQuantization:
    """qgZ: the gradients reduced by quantized all-to-alls, those left whole, and what the reductions send.

    Attributes:
      gradients: the quantization asked for (``int8`` or ``int4``).
      quantized: how many gradients are reduced quantized.
      quantized_bytes: their whole bytes.
      smallest_block: the smallest quantization block among them.
      not_quantized: those all-reduced at full precision.
      reductions: what the compiled reductions send.
    """

    gradients: str
    quantized: int
    quantized_bytes: int
    smallest_block: int
    not_quantized: list[ExcludedTensor]
    reductions: GradientReductions


@_record
class Hierarchical:
    """hpZ: the secondary copy per device against the paper's formula, and what the layer loops save of it.

    Attributes:
      not_over_replica: the gathered tensors partitioned over ``data`` alone.
      secondary_bytes: the plan's secondary copy per device.
      formula_bytes: the formula's: parameters in the compute dtype over a host's devices and N_m.
      scanned_bytes: the scanned layers' share of the copy.
      saved_by_loops_bytes: what the compiled layer loops save of it.
    """

    not_over_replica: list[ExcludedTensor]
    secondary_bytes: int
    formula_bytes: float
    scanned_bytes: int
    saved_by_loops_bytes: int


@_record
class XlaOption:
    """An XLA option the step compiles with.

    Attributes:
      value: its value.
      from_: where it comes from: ``jzero``, ``XLA_FLAGS`` or ``compiler.xla_options`` (JSON key ``from``).
    """

    value: Any
    from_: str = _key("from")


@_record
class Compiler:
    """How the step was compiled.

    Attributes:
      xla_options: the XLA options in effect, by name.
    """

    xla_options: dict[str, XlaOption]


@_record
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


@_record
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


@_record
class CheckedPlanReport(PlanReport):
    """A plan report with its verdict against a memory budget, and the scaling ``jzero plan`` adds.

    Attributes:
      memory_per_device: the budget in bytes; None without one.
      fits: whether the device peak is within it; None without one.
      scaling: per-device work against one batch group's; left out until measured.
    """

    memory_per_device: float | None
    fits: bool | None
    scaling: Scaling | None = _omit()


@_record
class StagesReport:
    """``jzero plan --all-stages --json``: every stage's report.

    Attributes:
      stages: each stage's report, by the stage's number.
    """

    stages: dict[str, CheckedPlanReport]


@_record
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


@_record
class ProcessBytes:
    """Planned model-state bytes of one process's devices and of all.

    Attributes:
      per_process: one process's devices'.
      global_: every device's (JSON key ``global``).
    """

    per_process: int
    global_: int = _key("global")


@_record
class LiveProcessBytes:
    """Live parameter and optimizer bytes each process holds, and all of them.

    Attributes:
      per_process: each process's, in process order.
      global_: their sum (JSON key ``global``).
    """

    per_process: list[int]
    global_: int = _key("global")


@_record
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


@_record
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


@_record
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
    goodput: GoodputReport | None = _omit()


def _json_key(f: dataclasses.Field) -> str:
    return f.metadata.get("key", f.name)


def to_json(record: Any) -> Any:
    """A record (or a value inside one) as JSON data: the dict ``json.dumps`` writes.

    Args:
      record: a dataclass of this module, or a list, dict or plain value holding them.

    Returns:
      Dicts keyed by the JSON names in field order; a field marked ``omit`` is left out while None.
    """
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        out = {}
        for f in dataclasses.fields(record):
            value = getattr(record, f.name)
            if not (value is None and f.metadata.get("omit")):
                out[_json_key(f)] = to_json(value)
        return out
    if isinstance(record, dict):
        return {k: to_json(v) for k, v in record.items()}
    if isinstance(record, list | tuple):
        return [to_json(v) for v in record]
    return record


class RecordError(ValueError):
    """JSON that is not the record asked for; the message names the key path."""


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


_PLAIN = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}


def from_json(cls: Any, data: Any, path: str = "$") -> Any:
    """Read JSON data back as a record, strictly.

    Args:
      cls: the record's class (or a type hint: ``list[X]``, ``dict[str, X]``, ``X | None``, ...).
      data: what :func:`to_json` gave, or ``json.loads`` read.
      path: where ``data`` is, for the error message.

    Returns:
      The record; its values are the JSON's own (an integer stays an integer).

    Raises:
      ValueError: a missing or unknown key, or a value of another type, in one line naming its path
        (``$.stages.3.compiled: missing key 'peak'``).
    """
    origin, args = typing.get_origin(cls), typing.get_args(cls)
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return from_json(inner, data, path)
    if dataclasses.is_dataclass(cls):
        return _record_from_json(cls, data, path)
    if origin is list:
        _expect(data, list, path)
        return [from_json(args[0], v, f"{path}[{i}]") for i, v in enumerate(data)]
    if origin is dict:
        _expect(data, dict, path)
        return {k: from_json(args[1], v, f"{path}.{k}") for k, v in data.items()}
    if cls is Any:
        return data
    plain = _PLAIN[cls]
    if not isinstance(data, plain) or (isinstance(data, bool) and bool not in plain):
        raise RecordError(f"{path}: expected {cls.__name__}, got {type(data).__name__}")
    return data


def _expect(data: Any, kind: type, path: str) -> None:
    if not isinstance(data, kind):
        raise RecordError(f"{path}: expected {'an object' if kind is dict else 'a list'}, got {type(data).__name__}")


def _record_from_json(cls: type, data: Any, path: str) -> Any:
    _expect(data, dict, path)
    fields = {_json_key(f): f for f in dataclasses.fields(cls)}
    unknown = [k for k in data if k not in fields]
    if unknown:
        raise RecordError(f"{path}: unknown key {unknown[0]!r} for {cls.__name__}")
    values = {}
    for key, f in fields.items():
        if key in data:
            values[f.name] = from_json(_hints(cls)[f.name], data[key], f"{path}.{key}")
        elif not f.metadata.get("omit"):
            raise RecordError(f"{path}: missing key {key!r} for {cls.__name__}")
    return cls(**values)


_ATTRIBUTE = re.compile(r"^\s+(\w+): (.+?)\s*$")


def _descriptions(cls: type) -> dict[str, str]:
    """Each field's line in its class's docstring Attributes (the first line of each; a subclass's own win)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        doc = klass.__dict__.get("__doc__") or ""
        if "Attributes:" in doc:
            for line in doc.split("Attributes:", 1)[1].splitlines():
                if m := _ATTRIBUTE.match(line):
                    out[m.group(1)] = m.group(2)
    return out


def json_schema(cls: type) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a record's JSON, generated from its type hints.

    Every record is a ``$defs`` entry: an object of exactly its fields (``additionalProperties:
    false``), each required but those left out while None, each described from its class's
    docstring. ``dict[str, X]`` is an object of X values, ``X | None`` also accepts null, a float
    also accepts integers.

    Args:
      cls: the record's class; ``jzero plan --json-schema`` prints ``json_schema(PlanReport)``'s.

    Returns:
      The schema, a dict.
    """
    defs: dict[str, Any] = {}
    top = _schema_of(cls, defs)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **top, "$defs": dict(sorted(defs.items()))}


_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}


def _schema_of(hint: Any, defs: dict[str, Any]) -> dict[str, Any]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_schema_of(a, defs) for a in args]}
    if origin is list:
        return {"type": "array", "items": _schema_of(args[0], defs)}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema_of(args[1], defs)}
    if dataclasses.is_dataclass(hint):
        if hint.__name__ not in defs:
            defs[hint.__name__] = {}  # a placeholder first: a record may hold its own kind
            defs[hint.__name__] = _record_schema(hint, defs)
        return {"$ref": f"#/$defs/{hint.__name__}"}
    return {} if hint is Any else {"type": _TYPES[hint]}


def _record_schema(cls: type, defs: dict[str, Any]) -> dict[str, Any]:
    hints, said = _hints(cls), _descriptions(cls)
    properties, required = {}, []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if f.metadata.get("omit"):  # absent rather than null
            hint = typing.Union[tuple(a for a in typing.get_args(hint) if a is not type(None))]  # noqa: UP007
        else:
            required.append(_json_key(f))
        properties[_json_key(f)] = {**_schema_of(hint, defs), **({"description": said[f.name]} if f.name in said else {})}
    doc = (cls.__doc__ or "").strip().splitlines()[0]
    return {"type": "object", "description": doc, "properties": properties, "required": required, "additionalProperties": False}
