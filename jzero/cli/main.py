"""The ``jzero`` command line: ``train``, ``plan``, ``estimate``, ``launch`` and ``checkpoint info|verify|export``.

Bad input (config, flag, mesh, data path) prints one line naming the key and exits with status 2.
Ctrl-C prints ``jzero: interrupted`` and exits with status 130, from the first moment: this module
imports only the standard library and :mod:`jzero.config.loading` (no JAX); the commands import JAX and
Orbax (seconds) inside :func:`main`, with its handlers in place.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import NoReturn

from jzero.config.loading import load_config
from jzero.config.schema import EXPORT_DTYPES, Config
from jzero.distributed.process import BAD_INPUT, INTERRUPTED, RUN_FAILED
from jzero.errors import ConfigError, JzeroError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, no usage dump
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _load(args: argparse.Namespace) -> Config:
    """The config, with JAX started for it: simulated CPU devices and the multi-process job first."""
    from jzero.distributed.process import start_backends
    from jzero.distributed.runtime import initialize
    from jzero.mesh import simulate_cpu_devices

    config = load_config(args.config, args.set)
    # Before anything starts JAX's backends (importing JAX does not): simulated CPU devices when
    # there is no accelerator, and jax.distributed. A GPU target's devices are compile-only.
    if not getattr(args, "target", None):
        simulate_cpu_devices(config.runtime.cpu_devices)
        initialize(config.runtime)
    start_backends()
    return config


@contextlib.contextmanager
def _watched(config: Config) -> Iterator[None]:
    """Run a command as one process of a multi-process job: a lost peer ends this process with a
    line naming it (:class:`~jzero.distributed.runtime.Watchdog`), and at the end the processes leave in order."""
    import jax

    from jzero.distributed.process import exit_now
    from jzero.distributed.runtime import Watchdog, finish
    from jzero.errors import error_line

    if jax.process_count() == 1:
        yield
        return
    with Watchdog() as watchdog:
        try:
            yield
        except jax.errors.JaxRuntimeError as err:
            # A collective failed (gloo: "Connection closed by peer"): a peer is gone. The watchdog
            # names it once JAX's coordinator declares it lost, and ends this process; if it never
            # does, say what failed and leave at once, as an orderly exit would wait for peers.
            time.sleep(config.runtime.heartbeat_timeout_s + 2 * watchdog.interval_s)
            exit_now(f"a collective failed and no peer was declared lost: {error_line(err)}", 1)
        except Exception:
            # Bad input, a halted run, a failed write: usually every process at the same step. They
            # leave in order, each with its own line; one that fails alone waits 10 s for the others.
            with contextlib.suppress(Exception):
                finish(min(config.runtime.shutdown_timeout_s, 10), watchdog)
            raise
        try:
            finish(config.runtime.shutdown_timeout_s, watchdog)
        except jax.errors.JaxRuntimeError as err:  # a peer never came to the end
            exit_now(f"the processes did not all reach the end within runtime.shutdown_timeout_s: {error_line(err)}", 1)


def cmd_train(args: argparse.Namespace) -> int:
    from jzero.config.rundir import CHECKPOINTS
    from jzero.distributed.runtime import is_primary
    from jzero.errors import RunError
    from jzero.train.loop import train

    config = _load(args)
    try:
        with _watched(config):
            result = train(config, progress=not args.quiet, resume=not args.no_resume)
    except RunError as err:
        print(f"jzero: {err}", file=sys.stderr)
        return RUN_FAILED
    if not is_primary():  # process 0 speaks for the job
        return 0
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
    from jzero.axes import mesh_text
    from jzero.checkpoint.runs import describe
    from jzero.ledger.render import human_bytes

    rows = describe(args.run_dir)
    if args.json:
        print(json.dumps(rows))
        return 0
    head = f"{'step':>8}  {'committed':<9}  {'verified':<11}  {'stage':>5}  {'devices':>7}  {'processes':>9}  {'mesh':<28}"
    print(f"{head}  {'size':>10}")
    for r in rows:
        mesh = mesh_text(r["mesh"] or {}) or "?"
        stage, devices, processes = ("?" if r[k] is None else r[k] for k in ("stage", "devices", "processes"))
        committed = "yes" if r["committed"] else "no"
        verified = {True: "yes", False: "no manifest", None: "-"}[r["verified"]]
        line = f"{r['step']:>8}  {committed:<9}  {verified:<11}  {stage:>5}  {devices:>7}  {processes:>9}  {mesh:<28}"
        print(f"{line}  {human_bytes(r['bytes']):>10}")
    if not rows:
        print("  no checkpoints")
    return 0


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def cmd_checkpoint_verify(args: argparse.Namespace) -> int:
    from jzero.checkpoint.integrity import Unverified
    from jzero.checkpoint.runs import verify_run
    from jzero.errors import CheckpointError, DamagedCheckpoint
    from jzero.ledger.render import human_bytes

    verdicts = verify_run(args.run_dir, args.step)
    for step, verdict in verdicts:
        if isinstance(verdict, DamagedCheckpoint):
            print(f"step {step}: damaged: {verdict.file} {verdict.problem}")
        elif isinstance(verdict, Unverified):
            print(f"step {step}: not verifiable: no manifest (written before jzero verified checkpoints)")
        else:
            print(f"step {step}: ok, {human_bytes(verdict)} verified")
    if not verdicts:
        print("no committed checkpoints")
    damaged = [str(step) for step, verdict in verdicts if isinstance(verdict, DamagedCheckpoint)]
    if damaged:
        raise CheckpointError(args.run_dir, f"damaged checkpoint steps: {', '.join(damaged)}")
    return 0


def cmd_checkpoint_export(args: argparse.Namespace) -> int:
    from jzero.checkpoint.export import export_checkpoint
    from jzero.ledger.render import human_bytes

    with _interrupt_raises():  # so that the export removes its temporary file
        done = export_checkpoint(args.run_dir, args.out, args.step, args.dtype, warn=_to_stderr)
    print(
        f"exported step {done['step']} ({done['source']}): {done['tensors']} tensors, {human_bytes(done['bytes'])} "
        f"as {done['dtype']} to {done['out']}"
    )
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from jzero.distributed.runtime import is_primary
    from jzero.ledger.estimate import parse_memory
    from jzero.ledger.render import format_all_stages, format_plan
    from jzero.ledger.targets import check_target_fits_mesh, parse_target, target_devices
    from jzero.stages import STAGES
    from jzero.train.job import build_job
    from jzero.train.report import one_group_reference, plan_report, with_scaling, with_verdict

    target = parse_target(args.target, args.hosts, args.gpus_per_host) if args.target else None
    if target is None and (args.hosts or args.gpus_per_host):
        raise ConfigError("--hosts" if args.hosts else "--gpus-per-host", "only with --target")
    memory = parse_memory(args.memory_per_device) if args.memory_per_device else None
    config = _load(args)
    devices = None
    if target is not None:
        devices = target_devices(target)
        check_target_fits_mesh(target, config.mesh.axes)
        memory = target.memory_bytes if memory is None else memory
    with _watched(config):
        built = build_job(config, devices)  # the mesh, model and abstract state once; each stage is a new plan of them
        reference = one_group_reference(built)  # the same for every stage: one group partitions nothing
        stages = STAGES if args.all_stages else [config.zero.stage]
        reports = {}
        for stage in stages:
            reports[str(stage)] = with_scaling(with_verdict(plan_report(built.replan(stage)), memory), reference)
    if not is_primary():
        return 0
    if args.all_stages:
        print(json.dumps({"stages": reports}) if args.json else format_all_stages(reports))
    else:
        (report,) = reports.values()
        print(json.dumps(report) if args.json else format_plan(report))
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    from jzero.ledger.estimate import estimate, format_estimate, parse_count, parse_memory

    memory = parse_memory(args.memory_per_device) if args.memory_per_device else None
    result = estimate(
        parse_count(args.params), args.devices, args.model_parallel, args.precision, args.optimizer, memory, tuple(args.offload)
    )
    print(json.dumps(result) if args.json else format_estimate(result))
    return 0


def cmd_launch(args: argparse.Namespace) -> int:
    from jzero.distributed.launch import launch, parse_spec

    spec = parse_spec(args.words, args.n, args.devices_per_process, args.max_restarts, parse=build_parser().parse_args)
    return launch(spec, args.max_restarts, args.shrink_on_failure)


_VERSIONED = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint")
_TRAIN_EXAMPLES = """examples:
  jzero train configs/gpt-tiny.yaml
  jzero train configs/gpt-tiny.yaml --set zero.stage=2 --set mesh.axes.data=4 --set mesh.axes.model=2 --set run.dir=runs/tp2"""


def version_line() -> str:
    """``jzero 0.1.0 (jax 0.10.2, ..., CUDA plugin: none)``: what a bug report needs, importing no JAX."""
    from importlib.metadata import PackageNotFoundError, version

    from jzero.ledger.targets import cuda_plugins

    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    stack = ", ".join(f"{name} {of(name)}" for name in _VERSIONED)
    return f"jzero {of('jzero')} ({stack}; CUDA plugin: {', '.join(cuda_plugins()) or 'none'})"


class _Version(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None) -> NoReturn:  # unwrapped, unlike action="version"
        print(version_line())
        raise SystemExit(0)


def build_parser() -> argparse.ArgumentParser:
    from jzero.ledger.estimate import OPTIMIZER_STATE_BYTES, PRECISIONS  # no JAX here

    parser = _Parser(prog="jzero", description="ZeRO stages 0-3 for Flax, as JAX sharding specs.")
    parser.add_argument("--version", action=_Version, nargs=0, help="jzero's version and its stack's, then exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def with_config(p: argparse.ArgumentParser) -> None:
        p.add_argument("config", help="train config YAML (e.g. configs/gpt-tiny.yaml)")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a dotted config key")

    train = sub.add_parser(
        "train", help="train a model", epilog=_TRAIN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    with_config(train)
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.add_argument("--no-resume", action="store_true", help="refuse a run.dir that holds a run or checkpoints")
    train.set_defaults(func=cmd_train)

    plan = sub.add_parser("plan", help="shardings, bytes per device and collectives, without allocating")
    with_config(plan)
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    plan.add_argument("--all-stages", action="store_true", help="plan stages 0-3 and compare them")
    plan.add_argument(
        "--memory-per-device",
        default=None,
        help="e.g. 80GB: does the compiled step's peak fit? (default with --target: the GPU's)",
    )
    plan.add_argument(
        "--target", default=None, help="compile for GPUs from this host: h100x8, h100x64, a100x16 (gpu-target extra)"
    )
    plan.add_argument("--hosts", type=int, default=None, help="with --target: hosts (default: the count over 8 GPUs per host)")
    plan.add_argument("--gpus-per-host", type=int, default=None, help="with --target: GPUs per host (default 8)")
    plan.set_defaults(func=cmd_plan)

    est = sub.add_parser("estimate", help="per-device model-state memory at stages 0-3, from the paper's formulas")
    est.add_argument("--params", required=True, help="parameter count: 7.5e9, 7.5B, 350M")
    est.add_argument("--devices", type=int, required=True, help="total devices (N_d x N_m)")
    est.add_argument("--model-parallel", type=int, default=1, help="N_m (default 1)")
    est.add_argument("--precision", default="mixed", choices=PRECISIONS, help="mixed: 16-bit params and grads, fp32 master")
    est.add_argument("--optimizer", default="adam", choices=tuple(OPTIMIZER_STATE_BYTES))
    est.add_argument("--memory-per-device", default=None, help="e.g. 80GB or 80GiB: say which stages fit")
    est.add_argument(
        "--offload",
        action="append",
        default=[],
        choices=("optimizer", "params"),
        help="move a part to pinned host memory where the stage allows (optimizer: stages 1-3, params: 3); repeatable",
    )
    est.add_argument("--json", action="store_true", help="print one JSON object")
    est.set_defaults(func=cmd_estimate)

    run = sub.add_parser(
        "launch",
        help="run a jzero command as N processes of one jax.distributed job on this machine",
        usage="jzero launch -n N [--devices-per-process K] [--max-restarts R] [--shrink-on-failure] -- train CONFIG [--set ...]",
    )
    run.add_argument("-n", type=int, required=True, help="processes to start")
    run.add_argument("--devices-per-process", type=int, default=1, help="simulated CPU devices each (default 1)")
    run.add_argument("--max-restarts", type=int, default=0, help="start the job again after a failure, up to R times")
    run.add_argument(
        "--shrink-on-failure", action="store_true", help="restart on the largest smaller count the mesh and batch allow"
    )
    run.add_argument("words", nargs=argparse.REMAINDER, help="-- then a jzero command line: train or plan")
    run.set_defaults(func=cmd_launch)

    ckpt = sub.add_parser("checkpoint", help="inspect and export a run's checkpoints")
    ckpt_sub = ckpt.add_subparsers(dest="action", required=True, parser_class=_Parser)
    info = ckpt_sub.add_parser("info", help="each checkpoint's step, mesh, stage, size, whether it is committed and verified")
    info.add_argument("run_dir")
    info.add_argument("--json", action="store_true", help="print one JSON list")
    info.set_defaults(func=cmd_checkpoint_info)
    verify = ckpt_sub.add_parser("verify", help="check each checkpoint's files against the checksums written at commit")
    verify.add_argument("run_dir")
    verify.add_argument("--step", type=int, default=None, help="only this committed step (default: every one)")
    verify.set_defaults(func=cmd_checkpoint_verify)
    export = ckpt_sub.add_parser("export", help="consolidated parameters as safetensors")
    export.add_argument("run_dir")
    export.add_argument("--step", type=int, default=None, help="a committed step (default: the latest)")
    export.add_argument("--out", required=True, help="the .safetensors file to write (must not exist)")
    export.add_argument("--dtype", default="float32", choices=EXPORT_DTYPES)
    export.set_defaults(func=cmd_checkpoint_export)
    return parser


def _exit_interrupted() -> NoReturn:
    from jzero.distributed.process import exit_now  # imported already whenever fd 2 can be diverted

    exit_now("interrupted", INTERRUPTED)


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    # Exit here rather than raise KeyboardInterrupt: raised inside a finalizer or a callback it is
    # ignored with a traceback, and the command runs on.
    _exit_interrupted()


@contextlib.contextmanager
def _interrupt_raises() -> Iterator[None]:
    """Within the block SIGINT raises KeyboardInterrupt (Python's default) instead of exiting at
    once, so ``finally`` blocks run. Another handler than :func:`main`'s is left alone."""
    ours = signal.getsignal(signal.SIGINT) is _on_sigint  # set only in the main thread
    if ours:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ours:
            signal.signal(signal.SIGINT, _on_sigint)


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status: 0, 1 (a run failed), 2 (bad input) or 130 (Ctrl-C).

    With ``argv`` None, jzero is the program (the ``jzero`` script, ``python -m jzero.cli``) and owns
    the process: Ctrl-C exits at once with one line, even while JAX imports. Called with a list (in
    a Python process of yours), it leaves your SIGINT handling alone and returns 130 on
    KeyboardInterrupt.
    """
    program = argv is None
    previous = None
    if program and threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, _on_sigint)
    try:
        args = build_parser().parse_args(argv)
        # Orbax logs its background threads' failures with tracebacks; jzero reports them in one line.
        logging.getLogger("absl").setLevel(logging.CRITICAL)
        if args.command not in ("estimate", "launch"):  # the commands that need no JAX
            from jzero.distributed.process import import_jax, start_backends

            import_jax(target=bool(getattr(args, "target", None)))
            if args.command == "checkpoint":  # train and plan start them in _load, after sizing the CPU
                start_backends()
        return args.func(args)
    except JzeroError as err:  # a config key, a flag, a plan or a checkpoint: one line naming it
        print(f"jzero: error: {err}", file=sys.stderr)
        return BAD_INPUT
    except KeyboardInterrupt:
        if program:
            _exit_interrupted()
        print("jzero: interrupted", file=sys.stderr)
        return INTERRUPTED
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
