"""Human-readable renderings of the plan and ledger reports (``jzero plan``, ``jzero train``'s
startup summary). The reports themselves are records (:mod:`jzero.ledger.report`, each part beside its instrument), built by
:mod:`jzero.training.report`."""

from __future__ import annotations

from typing import Any

from jzero.lazy import moved_names
from jzero.ledger.levels import Communication
from jzero.ledger.report import CheckedPlanReport, PlanReport
from jzero.ledger.saved import Activations, SavedKind
from jzero.ledger.startup import StartupLedger
from jzero.ledger.tensors import ExcludedTensor, TensorEntry
from jzero.ledger.timing import Prediction
from jzero.ledger.zeropp import GradientQuantization, Hierarchical, Quantization
from jzero.sharding.axes import mesh_text

__all__ = ["devices_text", "flops_text", "format_ledger_summary", "format_plan", "human_bytes"]

__getattr__ = moved_names(__name__, {"format_all_stages": "jzero.ledger.stages_table.format_all_stages"})  # until 0.2.0


def human_bytes(n: float) -> str:
    """1024-based: ``1.64 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def _tensor_list(title: str, tensors: list[TensorEntry], remark: str = "") -> list[str]:
    """A titled list of tensors with their bytes, or nothing when there are none."""
    if not tensors:
        return []
    total = sum(t.bytes for t in tensors)
    return [f"{title}: {len(tensors)} tensors, {human_bytes(total)}{remark}"] + [
        f"  {t.path} {t.shape} {human_bytes(t.bytes)}" for t in tensors
    ]


def devices_text(report: PlanReport) -> str:
    """``8 cpu devices``, or ``64 NVIDIA H100 80GB HBM3 (gpu) devices on 8 hosts`` for a target."""
    kind = report.device_kind or report.backend
    label = kind if kind == report.backend else f"{kind} ({report.backend})"
    hosts = report.hosts
    return f"{report.devices} {label} devices" + (f" on {hosts} hosts" if hosts > 1 else "")


def flops_text(report: PlanReport) -> str:
    """XLA's FLOPs per device, or "not available" (a GPU target's compile has no cost analysis)."""
    flops = report.flops_per_device
    return "not available" if flops is None else f"{flops:.3g}"


def _model_flops_lines(report: PlanReport) -> list[str]:
    """The FLOPs the model needs per step, and the step time at the device's peak where it is known."""
    m = report.model_flops
    line = f"model FLOPs per step {m.per_step:.3g}, {m.per_device_per_step:.3g} per device ({m.per_token:.3g} per token)"
    if m.peak_floor_s is not None:
        line += f"; at the dense bf16 peak ({m.peak_flops / 1e12:.0f} TFLOP/s) no less than {1e3 * m.peak_floor_s:.3g} ms"
    return [line, *_predicted_lines(report.predicted)]


def _float8_share(p: Prediction) -> str:
    return f", float8 GEMMs at {p.float8_efficiency:.0%} of theirs" if p.float8_efficiency else ""


def _predicted_lines(p: Prediction | None) -> list[str]:
    """The step-time model's prediction (:func:`jzero.ledger.timing.predict`), where there is one."""
    if not p:
        return []
    if p.error:
        return [f"predicted step: not available: {p.error}"]
    return [
        f"predicted step {1e3 * p.step_time_s:.4g} ms, {p.tokens_per_sec:,.0f} tokens/s, MFU {100 * p.mfu:.1f}% "
        f"(model FLOPs per second over the peak; {p.bound}-bound; a prediction with matmuls at {p.efficiency:.0%} "
        f"of the peak{_float8_share(p)}, docs/planner.md)",
        f"  compute {1e3 * p.compute_s:.4g} ms ({p.executed_over_model_flops:.2f}x the model's FLOPs executed), "
        f"memory {1e3 * p.memory_s:.3g} ms, communication {1e3 * p.communication_s:.4g} ms of which exposed "
        f"{1e3 * p.exposed_communication_s:.4g} ms, host transfers {1e3 * p.host_transfer_s:.4g} ms",
        *_exposed_line(p),
    ]


