"""The ``jzero`` command line: ``train``, ``plan``, ``estimate`` and ``checkpoint info|export``.

Bad input (config, flag, mesh, data path) prints one line naming the key and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from jzero.checkpoint import CHECKPOINTS, CheckpointWriteError, describe
from jzero.config import Config, ConfigError, load_config
from jzero.estimate import OPTIMIZERS, PRECISIONS, estimate, format_estimate, parse_count, parse_memory
from jzero.export import EXPORT_DTYPES, export_checkpoint
from jzero.mesh import simulate_cpu_devices
from jzero.trainer import TrainingHalted, plan_report, setup, train


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, no usage dump
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _load(args: argparse.Namespace) -> Config:
    config = load_config(args.config, args.set)
    # Before anything starts JAX's backends (importing JAX does not): simulated CPU devices when
    # there is no accelerator.
    simulate_cpu_devices(config.runtime.cpu_devices)
    return config


def cmd_train(args: argparse.Namespace) -> int:
    config = _load(args)
    result = train(config, progress=not args.quiet, resume=not args.no_resume)
    history = result.history
    span = f"steps {result.start_step} -> {result.final_step}"
    loss = f": loss {history[0]['loss']:.4f} -> {history[-1]['loss']:.4f}" if history else ""
    saved = f"; saved step {result.saved[-1]}" if result.saved else ""
    where = f"{config.run.dir}/{CHECKPOINTS}/{result.saved[-1]}" if result.saved else config.run.dir
    if result.preempted:
        print(f"jzero: preempted by {result.preempted} after {span}{saved} to {where}")
    else:
        print(f"trained {span}{loss}{saved}; run dir {config.run.dir}")
    return 0


def cmd_checkpoint_info(args: argparse.Namespace) -> int:
    rows = describe(args.run_dir)
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'step':>8}  {'committed':<9}  {'stage':>5}  {'devices':>7}  {'mesh':<28}  {'size':>10}")
    for r in rows:
        mesh = " x ".join(f"{k}={v}" for k, v in (r["mesh"] or {}).items()) or "?"
        stage = "?" if r["stage"] is None else r["stage"]
        devices = "?" if r["devices"] is None else r["devices"]
        committed = "yes" if r["committed"] else "no"
        print(f"{r['step']:>8}  {committed:<9}  {stage:>5}  {devices:>7}  {mesh:<28}  {_human(r['bytes']):>10}")
    if not rows:
        print("  no checkpoints")
    return 0


def cmd_checkpoint_export(args: argparse.Namespace) -> int:
    done = export_checkpoint(args.run_dir, args.out, args.step, args.dtype)
    print(
        f"exported step {done['step']} ({done['source']}): {done['tensors']} tensors, {_human(done['bytes'])} "
        f"as {done['dtype']} to {done['out']}"
    )
    return 0


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def _tensor_list(title: str, tensors: list[dict[str, Any]], remark: str = "") -> list[str]:
    """A titled list of tensors with their bytes, or nothing when there are none."""
    if not tensors:
        return []
    total = sum(t["bytes"] for t in tensors)
    return [f"{title}: {len(tensors)} tensors, {_human(total)}{remark}"] + [
        f"  {t['path']} {t['shape']} {_human(t['bytes'])}" for t in tensors
    ]


def format_plan(report: dict[str, Any]) -> str:
    mesh = " x ".join(f"{k}={v}" for k, v in report["mesh"].items())
    lines = [
        f"jzero plan: ZeRO stage {report['stage']} on mesh {mesh} ({report['devices']} {report['backend']} devices), "
        f"{report['num_params']:,} parameters",
        "",
        f"{'tensor':<32} {'shape':<16} {'params':<24} {'grads':<24} {'optimizer':<24} {'param bytes/dev':>15}",
    ]
    for t in report["tensors"]:
        shape = "x".join(map(str, t["shape"]))
        lines.append(
            f"{t['path']:<32} {shape:<16} {t['param_spec']:<24} {t['grad_spec']:<24} {t['optimizer_spec']:<24} "
            f"{_human(t['param_bytes_per_device']):>15}"
        )
    lines += ["", f"{'model states per device':<24} {'plan':>12} {'paper formula':>14} {'ratio':>7}"]
    for key in ("params", "grads", "optimizer", "total"):
        got, ideal = report["per_device_bytes"][key], report["ideal_per_device_bytes"][key]
        lines.append(f"{key:<24} {_human(got):>12} {_human(ideal):>14} {got / ideal if ideal else float('nan'):>7.3f}")
    c = report["compiled"]
    lines += [
        "",
        f"compiled step, per device: arguments {_human(c['argument'])}, outputs {_human(c['output'])}, "
        f"temporaries {_human(c['temp'])}",
        "collectives in the compiled HLO (ops in program text; a loop body's ops count once):",
    ]
    if not report["collectives"]:
        lines.append("  none")
    for kind, v in sorted(report["collectives"].items()):
        inside = report["collectives_in_loop"].get(kind, 0)
        groups = "/".join(map(str, report["collective_groups"].get(kind, [])))
        groups = f"  groups of {groups} devices" if groups else ""
        lines.append(f"  {kind:<20} {v['count']:>4} ops ({inside} inside loops)  {_human(v['bytes']):>12}{groups}")
    t = report["paper_table"]
    lines += [
        "",
        f"the paper's table for this model: Ψ = {t['psi']:,}, {t['param_bytes']:g}-byte params and grads, "
        f"K = {t['k']:g}, N_d = {t['n_d']}, N_m = {t['n_m']}",
        f"  {'stage':<6} {'partitioned':<18} {'bytes per device':>16}",
    ]
    for row in t["rows"]:
        mark = "  <- this plan" if row["stage"] == report["stage"] else ""
        lines.append(f"  {row['stage']:<6} {row['partitioned']:<18} {row['bytes'] / 1e9:>13.3f} GB{mark}")
    lines.append("")
    for note in report["notes"]:
        lines.append(f"note: {note}")
    lines += _tensor_list("replicated over data (no dimension divisible by it)", report["replicated"])
    lines += _tensor_list(
        "not split by the model rules", report["not_on_model"], " (ZeRO still partitions them over data x model at stages >= 1)"
    )
    return "\n".join(lines)


def cmd_plan(args: argparse.Namespace) -> int:
    config = _load(args)
    report = plan_report(setup(config))
    print(json.dumps(report) if args.json else format_plan(report))
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    memory = parse_memory(args.memory_per_device) if args.memory_per_device else None
    result = estimate(parse_count(args.params), args.devices, args.model_parallel, args.precision, args.optimizer, memory)
    print(json.dumps(result) if args.json else format_estimate(result))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="jzero", description="ZeRO stages 0-3 for Flax, as JAX sharding specs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def with_config(p: argparse.ArgumentParser) -> None:
        p.add_argument("config", help="train config YAML (e.g. configs/gpt-tiny.yaml)")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a dotted config key")

    train = sub.add_parser("train", help="train a model")
    with_config(train)
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.add_argument("--no-resume", action="store_true", help="refuse a run.dir that holds a run or checkpoints")
    train.set_defaults(func=cmd_train)

    plan = sub.add_parser("plan", help="shardings, bytes per device and collectives, without allocating")
    with_config(plan)
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    plan.set_defaults(func=cmd_plan)

    est = sub.add_parser("estimate", help="per-device model-state memory at stages 0-3, from the paper's formulas")
    est.add_argument("--params", required=True, help="parameter count: 7.5e9, 7.5B, 350M")
    est.add_argument("--devices", type=int, required=True, help="total devices (N_d x N_m)")
    est.add_argument("--model-parallel", type=int, default=1, help="N_m (default 1)")
    est.add_argument("--precision", default="mixed", choices=PRECISIONS, help="mixed: 16-bit params and grads, fp32 master")
    est.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    est.add_argument("--memory-per-device", default=None, help="e.g. 80GB or 80GiB: say which stages fit")
    est.add_argument("--json", action="store_true", help="print one JSON object")
    est.set_defaults(func=cmd_estimate)

    ckpt = sub.add_parser("checkpoint", help="inspect and export a run's checkpoints")
    ckpt_sub = ckpt.add_subparsers(dest="action", required=True, parser_class=_Parser)
    info = ckpt_sub.add_parser("info", help="each checkpoint's step, mesh, stage, size and whether it is committed")
    info.add_argument("run_dir")
    info.add_argument("--json", action="store_true", help="print one JSON list")
    info.set_defaults(func=cmd_checkpoint_info)
    export = ckpt_sub.add_parser("export", help="consolidated parameters as safetensors")
    export.add_argument("run_dir")
    export.add_argument("--step", type=int, default=None, help="a committed step (default: the latest)")
    export.add_argument("--out", required=True, help="the .safetensors file to write (must not exist)")
    export.add_argument("--dtype", default="float32", choices=EXPORT_DTYPES)
    export.set_defaults(func=cmd_checkpoint_export)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Orbax logs its background threads' failures with tracebacks; jzero reports them in one line.
    logging.getLogger("absl").setLevel(logging.CRITICAL)
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"jzero: error: {err}", file=sys.stderr)
        return 2
    except (TrainingHalted, CheckpointWriteError) as err:
        print(f"jzero: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("jzero: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
