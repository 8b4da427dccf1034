"""``jzero plan --all-stages``: one row per ZeRO stage, each figure also against stage 0's, and the
predicted step of each. The one-stage renderings are :mod:`jzero.ledger.render`'s."""

from __future__ import annotations

from jzero.ledger.render import devices_text, flops_text, human_bytes
from jzero.ledger.report import CheckedPlanReport
from jzero.sharding.axes import mesh_text

__all__ = ["format_all_stages"]


def format_all_stages(reports: dict[str, CheckedPlanReport]) -> str:
    """``jzero plan --all-stages``: one row per stage, each figure also against stage 0."""
    first = next(iter(reports.values()))
    mesh = mesh_text(first.mesh)
    base = reports.get("0", first)
    verdicts = first.fits is not None
    offloaded = any(r.host_bytes.total for r in reports.values())
    host_column = f" {'host memory':>12}" if offloaded else ""
    peak = "device peak" if offloaded else "peak"
    header = (
        f"{'stage':<6} {'model states':>13}{host_column} {'formula':>12} {'ratio':>6} {'vs 0':>5} {'temporaries':>12} "
        f"{'vs 0':>5} {peak:>12} {'FLOPs':>13} {'all-gather':>11} {'all-reduce':>11} {'red-scatter':>11} {'comm/paper':>10}"
        + ("  fits" if verdicts else "")
    )
    lines = [
        f"jzero plan --all-stages: mesh {mesh} ({devices_text(first)}), {first.num_params:,} parameters",
        "",
        header,
    ]
    for stage, r in reports.items():
        got, ideal = r.per_device_bytes.total, r.ideal_per_device_bytes.total
        host = r.host_bytes.total
        temp = r.compiled.temp
        comm = {
            k: human_bytes(r.collectives[k].bytes if k in r.collectives else 0)
            for k in ("all-gather", "all-reduce", "reduce-scatter")
        }
        flops = flops_text(r)
        row = (
            f"{stage:<6} {human_bytes(got):>13}" + (f" {human_bytes(host):>12}" if offloaded else "")
            + f" {human_bytes(ideal):>12} {(got + host) / ideal:>6.3f} "
            f"{got / base.per_device_bytes.total:>5.2f} {human_bytes(temp):>12} {temp / base.compiled.temp:>5.2f} "
            f"{human_bytes(r.device_peak if offloaded else r.compiled.peak):>12} {flops:>13} "
            f"{comm['all-gather']:>11} {comm['all-reduce']:>11} {comm['reduce-scatter']:>11} "
            f"{r.communication.ratio:>10.2f}"
        )
        lines.append(row + (("  yes" if r.fits else "  no") if verdicts else ""))
    lines += [
        "",
        "model states: per device"
        + (" in device memory, and in host memory (offloaded); ratio: both" if offloaded else "; ratio: model states")
        + " over the paper's formula; vs 0: model states and temporaries over stage 0's; "
        "all-gather, all-reduce, red-scatter (reduce-scatter): "
        "HLO result bytes, a loop body "
        "once; comm/paper: bytes sent per step (loops times their trip counts) over the paper's 2Ψ or 3Ψ",
    ]
    if all(r.scaling is not None and r.scaling.flops_ratio_to_predicted is not None for r in reports.values()):
        ratios = ", ".join(f"{r.scaling.flops_ratio_to_predicted:.2f}" for r in reports.values())
        lines.append(f"FLOPs per device over one batch group's / {first.scaling.batch_groups}, stages 0-3: {ratios}")
        lines += [f"FLAG stage {stage}: {flag}" for stage, r in reports.items() for flag in r.scaling.flags]
    if all(r.predicted for r in reports.values()):
        lines += ["predicted per stage (the step-time model, docs/planner.md):"] + [
            f"  stage {stage}: not available: {p.error}"
            if p.error
            else f"  stage {stage}: step {1e3 * p.step_time_s:.4g} ms, {p.tokens_per_sec:,.0f} tokens/s, "
            f"MFU {100 * p.mfu:.1f}%"
            for stage, p in ((s, r.predicted) for s, r in reports.items())
        ]
    notes = dict.fromkeys(note for r in reports.values() for note in r.notes)
    lines += [f"note: {note}" for note in notes]
    return "\n".join(lines)