def _exposed_line(p: Prediction) -> list[str]:
    """The communication exposed per level, and the share of it hidden behind compute."""
    if not p.communication_s:
        return []
    levels = [
        f"{words} {1e3 * exposed:.4g} of {1e3 * sent:.4g} ms"
        for words, sent, exposed in (
            ("within a host", p.communication_within_host_s, p.exposed_within_host_s),
            ("across hosts", p.communication_across_hosts_s, p.exposed_across_hosts_s),
        )
        if sent
    ]
    share = p.hidden_communication_share
    bus = p.bus_bandwidth
    return [
        f"  exposed communication {', '.join(levels)}; {share:.0%} of the collectives' time hidden behind compute",
        f"  bus bandwidth (predicted, as nccl-tests' busbw): within a host {bus.within_host / 1e9:.4g} GB/s, "
        f"across hosts {bus.across_hosts / 1e9:.4g} GB/s",
    ]


def format_plan(report: PlanReport) -> str:
    """``jzero plan``'s text: each tensor's shardings, the model states against the paper's formula,
    the compiled step, its collectives and traffic, the paper's table, then notes and lists.

    Args:
      report: a plan report (:func:`jzero.training.report.plan_report`), with its verdict and scaling if any.

    Returns:
      The lines joined by newlines, with no newline at the end.
    """
    lines = [
        *_tensor_table(report),
        "",
        *_model_states_table(report),
        "",
        *_compiled_lines(report),
        *_collective_lines(report),
        *_communication_lines(report),
        *_quantization_lines(report.quantization),
        *_gradient_quantization_lines(report.gradient_quantization),
        *_hierarchical_lines(report.hierarchical),
        *_scaling_lines(report),
        "",
        *_paper_table(report),
        "",
        *_xla_options_line(report),
        *(f"note: {note}" for note in report.notes),
        *_tensor_list("largest tensors (whole)", report.largest),
        *_fit_line(report),
        *_tensor_list("replicated over data (no dimension divisible by it)", report.replicated),
        *_tensor_list(
            "not split by the model rules",
            report.not_on_model,
            " (ZeRO still partitions them over data x model at stages >= 1)",
        ),
    ]
    return "\n".join(lines)


def _xla_options_line(report: PlanReport) -> list[str]:
    """The XLA options the step compiled with, each with where it came from (jzero, XLA_FLAGS or the config)."""
    options = report.compiler.xla_options
    shown = [f"{name}={_flag_value(o.value)} ({o.from_})" for name, o in options.items()]
    return [f"XLA options: {', '.join(shown) or 'none'}"]


def _flag_value(value: Any) -> str:
    """A value as XLA_FLAGS writes it: booleans in lowercase."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _tensor_table(report: PlanReport) -> list[str]:
    """The plan's title, then one row per tensor: its shape, three specs and parameter bytes per device."""
    mesh = mesh_text(report.mesh)
    lines = [
        f"jzero plan: ZeRO stage {report.stage} on mesh {mesh} ({devices_text(report)}), {report.num_params:,} parameters",
        "",
        f"{'tensor':<32} {'shape':<16} {'params':<24} {'grads':<24} {'optimizer':<24} {'param bytes/dev':>15}",
    ]
    for t in report.tensors:
        shape = "x".join(map(str, t.shape))
        lines.append(
            f"{t.path:<32} {shape:<16} {t.param_spec:<24} {t.grad_spec:<24} {t.optimizer_spec:<24} "
            f"{human_bytes(t.param_bytes_per_device):>15}"
        )
    return lines


def _model_states_table(report: PlanReport) -> list[str]:
    """Params, grads, optimizer and total per device: planned, in host memory, the formula's, the ratio."""
    lines = [f"{'model states per device':<24} {'plan':>12} {'host memory':>12} {'paper formula':>14} {'ratio':>7}"]
    for key in ("params", "grads", "optimizer", "total"):
        got, ideal = getattr(report.per_device_bytes, key), getattr(report.ideal_per_device_bytes, key)
        off = getattr(report.host_bytes, key)
        ratio = (got + off) / ideal if ideal else float("nan")
        lines.append(f"{key:<24} {human_bytes(got):>12} {human_bytes(off):>12} {human_bytes(ideal):>14} {ratio:>7.3f}")
    return [*lines, "(ratio: plan + host memory over the paper formula; above 1.000, some tensor is held whole)"]


