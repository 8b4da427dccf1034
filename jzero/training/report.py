"""What a compiled plan shows: the ``jzero plan --json`` report and the start-up ledger.

Each report is a record (:mod:`jzero.ledger.records`, rendered by :mod:`jzero.ledger.render`, its
JSON by :func:`jzero.ledger.records.to_json`): the plan's specs and bytes against
the paper's formulas (:mod:`jzero.sharding.stages`), the compiled step's memory, FLOPs and collectives
(:mod:`jzero.ledger.hlo`), and how per-device work scales against one batch group's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding

from jzero.communication.gather import UNIT_REMAT
from jzero.communication.quantize import Layout
from jzero.ledger import hlo as ledger
from jzero.ledger import targets
from jzero.ledger.element_types import gradient_reductions, parameter_gathers
from jzero.ledger.gathered import gathered_at_once as at_once
from jzero.ledger.levels import ZEROPP_CROSS_HOST_SHARE, bytes_by_level
from jzero.ledger.records import (
    Activations,
    AsyncCollective,
    BusBandwidth,
    CheckedPlanReport,
    CollectiveKind,
    Communication,
    CompiledHost,
    CompiledMemory,
    Compiler,
    ExcludedTensor,
    Gathered,
    GatherMismatch,
    GradientQuantization,
    GradientReductions,
    Hierarchical,
    HostBytes,
    LiveBytes,
    LiveProcessBytes,
    ModelFlops,
    PaperRow,
    PaperTable,
    ParameterGathers,
    PlanReport,
    Prediction,
    ProcessBytes,
    Processes,
    Quantization,
    ReductionMismatch,
    SavedKind,
    Scaling,
    StartupLedger,
    StateBytes,
    TensorEntry,
    TensorRow,
    XlaOption,
    to_json,
)
from jzero.ledger.saved import saved_by_kind, saved_by_unit, saved_unrolled
from jzero.ledger.timing import Hardware
from jzero.memory.offload import DEVICE, HOST
from jzero.memory.remat import offloads, policy_name
from jzero.models.names import GPT
from jzero.models.sizes import gpt_saved_per_layer, gpt_saved_role
from jzero.sharding.axes import BATCH_AXES, LAYERS, batch_ways, model_ways
from jzero.sharding.mesh import make_mesh, mesh_shape
from jzero.sharding.placement import sharded_abstract
from jzero.sharding.plan import Plan, TensorPlan, shard_bytes
from jzero.sharding.stages import STAGES, paper_bytes_per_device, paper_communication_bytes, stage_rule
from jzero.sharding.state import TrainState
from jzero.step import activation_rules
from jzero.training.job import Job, partitions_activations
from jzero.training.prediction import predicted

# HLO element types by their NumPy names, where the two differ.
_DTYPE_NAMES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}

__all__ = [
    "communication",
    "device_description",
    "hierarchical",
    "lowering_notes",
    "model_flops",
    "one_group_reference",
    "paper_table",
    "gradient_quantization",
    "plan_report",
    "quantization",
    "startup_ledger",
    "with_scaling",
    "with_verdict",
]


def lowering_notes(stage: int, collectives: dict[str, dict[str, Any]], hlo_text: str, backend: str = "cpu") -> list[str]:
    """Say what the HLO shows about the gradient reduction, and nothing more."""
    notes = []
    if stage_rule(stage).grads:  # the stage reduce-scatters its gradients
        if "all-to-all" in collectives and "reduce-scatter" not in collectives:
            notes.append("gradients are reduced with quantized all-to-alls (qgZ)")
        elif "reduce-scatter" in collectives:
            notes.append("gradients are reduced with reduce-scatter")
        elif "all-reduce" in collectives and "dynamic-slice" in hlo_text:
            notes.append(
                f"{backend} backend: no reduce-scatter op in the HLO; gradients are all-reduced "
                "and each device keeps its slice (dynamic-slice)"
            )
    return notes


def device_description(mesh: Any) -> dict[str, Any]:
    """What the program was compiled for, from the mesh's own devices (a GPU target's are
    compile-only, on a host whose default backend is the CPU)."""
    devices = list(mesh.devices.flat)
    return {
        "backend": devices[0].platform,
        "device_kind": devices[0].device_kind,
        "hosts": len({d.process_index for d in devices}),
    }


def plan_report(job: Job, compiled: Any = None, hardware: Hardware | None = None) -> PlanReport:
    """The ``jzero plan --json`` object: specs, bytes, formula, compiled memory and collectives.

    Args:
      job: the built job.
      compiled: the compiled step when the caller has it already (default: compiled here).
      hardware: the GPUs and network the prediction is for (:meth:`jzero.ledger.targets.Target.hardware`;
        default: the devices', :func:`jzero.training.prediction.predicted`).

    Returns:
      The report (rendered by :func:`jzero.ledger.render.format_plan`; its JSON is
      :func:`jzero.ledger.records.to_json`'s).
    """
    if compiled is None:
        _, compiled = job.compile_step()
    hlo = compiled.as_text()
    ops = ledger.parse_collectives(hlo)
    table = paper_table(job.plan)
    collectives = ledger.summarize_collectives(ops)
    plan = job.plan
    device = device_description(job.mesh)
    memory = _memory_part(job, compiled, hlo)
    # The step-time model reads the memory part as JSON data (jzero.training.prediction.step_cost).
    forecast = predicted(job, {k: to_json(v) for k, v in memory.items()}, hlo, ops, hardware)
    return PlanReport(
        devices=int(job.mesh.size),
        **device,
        mesh=mesh_shape(job.mesh),
        stage=plan.zero.stage,
        num_params=plan.num_params,
        **memory,
        predicted=_prediction(forecast),
        **_collectives_part(ops, collectives),
        notes=lowering_notes(plan.zero.stage, collectives, hlo, device["backend"]),
        **_tensors_part(plan),
        paper_table=table,
        communication=communication(plan, ops, table),
        quantization=quantization(plan, ops),
        gradient_quantization=gradient_quantization(plan, ops),
        attention=job.model.attention if job.model is not None else None,
        hierarchical=hierarchical(job, hlo),
        compiler=Compiler(xla_options={k: XlaOption(value=o["value"], from_=o["from"]) for k, o in job.xla_options().items()}),
    )


def _prediction(forecast: dict[str, Any] | None) -> Prediction | None:
    if forecast is None:
        return None
    return Prediction(**{**forecast, "bus_bandwidth": BusBandwidth(**forecast["bus_bandwidth"])})


def gradient_quantization(plan: Plan, ops: list[ledger.Collective]) -> GradientQuantization | None:
    """qgZ's part of the report: the gradients reduced by quantized all-to-alls, those whole at rest
    (whose gradients ``shard_map`` all-reduces at full precision), and what the compiled reductions
    really send (:func:`jzero.ledger.element_types.gradient_reductions`); None without qgZ."""
    if not plan.qgz:
        return None
    blocks = plan.gradient_blocks()
    by_path = {t.path: t for t in plan.tensors}
    reductions = gradient_reductions(ops, plan.zero.quantized_gradients)
    return GradientQuantization(
        gradients=plan.zero.quantized_gradients,
        quantized=len(blocks),
        quantized_bytes=sum(by_path[p].nbytes for p in blocks),
        smallest_block=min(blocks.values(), default=0),
        not_quantized=[_excluded(t, "whole at rest") for t in plan.tensors if t.path not in blocks],
        reductions=GradientReductions(**{**reductions, "mismatched": [ReductionMismatch(**m) for m in reductions["mismatched"]]}),
    )


def hierarchical(job: Job, hlo_text: str) -> Hierarchical | None:
    """hpZ's secondary copy per device: the plan's bytes, the paper's formula (the parameters in
    the compute dtype over the devices of a host, ``data``, and N_m), and what the compiled layer
    loops save of it (its scanned layers' stacks, found by shape); None without hpZ."""
    plan = job.plan
    if not plan.hpz:
        return None
    dtype = job.precision.compute_dtype
    itemsize = np.dtype(dtype).itemsize
    gathered = [t for t in plan.tensors if t.param_spec != t.replicated_spec]
    formula = sum(math.prod(t.shape) for t in gathered) * itemsize / plan.data_size / model_ways(plan.mesh.shape)
    stacks = [
        (np.dtype(dtype).name, NamedSharding(plan.mesh, plan.secondary_spec(t.param_spec)).shard_shape(t.shape))
        for t in gathered
        if (t.logical or (None,))[0] == LAYERS
    ]
    written = [(_DTYPE_NAMES.get(d, d), dims) for loop in ledger.forward_loop_writes(hlo_text) for d, dims, _, _ in loop]
    saved = 0
    for stack in stacks:
        if stack in written:
            written.remove(stack)
            saved += math.prod(stack[1]) * itemsize
    alone = [t for t in gathered if plan.secondary_spec(t.param_spec) == t.param_spec]
    return Hierarchical(
        not_over_replica=[_excluded(t, "replica x data divides none of its dimensions") for t in alone],
        secondary_bytes=plan.secondary_bytes(dtype),
        formula_bytes=formula,
        scanned_bytes=sum(math.prod(dims) * itemsize for _, dims in stacks),
        saved_by_loops_bytes=saved,
    )


def quantization(plan: Plan, ops: list[ledger.Collective]) -> Quantization | None:
    """qwZ's part of the report: what is quantized, what is gathered at full precision and why,
    and what the compiled gathers really send (:func:`jzero.ledger.element_types.parameter_gathers`);
    None when weights are not quantized."""
    layouts = plan.weight_layouts()
    if not layouts:
        return None
    by_path = {t.path: t for t in plan.tensors}
    quantized, others, kept = [], [], []
    for path, lay in layouts.items():
        shape, _, target = plan.parameter_gather(by_path[path])
        elements = math.prod(NamedSharding(plan.mesh, target).shard_shape(shape))
        if isinstance(lay, Layout):
            quantized.append(elements)
            others.append(lay.blocks * math.prod(NamedSharding(plan.mesh, target).shard_shape(shape)) // lay.local_size)
        else:
            others.append(elements)
            kept.append(_excluded(by_path[path], lay))
    gathers = parameter_gathers(ops, plan.zero.quantized_weights, quantized, others)
    return Quantization(
        weights=plan.zero.quantized_weights,
        block=plan.zero.quantization_block,
        quantized=len(quantized),
        quantized_bytes=sum(by_path[p].nbytes for p, lay in layouts.items() if isinstance(lay, Layout)),
        not_quantized=kept,
        gathers=ParameterGathers(**{**gathers, "mismatched": [GatherMismatch(**m) for m in gathers["mismatched"]]}),
    )


def _memory_part(job: Job, compiled: Any, hlo: str) -> dict[str, Any]:
    """The report's bytes, planned and compiled, and its FLOPs: :class:`PlanReport`'s fields by name."""
    plan = job.plan
    mem = ledger.compiled_memory(compiled, hlo)
    activations = saved_activations(job, hlo)
    gathered = gathered_at_once(job, hlo)
    return {
        "per_device_bytes": StateBytes(**plan.per_device_bytes()),
        "host_bytes": HostBytes(**plan.host_bytes(), activations=activations.host),
        "ideal_per_device_bytes": StateBytes(**plan.ideal_per_device_bytes()),
        "activations": activations,
        "compiled": CompiledMemory(**{k: mem[k] for k in ("argument", "output", "temp", "peak")}),
        "gathered_peak_bytes": gathered.peak_bytes,
        "gathered": gathered,
        # What rests in host memory among the arguments and outputs, and the peak without it.
        "compiled_host": CompiledHost(argument=mem["host_argument"], output=mem["host_output"]),
        "device_peak": mem["device_peak"],
        "flops_per_device": ledger.flops_per_device(compiled),
        "model_flops": model_flops(job),
    }


def model_flops(job: Job) -> ModelFlops:
    """The FLOPs one step needs (:attr:`~jzero.training.job.Job.flops_per_token` x the batch's tokens),
    in all and per device; where the device's dense bf16 peak is known, ``peak_floor_s``: the step's
    time at that peak, a floor no real step reaches."""
    tokens = job.config.train.global_batch_size * job.config.model.seq_len
    per_step = job.flops_per_token * tokens
    per_device = per_step / job.mesh.size
    peak = targets.device_peak_flops(job.mesh.devices.flat[0])
    return ModelFlops(
        per_token=job.flops_per_token,
        per_step=per_step,
        per_device_per_step=per_device,
        peak_flops=peak,
        peak_floor_s=per_device / peak if peak else None,
    )


def _collectives_part(ops: list[ledger.Collective], collectives: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The report's collectives: per kind, then each asynchronous one."""
    return {
        "collectives": {
            k: CollectiveKind(
                count=v["count"], bytes=v["bytes"], dtypes=v["dtypes"], async_=v["async"], overlapped=v["overlapped"]
            )
            for k, v in collectives.items()
        },
        "collectives_in_loop": {k: v["in_loop"] for k, v in collectives.items()},
        "collective_groups": {k: sorted({o.group_size for o in ops if o.kind == k and o.group_size}) for k in collectives},
        "async_collectives": [
            AsyncCollective(
                name=o.name,
                kind=o.kind,
                dtype=o.dtype,
                bytes=o.bytes,
                computation=o.computation,
                executions=o.executions,
                overlapped=o.overlapped,
            )
            for o in ops
            if o.is_async
        ],
    }


FROZEN = "frozen"  # a frozen parameter's gradient and optimizer specs: it has neither (train.trainable)


def _tensors_part(plan: Plan) -> dict[str, Any]:
    """The report's tensors: each one's specs, then the replicated, largest and not-on-``model`` ones."""
    return {
        "tensors": [
            TensorRow(
                path=t.path,
                shape=list(t.shape),
                dtype=str(t.dtype),
                param_spec=str(t.param_spec),
                grad_spec=str(t.grad_spec) if t.trainable else FROZEN,
                optimizer_spec=str(t.optimizer_spec) if t.trainable else FROZEN,
                param_bytes_per_device=shard_bytes(t.shape, t.dtype, t.param_spec, plan.mesh),
            )
            for t in plan.tensors
        ],
        "replicated": [_tensor_entry(t) for t in plan.replicated],
        "largest": [_tensor_entry(t) for t in sorted(plan.tensors, key=lambda t: t.nbytes, reverse=True)[:5]],
        "not_on_model": [_tensor_entry(t) for t in plan.not_on_model],
    }


def _tensor_entry(t: TensorPlan) -> TensorEntry:
    """A tensor named in a list: its path, shape and bytes."""
    return TensorEntry(path=t.path, shape=list(t.shape), bytes=t.nbytes)


def _excluded(t: TensorPlan, why: str) -> ExcludedTensor:
    """A tensor a ZeRO++ technique leaves out, and why."""
    return ExcludedTensor(path=t.path, shape=list(t.shape), bytes=t.nbytes, why=why)


def gathered_at_once(job: Job, hlo_text: str) -> Gathered:
    """What the job's step holds gathered at once (:func:`jzero.ledger.gathered.gathered_at_once`),
    with the gathering units by name (:attr:`jzero.sharding.plan.Plan.unit_tensors`) and the parameters left
    whole at rest for their size (``persistent``)."""
    plan = job.plan
    persistent = [_tensor_entry(t) for t in plan.persistent]
    return Gathered(**at_once(hlo_text, plan, job.precision), unit_tensors=plan.unit_tensors, persistent=persistent)


def saved_activations(job: Job, hlo_text: str) -> Activations:
    """What the layer loops save for the backward, per device (:func:`jzero.ledger.hlo.saved_activations`),
    with the remat policy and whether the saved inputs are partitioned over ``model``.

    Host bytes come from the compiled layout when the backend places them (``S(5)``). The CPU
    backend ignores an offloading policy's placement, so there the share the policy sends to host
    memory is read from the program's own residuals (the layer loop's outputs in host memory space).
    """
    cfg = job.config
    rows = cfg.train.global_batch_size // batch_ways(mesh_shape(job.mesh)) // cfg.train.microbatches
    saved = ledger.saved_activations(hlo_text, rows)
    partitioned = partitions_activations(cfg.model, model_ways(job.mesh.shape))
    if not saved["device"] and not saved["host"] and job.plan.units:
        return _saved_by_units(job, hlo_text, rows, partitioned)
    source = "compiled"
    if not saved["host"] and saved["device"] and _may_offload(job) and (share := _host_residual_share(job)):
        saved["host"] = round(saved["device"] * share)
        saved["device"] -= saved["host"]
        source = "policy"
    remat = policy_name(cfg.model.remat)
    out = {"device": saved["device"], "host": saved["host"], "remat": remat, "partitioned": partitioned, "host_from": source}
    return Activations(**out, saved_by="layer loops", **_saved_against_formula(job, hlo_text, rows, partitioned))


def _saved_by_units(job: Job, hlo_text: str, rows: int, partitioned: bool) -> Activations:
    """An unrolled model's saved values (:func:`jzero.ledger.saved.saved_unrolled`), by kind within
    its gathering units; the policy is the units' own checkpoints'."""
    values = saved_unrolled(hlo_text, rows)
    device = sum(v["bytes"] for v in values)
    out = {"device": device, "host": 0, "remat": UNIT_REMAT, "partitioned": partitioned, "host_from": "compiled"}
    by_kind = [SavedKind(**row) for row in saved_by_unit(values, job.plan.units)]
    return Activations(**out, saved_by="gathering units", by_kind=by_kind)


def _saved_against_formula(job: Job, hlo_text: str, rows: int, partitioned: bool) -> dict[str, Any]:
    """The layer loops' saved stacks by kind (:func:`jzero.ledger.saved.saved_by_kind`) and, for the
    GPT, each kind's bytes per layer by the formula of its remat policy; kinds over it are listed:
    :class:`Activations`' fields by name."""
    by_kind = saved_by_kind(hlo_text, rows)
    if job.model is None or job.config.model.name != GPT:  # the formula is jzero's GPT's
        return {"by_kind": [SavedKind(**row) for row in by_kind]}
    m, policy = job.config.model, policy_name(job.config.model.remat)
    itemsize = jnp.dtype(job.precision.compute_dtype or jnp.float32).itemsize
    formula = gpt_saved_per_layer(
        policy, rows, m.seq_len, m.d_model, m.n_heads, m.mlp_ratio, dtype_bytes=itemsize,
        attention=job.model.attention, model_parallel=model_ways(job.mesh.shape), partitioned=partitioned,
    )  # fmt: skip
    measured: dict[str, int] = {}
    for row in by_kind:
        row["role"] = gpt_saved_role(row["kind"], row["shape"])
        measured[row["role"]] = measured.get(row["role"], 0) + row["bytes_per_layer"]
    layers = max((row["layers"] for row in by_kind), default=m.n_layers)
    return {
        "by_kind": [SavedKind(**row) for row in by_kind],
        "formula": sum(formula.values()) * layers,
        "formula_by_kind": formula,
        "over_formula": sorted(role for role, nbytes in measured.items() if nbytes > formula.get(role, 0)),
        "korthikanti_none": 34 * rows * m.seq_len * m.d_model * layers,  # 16-bit, no recomputation
    }


def _may_offload(job: Job) -> bool:
    """Whether the step's residuals can be in host memory, which only a trace of the loss tells:
    jzero's models only with an offloading policy; a loss of yours with a policy of its own."""
    return job.model is None or offloads(job.config.model.remat)


def _host_residual_share(job: Job) -> float:
    """The share of the layer loops' saved bytes (global shapes) that the program asks to keep in
    host memory; traced, not compiled."""
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), sharded_abstract(job.abstract, job.plan).params)
    batch = jax.ShapeDtypeStruct(job.batch_shape, jnp.int32)
    with activation_rules(job.plan):
        jaxpr = jax.make_jaxpr(lambda p, b: jax.vjp(lambda q: job.loss_fn(q, b), p)[1])(params, batch)
    host = total = 0
    for eqn in _all_eqns(jaxpr.jaxpr):
        if eqn.primitive.name == "scan":
            for var in eqn.outvars[eqn.params["num_carry"] :]:
                nbytes = math.prod(var.aval.shape) * var.aval.dtype.itemsize
                total += nbytes
                host += nbytes if "host" in str(getattr(var.aval, "memory_space", "")).lower() else 0
    return host / total if total else 0.0


def _all_eqns(jaxpr: Any):
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _all_eqns(inner)


def one_group_reference(job: Job) -> dict[str, float | None]:
    """The same model and global batch compiled for one batch group (``data`` = ``replica`` = 1,
    stage 0): what each device's work and temporaries should be divided by N_d.

    Returns:
      ``{"flops", "temp"}`` per device of that program; both None on GPUs, where nothing is
      compiled: a GPU target's program has no FLOP count to scale, and one group's is the whole
      model's state on one GPU, which XLA warns cannot fit ("The byte size of input/output
      arguments (846652867956) exceeds the base limit" for Llama 3.1 70B on ``h100x128``).
    """
    if job.mesh.devices.flat[0].platform == "gpu":
        return {"flops": None, "temp": None}
    axes = {name: (1 if name in BATCH_AXES else size) for name, size in mesh_shape(job.mesh).items()}
    mesh = make_mesh(axes, list(job.mesh.devices.flat)[: math.prod(axes.values())])
    _, compiled = job.replan(stage=0, mesh=mesh).compile_step()
    return {"flops": ledger.flops_per_device(compiled), "temp": ledger.compiled_memory(compiled)["temp"]}


def with_scaling(report: CheckedPlanReport, reference: dict[str, float | None]) -> CheckedPlanReport:
    """The report with ``scaling``: per-device FLOPs and temporaries against one batch group's over N_d,
    and ``flags`` when either fails to shrink (GSPMD replicating work is as costly as a no-op stage)."""
    groups = batch_ways(report.mesh)
    flops, temp = report.flops_per_device, report.compiled.temp
    flops_ratio = flops / (reference["flops"] / groups) if flops and reference["flops"] else None
    temp_ratio = temp / reference["temp"] if reference["temp"] else None
    flags = []
    if groups > 1 and flops_ratio is not None and flops_ratio > 1.2:  # clean programs measure 1.00-1.01
        flags.append(f"per-device FLOPs are {flops_ratio:.1f}x one batch group's / {groups}: work is replicated across data")
    if groups > 1 and temp_ratio is not None and temp_ratio >= 1:
        flags.append(f"temporaries do not shrink with the data axis ({temp_ratio:.2f}x one batch group's)")
    scaling = Scaling(
        batch_groups=groups,
        flops_one_group=reference["flops"],
        flops_ratio_to_predicted=flops_ratio,
        temp_one_group=reference["temp"],
        temp_ratio=temp_ratio,
        flags=flags,
    )
    return dataclasses.replace(report, scaling=scaling)


def with_verdict(report: PlanReport, memory_per_device: float | None) -> CheckedPlanReport:
    """The report with ``memory_per_device`` and ``fits``: the compiled step's device peak (what rests
    in host memory left out) within it."""
    fits = None if memory_per_device is None else report.device_peak <= memory_per_device
    if isinstance(report, CheckedPlanReport):
        return dataclasses.replace(report, memory_per_device=memory_per_device, fits=fits)
    return CheckedPlanReport(**_fields(report, PlanReport), memory_per_device=memory_per_device, fits=fits)


def _fields(record: Any, cls: type) -> dict[str, Any]:
    """``cls``'s fields of ``record`` (an instance of it or of a subclass), by name: a shallow copy."""
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(cls)}


def startup_ledger(job: Job, compiled: Any, state: TrainState) -> StartupLedger:
    """The plan report of the step this run compiled, with the bytes its live state really holds."""
    report = plan_report(job, compiled)
    live = {}
    for key, kind in (("live_bytes_per_device", DEVICE), ("live_host_bytes_per_device", HOST)):
        params = ledger.live_bytes_per_device(state.params, kind)
        optimizer = ledger.live_bytes_per_device(state.opt_state, kind)
        live[key] = LiveBytes(params=params, optimizer=optimizer, total=params + optimizer)
    processes = process_figures(job, state, report.per_device_bytes.total)
    return StartupLedger(**_fields(report, PlanReport), **live, processes=processes)


def process_figures(job: Job, state: TrainState, planned_per_device: int) -> Processes:
    """The job's processes and what their devices hold: the planned model states of one process's
    devices and of all of them, and the live parameters and optimizer state each process holds
    (measured in every process and gathered, a collective when there are several)."""
    devices = list(job.mesh.devices.flat)
    local = sum(1 for d in devices if d.process_index == jax.process_index())
    live = ledger.live_bytes_per_process(state.params) + ledger.live_bytes_per_process(state.opt_state)
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


def communication(plan: Plan, ops: list[ledger.Collective], table: PaperTable) -> Communication:
    """Bytes per device per step from the compiled HLO (loops times their trip counts), against
    the paper's 2Ψ (stages 0-2) or 3Ψ (stage 3), sized from ``table`` (:func:`paper_table`).
    Tensor-parallel all-reduces count too. They are split by level as ZeRO++ counts them
    (:mod:`jzero.ledger.levels`): a collective whose group spans hosts is cross-host. At stage 3,
    ZeRO++'s own cross-host figure, 0.75Ψ of the paper's 3Ψ, stands beside them."""
    measured = ledger.communication_bytes(ops)
    paper = paper_communication_bytes(plan.num_params, plan.zero.stage, table.param_bytes, table.n_m)
    total = sum(measured.values())
    hosts = [d.process_index for d in plan.mesh.devices.flat]
    levels = bytes_by_level(ops, hosts)
    return Communication(
        bytes_per_step=measured,
        by_dtype=ledger.communication_by_dtype(ops),
        total=total,
        paper=paper,
        paper_model=f"{plan.rule.communication_units}Ψ",
        ratio=total / paper if paper else None,
        hosts=len(set(hosts)),
        within_host_bytes=levels["within_host"],
        cross_host_bytes=levels["cross_host"],
        cross_host_ratio=levels["cross_host"] / paper if paper else None,
        zeropp_cross_host_bytes=paper * ZEROPP_CROSS_HOST_SHARE if plan.rule.params else None,
    )


def paper_table(plan: Plan) -> PaperTable:
    """The paper's per-stage model-state bytes for this model and mesh (its Figure 1 / Table 1 style):
    (p + g + K)Ψ with the stage's parts over N_d, then over N_m, where p and g are the parameter and
    gradient bytes and K the optimizer-state bytes per parameter. With frozen parameters the
    gradients and K cover the Ψ_t that train: pΨ + (g + K)Ψ_t."""
    psi = plan.num_params
    trained = [t for t in plan.tensors if t.trainable]
    psi_t = sum(math.prod(t.shape) for t in trained)
    param_bytes = sum(t.nbytes for t in plan.tensors) / psi
    opt_bytes = sum(math.prod(shape) * dtype.itemsize for _, shape, dtype, _ in plan.opt_leaves)
    n_d = plan.partition_size
    n_m = model_ways(plan.mesh.shape)
    # Over Ψ: the gradients' and the optimizer's bytes per parameter of the whole model.
    sizes = {"k": opt_bytes / psi, "param_bytes": param_bytes, "grad_bytes": sum(t.nbytes for t in trained) / psi, "n_m": n_m}
    rows = [
        PaperRow(stage=stage, partitioned=rule.partitioned, bytes=paper_bytes_per_device(psi, stage, n_d, **sizes))
        for stage, rule in STAGES.items()
    ]
    k = opt_bytes / psi_t if psi_t else 0.0
    trainable = psi_t if psi_t != psi else None
    return PaperTable(psi=psi, k=round(k, 3), param_bytes=param_bytes, n_d=n_d, n_m=n_m, rows=rows, trainable=trainable)
