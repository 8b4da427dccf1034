"""What a compiled plan shows: the ``jzero plan --json`` report, built from a compiled step and what it
was built from (:class:`~jzero.ledger.inputs.ReportInputs`: the plan, the precision, the model's config), never from a
training job.

Each report is a record (:mod:`jzero.ledger.report`, each part beside the instrument that makes it,
rendered by :mod:`jzero.ledger.render`, its JSON by :func:`jzero.records.to_json`): the plan's specs and bytes against
the paper's formulas (:mod:`jzero.sharding.stages`), the compiled step's memory, FLOPs and collectives
(:mod:`jzero.ledger.hlo`), and how per-device work scales against one batch group's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp

from jzero.communication.gather import UNIT_REMAT
from jzero.dtypes import array_bytes
from jzero.ledger import hlo as ledger
from jzero.ledger import targets
from jzero.ledger.collectives import async_collectives, collective_kinds
from jzero.ledger.float8 import float8_gathers, float8_report
from jzero.ledger.flops import ModelFlops, fused_attention_windows
from jzero.ledger.gathered import Gathered
from jzero.ledger.gathered import gathered_at_once as at_once
from jzero.ledger.inputs import ReportInputs
from jzero.ledger.levels import ZEROPP_CROSS_HOST_SHARE, Communication, bytes_by_level
from jzero.ledger.memory import CompiledHost, CompiledMemory
from jzero.ledger.prediction import StepParts, predicted
from jzero.ledger.report import CheckedPlanReport, Compiler, PaperRow, PaperTable, PlanReport, Scaling, XlaOption
from jzero.ledger.saved import Activations, saved_by_kind, saved_by_unit, saved_unrolled
from jzero.ledger.tensors import largest, tensor_entry, tensor_rows
from jzero.ledger.timing import Hardware
from jzero.ledger.zeropp import gradient_quantization, hierarchical, quantization
from jzero.memory.remat import offloads, policy_name
from jzero.models.names import GPT
from jzero.models.sizes import gpt_saved_per_layer, gpt_saved_role
from jzero.records import extend
from jzero.sharding.axes import LAYERS, batch_ways, model_ways
from jzero.sharding.mesh import mesh_shape
from jzero.sharding.plan import Plan
from jzero.sharding.stages import STAGES, HostBytes, paper_bytes_per_device, paper_communication_bytes, stage_rule

__all__ = [
    "communication",
    "device_description",
    "gathered_at_once",
    "lowering_notes",
    "model_flops",
    "paper_table",
    "plan_report",
    "saved_activations",
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


def plan_report(inputs: ReportInputs, compiled: Any, hardware: Hardware | None = None) -> PlanReport:
    """The ``jzero plan --json`` object: specs, bytes, formula, compiled memory and collectives.

    Args:
      inputs: what the step was compiled from (:func:`jzero.training.report.report_inputs`).
      compiled: the compiled step (:meth:`jzero.training.job.Job.compile_step`'s).
      hardware: the GPUs and network the prediction is for (:meth:`jzero.ledger.targets.Target.hardware`;
        default: the devices', :func:`jzero.ledger.prediction.predicted`).

    Returns:
      The report (rendered by :func:`jzero.ledger.render.format_plan`; its JSON is
      :func:`jzero.records.to_json`'s).
    """
    hlo, plan = compiled.as_text(), inputs.plan
    ops, table, device = ledger.parse_collectives(hlo), paper_table(plan), device_description(plan.mesh)
    summary, mem = ledger.summarize_collectives(ops), ledger.compiled_memory(compiled, hlo)
    activations, gathered, flops = saved_activations(inputs, hlo), gathered_at_once(inputs, hlo), model_flops(inputs)
    host = CompiledHost(argument=mem["host_argument"], output=mem["host_output"])
    return PlanReport(
        devices=int(plan.mesh.size),
        backend=device["backend"],
        device_kind=device["device_kind"],
        hosts=device["hosts"],
        mesh=mesh_shape(plan.mesh),
        stage=plan.zero.stage,
        num_params=plan.num_params,
        per_device_bytes=plan.per_device_bytes(),
        host_bytes=HostBytes.of(plan.host_bytes(), activations.host),
        ideal_per_device_bytes=plan.ideal_per_device_bytes(),
        activations=activations,
        compiled=CompiledMemory(argument=mem["argument"], output=mem["output"], temp=mem["temp"], peak=mem["peak"]),
        gathered_peak_bytes=gathered.peak_bytes,
        gathered=gathered,
        compiled_host=host,  # what rests in host memory among the arguments and outputs
        device_peak=mem["device_peak"],  # the peak without it
        flops_per_device=ledger.flops_per_device(compiled),
        model_flops=flops,
        predicted=predicted(inputs, StepParts(flops, host, activations), hlo, ops, hardware),
        collectives=collective_kinds(summary),
        collectives_in_loop={k: v["in_loop"] for k, v in summary.items()},
        collective_groups={k: sorted({o.group_size for o in ops if o.kind == k and o.group_size}) for k in summary},
        async_collectives=async_collectives(ops),
        notes=lowering_notes(plan.zero.stage, summary, hlo, device["backend"]),
        tensors=tensor_rows(plan),
        replicated=[tensor_entry(t) for t in plan.replicated],
        largest=largest(plan),
        not_on_model=[tensor_entry(t) for t in plan.not_on_model],
        paper_table=table,
        communication=communication(plan, ops, table),
        quantization=quantization(plan, ops),
        gradient_quantization=gradient_quantization(plan, ops),
        attention=inputs.attention,
        attention_windows=fused_attention_windows(hlo) or None,
        fp8=float8_report(hlo, inputs.precision.fp8, projections(plan), device["backend"]),
        fp8_gather=float8_gathers(ops, plan, inputs.precision.compute_dtype or jnp.float32),
        hierarchical=hierarchical(plan, inputs.precision, hlo),
        compiler=Compiler(xla_options={k: XlaOption(value=o["value"], from_=o["from"]) for k, o in inputs.xla_options.items()}),
    )


def projections(plan: Plan) -> dict[str, tuple[int, ...]]:
    """The layers' projections, by module path: each 2-D kernel of a scanned stack, with its shape
    in one layer (what ``precision.fp8`` converts)."""
    return {
        t.path.removesuffix("/kernel"): tuple(t.shape[1:])
        for t in plan.tensors
        if t.path.endswith("/kernel") and len(t.shape) == 3 and (t.logical or (None,))[0] == LAYERS
    }


def model_flops(inputs: ReportInputs) -> ModelFlops:
    """The FLOPs one step needs (the inputs' ``flops_per_token`` x the batch's tokens), in all
    and per device; where the device's dense bf16 peak is known, ``peak_floor_s``: the step's time
    at that peak, a floor no real step reaches."""
    mesh = inputs.plan.mesh
    per_step = inputs.flops_per_token * inputs.tokens
    per_device = per_step / mesh.size
    peak = targets.device_peak_flops(mesh.devices.flat[0])
    return ModelFlops(
        per_token=inputs.flops_per_token,
        per_step=per_step,
        per_device_per_step=per_device,
        peak_flops=peak,
        peak_floor_s=per_device / peak if peak else None,
    )


def gathered_at_once(inputs: ReportInputs, hlo_text: str) -> Gathered:
    """What the step holds gathered at once (:func:`jzero.ledger.gathered.gathered_at_once`),
    with the gathering units by name (:attr:`jzero.sharding.plan.Plan.unit_tensors`) and the parameters left
    whole at rest for their size (``persistent``)."""
    return at_once(hlo_text, inputs.plan, inputs.precision)


def saved_activations(inputs: ReportInputs, hlo_text: str) -> Activations:
    """What the layer loops save for the backward, per device (:func:`jzero.ledger.hlo.saved_activations`),
    with the remat policy and whether the saved inputs are partitioned over ``model``.

    Host bytes come from the compiled layout when the backend places them (``S(5)``). The CPU
    backend ignores an offloading policy's placement, so there the share the policy sends to host
    memory is read from the program's own residuals (the layer loop's outputs in host memory space).
    """
    mesh = inputs.plan.mesh
    rows = inputs.global_batch_size // batch_ways(mesh_shape(mesh)) // inputs.microbatches
    saved = ledger.saved_activations(hlo_text, rows)
    partitioned = inputs.model.partitions_activations(model_ways(mesh.shape))
    if not saved["device"] and not saved["host"] and inputs.plan.units:
        return _saved_by_units(inputs, hlo_text, rows, partitioned)
    source = "compiled"
    if not saved["host"] and saved["device"] and _may_offload(inputs) and (share := inputs.host_residual_share()):
        saved["host"] = round(saved["device"] * share)
        saved["device"] -= saved["host"]
        source = "policy"
    loops = Activations(
        device=saved["device"], host=saved["host"], remat=policy_name(inputs.model.remat), partitioned=partitioned,
        host_from=source, saved_by="layer loops", by_kind=saved_by_kind(hlo_text, rows),
    )  # fmt: skip
    return _against_formula(inputs, loops, rows)


def _saved_by_units(inputs: ReportInputs, hlo_text: str, rows: int, partitioned: bool) -> Activations:
    """An unrolled model's saved values (:func:`jzero.ledger.saved.saved_unrolled`), by kind within
    its gathering units; the policy is the units' own checkpoints'."""
    values = saved_unrolled(hlo_text, rows)
    return Activations(
        device=sum(v["bytes"] for v in values), host=0, remat=UNIT_REMAT, partitioned=partitioned, host_from="compiled",
        saved_by="gathering units", by_kind=saved_by_unit(values, inputs.plan.units),
    )  # fmt: skip


def _against_formula(inputs: ReportInputs, loops: Activations, rows: int) -> Activations:
    """For jzero's GPT, ``loops`` with each saved kind's role and bytes per layer by the formula of
    its remat policy, and the kinds saved over it; other models' as they are."""
    if inputs.own_model or inputs.model.name != GPT:  # the formula is jzero's GPT's
        return loops
    m, policy = inputs.model, policy_name(inputs.model.remat)
    itemsize = jnp.dtype(inputs.precision.compute_dtype or jnp.float32).itemsize
    formula = gpt_saved_per_layer(
        policy, rows, m.seq_len, m.d_model, m.n_heads, m.mlp_ratio, dtype_bytes=itemsize,
        attention=inputs.attention, model_parallel=model_ways(inputs.plan.mesh.shape), partitioned=loops.partitioned,
    )  # fmt: skip
    by_kind = [dataclasses.replace(row, role=gpt_saved_role(row.kind, row.shape)) for row in loops.by_kind]
    measured: dict[str, int] = {}
    for row in by_kind:
        measured[row.role] = measured.get(row.role, 0) + row.bytes_per_layer
    layers = max((row.layers for row in by_kind), default=m.n_layers)
    return dataclasses.replace(
        loops,
        by_kind=by_kind,
        formula=sum(formula.values()) * layers,
        formula_by_kind=formula,
        over_formula=sorted(role for role, nbytes in measured.items() if nbytes > formula.get(role, 0)),
        korthikanti_none=34 * rows * m.seq_len * m.d_model * layers,  # 16-bit, no recomputation
    )


def _may_offload(inputs: ReportInputs) -> bool:
    """Whether the step's residuals can be in host memory, which only a trace of the loss tells:
    jzero's models only with an offloading policy; a loss of yours with a policy of its own."""
    return inputs.own_model or offloads(inputs.model.remat)


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
    return extend(report, CheckedPlanReport, memory_per_device=memory_per_device, fits=fits)


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
    opt_bytes = sum(array_bytes(shape, dtype) for _, shape, dtype, _ in plan.opt_leaves)
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