def _compiled_lines(report: PlanReport) -> list[str]:
    """The compiled step's memory and FLOPs, what it gathers at once and what rests in host memory."""
    c = report.compiled
    return [
        f"compiled step, per device: arguments {human_bytes(c.argument)}, outputs {human_bytes(c.output)}, "
        f"temporaries {human_bytes(c.temp)}, peak {human_bytes(c.peak)} (arguments + temporaries + unaliased outputs)"
        + f"; FLOPs {flops_text(report)} (XLA's cost analysis)",
        *_model_flops_lines(report),
        *_gathered_lines(report),
        *_host_lines(report),
    ]


def _collective_lines(report: PlanReport) -> list[str]:
    """One row per collective kind in the HLO: ops (and how many in loops), dtypes, bytes, groups."""
    lines = ["collectives in the compiled HLO (ops in program text; a loop body's ops count once):"]
    if not report.collectives:
        lines.append("  none")
    for kind, v in sorted(report.collectives.items()):
        inside = report.collectives_in_loop.get(kind, 0)
        groups = "/".join(map(str, report.collective_groups.get(kind, [])))
        groups = f"  groups of {groups} devices" if groups else ""
        dtypes = "+".join(v.dtypes) or "?"
        overlap = f", {v.overlapped} of {v.async_} async overlap compute" if v.async_ else ""
        lines.append(
            f"  {kind:<20} {v.count:>4} ops ({inside} inside loops{overlap})  {dtypes:<8} "
            f"{human_bytes(v.bytes):>12}{groups}"
        )
    return lines


def _paper_table(report: PlanReport) -> list[str]:
    """The paper's bytes per device at each stage for this model, marking the planned stage."""
    t = report.paper_table
    trains = f" (Ψ_t = {t.trainable:,} train: grads and K over them)" if t.trainable is not None else ""
    lines = [
        f"the paper's table for this model: Ψ = {t.psi:,}{trains}, {t.param_bytes:g}-byte params and grads, "
        f"K = {t.k:g}, N_d = {t.n_d}, N_m = {t.n_m}",
        f"  {'stage':<6} {'partitioned':<18} {'bytes per device':>16}",
    ]
    for row in t.rows:
        mark = "  <- this plan" if row.stage == report.stage else ""
        lines.append(f"  {row.stage:<6} {row.partitioned:<18} {row.bytes / 1e9:>13.3f} GB{mark}")
    return lines


def format_ledger_summary(report: PlanReport) -> str:
    """A few lines for the start of a run: bytes against the formula, compiled memory, traffic."""
    mesh = mesh_text(report.mesh)
    got, ideal, host = report.per_device_bytes, report.ideal_per_device_bytes, report.host_bytes
    c = report.compiled
    lines = [
        f"ledger: ZeRO stage {report.stage} on {mesh} ({devices_text(report)}), {report.num_params:,} parameters",
        f"  model states per device: {human_bytes(got.total)} planned"
        + (f" + {human_bytes(host.total)} in host memory" if host.total else "")
        + f", paper formula {human_bytes(ideal.total)}"
        + f" (planned over formula {(got.total + host.total) / ideal.total:.3f})",
    ]
    if isinstance(report, StartupLedger):
        live, live_host = report.live_bytes_per_device, report.live_host_bytes_per_device
        on_host = f"; in host memory: params {human_bytes(live_host.params)}, optimizer {human_bytes(live_host.optimizer)}"
        lines.append(
            f"  live now: params {human_bytes(live.params)}, optimizer {human_bytes(live.optimizer)}"
            f" (+ gradients {human_bytes(got.grads)} inside the step)" + (on_host if live_host.total else "")
        )
    lines.append(
        f"  compiled step: arguments {human_bytes(c.argument)}, temporaries {human_bytes(c.temp)}, "
        f"peak {human_bytes(c.peak)}, FLOPs {flops_text(report)} per device"
    )
    lines += ["  " + line for line in [*_gathered_lines(report), *_host_lines(report)]]
    traffic = ", ".join(
        f"{k} {v.count} ops {'+'.join(v.dtypes)} {human_bytes(v.bytes)}" for k, v in sorted(report.collectives.items())
    )
    lines.append(f"  collectives: {traffic or 'none'}")
    processes = report.processes if isinstance(report, StartupLedger) else None
    if processes is not None and processes.count > 1:
        planned, live_bytes = processes.planned_model_state_bytes, processes.live_bytes
        lines.append(
            f"  processes: {processes.count} x {processes.devices_per_process} devices; model states "
            f"{human_bytes(planned.per_process)} per process planned, {human_bytes(planned.global_)} in all; "
            f"live {' + '.join(human_bytes(b) for b in live_bytes.per_process)} = {human_bytes(live_bytes.global_)}"
        )
    return "\n".join(lines)


def _host_lines(report: PlanReport) -> list[str]:
    """Host memory in the compiled step, and what the layer loops save for the backward."""
    host, lines = report.compiled_host, []
    if host.argument or host.output:
        lines.append(
            f"host memory: arguments {human_bytes(host.argument)}, outputs {human_bytes(host.output)}; "
            f"device peak {human_bytes(report.device_peak)} (the peak without them)"
        )
    a = report.activations
    if a.device or a.host:
        where = f", {human_bytes(a.host)} in host memory" + (" (as the policy asks)" if a.host_from == "policy" else "")
        split = ", split over model" if a.partitioned else ""
        lines.append(
            f"saved for the backward by the {a.saved_by}: {human_bytes(a.device)} per device"
            + (where if a.host else "")
            + f" (remat {a.remat}{split})"
        )
        lines += _saved_kind_lines(a)
    if report.attention:
        lines.append(f"attention: {report.attention} (jax.nn.dot_product_attention, model.attention)")
    if report.attention_windows:
        windows = sorted(report.attention_windows.items())
        calls = ", ".join(f"{'no window' if w == '0' else f'a window of {w}'}: {n}" for w, n in windows)
        lines.append(f"  cuDNN's fused calls (forward and backward) by sliding window: {calls}")
    return lines + _float8_lines(report) + _float8_gather_lines(report)


def _float8_lines(report: PlanReport) -> list[str]:
    """The float8 GEMMs in the program against the projections that asked, and what stayed in 16 bits."""
    f = report.fp8
    if f is None:
        return []
    lines = [
        f"float8 ({f.recipe}): {f.covered} of {f.requested} layer projections have every GEMM in float8 (forward and"
        f" backward); {f.gemms} float8 GEMMs in the program, {f.other_gemms} others"
    ]
    return lines + [f"  not float8: {k.name}: {k.why}" for k in f.kept_bf16]


def _float8_gather_lines(report: PlanReport) -> list[str]:
    g = report.fp8_gather
    if g is None:
        return []
    others = ", ".join(f"{human_bytes(b)} in {t}" for t, b in sorted(g.other_bytes.items()))
    ratio = f": {g.ratio:.3f} of the {human_bytes(g.compute_dtype_bytes)} they send in the compute dtype" if g.ratio else ""
    sent = f"{human_bytes(g.float8_bytes)} as f8e4m3fn, {others or 'nothing else'}"
    return [f"float8 parameter gathers per device per step: {sent}{ratio}"]


def _saved_kind_lines(a: Activations) -> list[str]:
    """One layer's saved stacks by kind, beside the GPT's formula for the remat policy; rows over it flagged."""
    if a.formula is None:
        return [f"  {r.kind:<26} {r.dtype}{r.shape}: {human_bytes(r.bytes_per_layer)}{_where(r)}" for r in a.by_kind]
    saved = a.device + a.host
    lines = [
        f"  per layer, by kind, against the formula for remat {a.remat} ({human_bytes(a.formula)} in all, "
        f"saved {saved / a.formula:.3f} of it; Korthikanti et al.'s 34 s b h per layer, 16-bit, no recomputation: "
        f"{human_bytes(a.korthikanti_none)}, saved {saved / a.korthikanti_none:.2f} of it)"
    ]
    roles: dict[str, list[SavedKind]] = {}
    for r in a.by_kind:
        roles.setdefault(r.role, []).append(r)
    formula = a.formula_by_kind or {}
    for role in [*formula, *(r for r in roles if r not in formula)]:
        rows = roles.get(role, [])
        what = " + ".join(f"{r.dtype}{r.shape}" for r in rows) or "nothing"
        got, want = sum(r.bytes_per_layer for r in rows), formula.get(role, 0)
        flag = "  <- over the formula" if role in (a.over_formula or []) else ""
        lines.append(f"    {role:<10} {what:<40} {human_bytes(got):>11}  formula {human_bytes(want):>11}{flag}")
    return lines


def _where(row: SavedKind) -> str:
    """Where a saved kind of an unrolled model is saved: in how many gathering units."""
    if row.in_units is None:
        return ""
    n = row.layers
    if not row.in_units:
        return " (outside the units)" if n == 1 else f" (outside the units, {n} of them)"
    return f" in each of {n} units" if n > 1 else " in 1 unit"


def _gathered_lines(report: PlanReport) -> list[str]:
    """What the step holds gathered at once, against the whole parameters and one layer."""
    g = report.gathered
    if not g.peak_bytes:
        return []
    layers = f", {g.layers:.2f} layers' worth" if g.layers else ""
    units = f"{g.units} gathering units, prefetch {g.prefetch}" if g.units else "no gathering units"
    share = f"{g.share_of_params:.2f} of the whole parameters{layers}"
    if report.mesh.get("model", 1) > 1:  # the activations tensor parallelism gathers are all-gathers too
        share = f"{g.share_of_params:.2f} of a model shard's parameters{layers}, activations gathered over model included"
    lines = [f"gathered at once: {human_bytes(g.peak_bytes)} ({share}; {units})", *g.merged]
    return lines + _tensor_list("resting whole below zero.persist_below_bytes (never gathered)", g.persistent)


def _fit_line(report: PlanReport) -> list[str]:
    if not isinstance(report, CheckedPlanReport) or report.fits is None:
        return []
    verdict = "fits" if report.fits else "does NOT fit"
    peak = report.device_peak
    budget = report.memory_per_device / 1e9
    gathered = report.gathered_peak_bytes or 0
    of_which = f", of which gathered at once {gathered / 1e9:.3g} GB" if gathered else ""
    return [f"verdict: the compiled step {verdict} in {budget:g} GB per device (device peak {peak / 1e9:.3g} GB{of_which})"]


def _communication_lines(report: PlanReport) -> list[str]:
    comm = report.communication
    by_dtype = comm.by_dtype
    parts = ", ".join(
        f"{k} {human_bytes(v)}" + (f" ({'+'.join(sorted(by_dtype[k]))})" if by_dtype.get(k) else "")
        for k, v in sorted(comm.bytes_per_step.items())
    )
    return [
        f"communication per device per step: {human_bytes(comm.total)} ({parts or 'none'}; an all-reduce counts "
        f"twice, loops times their trip counts), the paper's {comm.paper_model} = {human_bytes(comm.paper)}: "
        f"ratio {comm.ratio:.2f} (sent over the paper's)",
        *_model_axis_line(report),
        *_level_lines(comm),
    ]


def _model_axis_line(report: PlanReport) -> list[str]:
    """With a model axis: the paper's volume is ZeRO's over data alone, so the ratio counts more."""
    n_m = report.mesh.get("model", 1)
    if n_m < 2:
        return []
    return [
        f"  (the paper's volume is ZeRO's traffic over data, for the Ψ/{n_m} parameters of a model shard; tensor "
        "parallelism's collectives of activations over model come on top)"
    ]


def _level_lines(comm: Communication) -> list[str]:
    """On several hosts: the bytes that cross hosts and those that stay within one."""
    if comm.hosts < 2:
        return []
    cross = f"  cross-host {human_bytes(comm.cross_host_bytes)} ({comm.cross_host_ratio:.2f} of {comm.paper_model}"
    if comm.zeropp_cross_host_bytes is not None:
        cross += f"; ZeRO++'s 0.75Ψ would be {human_bytes(comm.zeropp_cross_host_bytes)}"
    return [f"{cross}), within a host {human_bytes(comm.within_host_bytes)}, over {comm.hosts} hosts"]


def _quantization_lines(q: Quantization | None) -> list[str]:
    """qwZ: what is quantized, what is not and why, and any gather the program sends otherwise."""
    if not q:
        return []
    gathers = q.gathers
    lines = [
        f"qwZ {q.weights} (block {q.block}): {q.quantized} parameters gathered as {gathers.type} "
        f"({human_bytes(q.quantized_bytes)} whole), {human_bytes(gathers.quantized_bytes)} of {gathers.type} "
        "gathers per device per step"
    ]
    lines += _full_precision("gathered at full precision", q.not_quantized)
    for m in gathers.mismatched:
        lines.append(f"  warning: {m.name} gathers {m.elements:,} elements as {m.dtype}, a quantized parameter's size")
    return lines


def _full_precision(heading: str, kept: list[ExcludedTensor]) -> list[str]:
    """The tensors a quantization leaves at full precision: their count and bytes, then each and why."""
    if not kept:
        return []
    total = human_bytes(sum(t.bytes for t in kept))
    each = [f"    {t.path} {t.shape} {human_bytes(t.bytes)}: {t.why}" for t in kept]
    return [f"  {heading}: {len(kept)} tensors, {total}", *each]


def _gradient_quantization_lines(q: GradientQuantization | None) -> list[str]:
    """qgZ: the gradients reduced by quantized all-to-alls, those left whole, and any reduction sent otherwise."""
    if not q:
        return []
    r = q.reductions
    lines = [
        f"qgZ {q.gradients}: {q.quantized} gradients reduced by all-to-alls of {r.type} "
        f"({human_bytes(q.quantized_bytes)} whole), {human_bytes(r.quantized_bytes)} of {r.type} and "
        f"{human_bytes(r.scale_bytes)} of scales per device per step"
    ]
    lines += _full_precision("all-reduced at full precision", q.not_quantized)
    for m in r.mismatched:
        sent = f"{m.kind} of {m.dtype} ({human_bytes(m.bytes)} per step)"
        lines.append(f"  warning: {m.name} is a {sent}, not a quantized all-to-all")
    return lines


def _hierarchical_lines(h: Hierarchical | None) -> list[str]:
    """hpZ: the secondary copy per device against the formula, and what the layer loops save of it."""
    if not h:
        return []
    return [
        f"hpZ secondary copy per device: {human_bytes(h.secondary_bytes)} (the formula, parameters over the devices of "
        f"a host: {human_bytes(h.formula_bytes)}); the layer loops save {human_bytes(h.saved_by_loops_bytes)} "
        f"of its scanned layers' {human_bytes(h.scanned_bytes)}",
        *_tensor_list("  partitioned over data alone (replica x data divides none of their dimensions)", h.not_over_replica),
    ]


def _scaling_lines(report: PlanReport) -> list[str]:
    sc = report.scaling if isinstance(report, CheckedPlanReport) else None
    if not sc or sc.flops_ratio_to_predicted is None:
        return []
    lines = [
        f"scaling over {sc.batch_groups} batch groups: FLOPs per device {sc.flops_ratio_to_predicted:.2f}x one "
        f"group's / {sc.batch_groups} (1.00: no work repeated); temporaries {sc.temp_ratio:.2f}x one group's "
        f"({human_bytes(sc.temp_one_group)}, the same step compiled for one group)"
    ]
    return lines + [f"FLAG: {flag}" for flag in sc.flags]
