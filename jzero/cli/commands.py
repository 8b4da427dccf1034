"""The ``jzero`` commands, one ``cmd_*`` function per subcommand: each takes the parsed arguments
and returns the exit status.

No JAX at import (the standard library and jzero's JAX-free config, errors and process modules):
each command imports JAX, Orbax and the rest of jzero inside its body, once
:func:`jzero.cli.main.main`'s Ctrl-C handler is in place.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from jzero.cli.interrupts import interrupt_raises
from jzero.config.loading import load_config
from jzero.config.schema import Config
from jzero.distributed.process import DIVERGED, RUN_FAILED
from jzero.errors import CheckpointError, ConfigError, DamagedCheckpoint, Diverged, RunError, error_line

if TYPE_CHECKING:
    from jzero.training.loop import TrainResult

__all__ = [
    "cmd_checkpoint_export",
    "cmd_checkpoint_import",
    "cmd_checkpoint_info",
    "cmd_checkpoint_verify",
    "cmd_data_prepare",
    "cmd_estimate",
    "cmd_launch",
    "cmd_plan",
    "cmd_report",
    "cmd_sample",
    "cmd_train",
]


def _load(args: argparse.Namespace) -> Config:
    """The config, with JAX started for it (:func:`_start`)."""
    config = load_config(args.config, args.set)
    _start(config, target=bool(getattr(args, "target", None)))
    return config


def _start(config: Config | None, target: bool = False) -> None:
    """Start JAX's backends for ``config``: first its simulated CPU devices (when there is no
    accelerator) and the multi-process job, which must come before anything starts them (importing
    JAX does not). A GPU target's devices are compile-only, and a command with no config (a reader
    of a run folder) takes JAX's defaults."""
    from jzero.distributed.process import start_backends
    from jzero.distributed.runtime import initialize
    from jzero.sharding.mesh import simulate_cpu_devices

    if config is not None and not target:
        simulate_cpu_devices(config.runtime.cpu_devices)
        initialize(config.runtime)
    start_backends()


@contextlib.contextmanager
def _watched(config: Config) -> Iterator[None]:
    """Run a command as one process of a multi-process job: a lost peer ends this process with a
    line naming it (:class:`~jzero.distributed.runtime.Watchdog`), and at the end the processes leave in order."""
    import jax

    from jzero.distributed.process import exit_now
    from jzero.distributed.runtime import Watchdog, finish

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
            exit_now(f"a collective failed and no peer was declared lost: {error_line(err)}", RUN_FAILED)
        except Exception:
            # Bad input, a halted run, a failed write: usually every process at the same step. They
            # leave in order, each with its own line; one that fails alone waits 10 s for the others.
            with contextlib.suppress(Exception):
                finish(min(config.runtime.shutdown_timeout_s, 10), watchdog)
            raise
        try:
            finish(config.runtime.shutdown_timeout_s, watchdog)
        except jax.errors.JaxRuntimeError as err:  # a peer never came to the end
            exit_now(f"the processes did not all reach the end within runtime.shutdown_timeout_s: {error_line(err)}", RUN_FAILED)


def cmd_train(args: argparse.Namespace) -> int:
    """``jzero train``: train, resuming from the run's latest checkpoint unless ``--no-resume``; 0, 1 (the run
    failed) or 4 (:data:`~jzero.distributed.process.DIVERGED`: too many non-finite steps in a row, or a
    non-finite last step)."""
    from jzero.distributed.runtime import is_primary
    from jzero.training.goodput import format_goodput
    from jzero.training.loop import train

    config = _load(args)
    try:
        with _watched(config):
            result = train(config, progress=not args.quiet, resume=not args.no_resume)
    except RunError as err:
        print(f"jzero: {err}", file=sys.stderr)
        return DIVERGED if isinstance(err, Diverged) else RUN_FAILED
    if not is_primary():  # process 0 speaks for the job
        return 0
    history = result.history
    span = f"steps {result.start_step} -> {result.final_step}"
    loss = f": loss {history[0]['loss']:.4f} -> {history[-1]['loss']:.4f}" if history else ""
    saved = f"; saved step {result.saved[-1]}" if result.saved else ""
    if result.goodput is not None:
        print(format_goodput(result.goodput))
    if result.preempted:
        print(_preempted_line(config.run.dir, result))
    else:
        print(f"trained {span}{loss}{saved}; run dir {config.run.dir}")
    if not args.quiet:
        print(_next_steps(config, result))
    return 0


def _preempted_line(run_dir: str, result: TrainResult) -> str:
    """What a preempted run did: the step it saved, or that it saved nothing (and what remains)."""
    from jzero.config.run_folder import CHECKPOINTS

    head = f"jzero: preempted by {result.preempted}"
    span = f"steps {result.start_step} -> {result.final_step}"
    if result.saved:
        step = result.saved[-1]
        return f"{head} after {span}; saved step {step} to {run_dir}/{CHECKPOINTS}/{step}"
    when = "before its first step" if result.final_step == result.start_step else f"after {span}"
    kept = f"the newest checkpoint is still step {result.start_step}" if result.start_step else "there is no checkpoint"
    return f"{head} {when}; nothing was saved ({kept})"


def _next_steps(config: Config, result: TrainResult) -> str:
    """The line that ends ``jzero train``: what to run next on this run."""
    from jzero.models.names import GPT

    run = config.run.dir
    if result.preempted:
        resumable = result.saved or result.start_step
        return f"next: run the same command again to {'resume from the newest checkpoint' if resumable else 'start the run'}"
    sample = f'jzero sample {run} --prompt "def " to continue a prompt, ' if config.model.name == GPT else ""
    return (f"next: {sample}jzero report {run} --out {run}/loss.png to plot the loss, or the same command "
            f"with --set train.steps={2 * config.train.steps} to train on")  # fmt: skip


def cmd_checkpoint_info(args: argparse.Namespace) -> int:
    """``jzero checkpoint info``: a table of the run's checkpoint folders, or one JSON list with ``--json``."""
    from jzero.checkpoint.catalog import describe
    from jzero.ledger.render import human_bytes
    from jzero.records import to_json
    from jzero.sharding.axes import mesh_text

    _start(None)
    rows = describe(args.run_dir)
    if args.json:
        print(json.dumps(to_json(rows)))
        return 0
    head = f"{'step':>8}  {'committed':<9}  {'verified':<11}  {'stage':>5}  {'devices':>7}  {'processes':>9}  {'mesh':<28}"
    print(f"{head}  {'size':>10}")
    for r in rows:
        mesh = mesh_text(r.mesh or {}) or "?"
        stage, devices, processes = ("?" if x is None else x for x in (r.stage, r.devices, r.processes))
        committed = "yes" if r.committed else "no"
        verified = {True: "yes", False: "no manifest", None: "-"}[r.verified]
        line = f"{r.step:>8}  {committed:<9}  {verified:<11}  {stage:>5}  {devices:>7}  {processes:>9}  {mesh:<28}"
        print(f"{line}  {human_bytes(r.bytes):>10}")
    if not rows:
        print("  no checkpoints")
    return 0


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def cmd_checkpoint_verify(args: argparse.Namespace) -> int:
    """``jzero checkpoint verify``: each committed step's verdict, one a line; a damaged step raises."""
    from jzero.checkpoint.catalog import verify_run
    from jzero.checkpoint.integrity import Unverified
    from jzero.ledger.render import human_bytes

    _start(None)
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
    """``jzero checkpoint export``: a committed step's parameters as one safetensors file."""
    from jzero.checkpoint.export import export_checkpoint, lora_scale
    from jzero.ledger.render import human_bytes

    _start(None)
    if args.format == "hf":
        return _export_hf(args)
    if args.force:
        raise ConfigError("--force", "only with --format hf (a safetensors file is never replaced)")
    merge = lora_scale(args.run_dir) if args.merge_lora else None
    with interrupt_raises():  # so that the export removes its temporary file
        done = export_checkpoint(args.run_dir, args.out, args.step, args.dtype, warn=_to_stderr, merge_lora=merge)
    print(
        f"exported step {done['step']} ({done['source']}): {done['tensors']} tensors, {human_bytes(done['bytes'])} "
        f"as {done['dtype']} to {done['out']}"
    )
    return 0


def _export_hf(args: argparse.Namespace) -> int:
    from jzero.checkpoint.hf_export import ADAPTER_FOLDER, export_hf
    from jzero.ledger.render import human_bytes

    with interrupt_raises():  # so that the export removes its temporary folder
        options = {"force": args.force, "merge_lora": args.merge_lora, "warn": _to_stderr}
        done = export_hf(args.run_dir, args.out, args.step, args.dtype, **options)
    files = f"{done['files']} safetensors file" + ("s" if done["files"] > 1 else "")
    merged = " (LoRA's adapters merged)" if args.merge_lora else ""
    print(f"exported step {done['step']} as Hugging Face {done['family']}{merged}: {done['tensors']} tensors, "
          f"{human_bytes(done['bytes'])} as {done['dtype']} in {files} to {done['out']}")  # fmt: skip
    if done["adapters"]:
        print(f"LoRA's adapters: {done['adapters']} tensors in PEFT's layout in {done['out']}/{ADAPTER_FOLDER}")
    return 0


def cmd_checkpoint_import(args: argparse.Namespace) -> int:
    """``jzero checkpoint import``: a Hugging Face Llama folder as a run at step 0, on the devices
    its config asks for (``runtime.cpu_devices`` simulated where there is no accelerator)."""
    from jzero.apps.hf_import import import_checkpoint, import_config

    _start(import_config(args.hf_dir, args.out, args.set))
    with interrupt_raises():
        done = import_checkpoint(args.hf_dir, args.out, args.set)
    tokenizer = ", its tokenizer" if done["tokenizer"] else ""
    print(f"imported {args.hf_dir}: {done['parameters']:,} parameters at stage {done['stage']} on {done['mesh']}{tokenizer}, "
          f"as step 0 of {done['run_dir']}")  # fmt: skip
    run = done["run_dir"]
    print(f"next: jzero train {run}/config.yaml --set train.steps=N, or --set train.init_from={run} in a config of yours")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    """``jzero plan``: plan the config (or every stage) without allocating; text, or JSON with ``--json``."""
    from jzero.distributed.runtime import is_primary
    from jzero.ledger.estimate import parse_memory
    from jzero.ledger.plan_report import with_scaling, with_verdict
    from jzero.ledger.render import format_plan
    from jzero.ledger.report import StagesReport
    from jzero.ledger.stages_table import format_all_stages
    from jzero.ledger.targets import check_target_fits_mesh, target_devices
    from jzero.planner.options import search_options
    from jzero.records import to_json
    from jzero.sharding.stages import STAGES
    from jzero.training.job import build_job
    from jzero.training.report import one_group_reference, plan_report

    target = _target(args)
    options = search_options(args.search, args.target, args.all_stages, args.global_batch_size, args.time_budget, args.write)
    memory = parse_memory(args.memory_per_device) if args.memory_per_device else None
    config = _load(args)
    devices = None
    if target is not None:
        devices = target_devices(target)
        check_target_fits_mesh(target, config.mesh.axes)
        memory = target.memory_bytes if memory is None else memory
    if options is not None:
        return _plan_search(args, config, target, memory, options)
    hardware = target.hardware() if target is not None else None
    with _watched(config):
        built = build_job(config, devices)  # the mesh, model and abstract state once; each stage is a new plan of them
        reference = one_group_reference(built)  # the same for every stage: one group partitions nothing
        stages = STAGES if args.all_stages else [config.zero.stage]
        reports = {}
        for stage in stages:
            report = plan_report(built.replan(stage), hardware=hardware)
            reports[str(stage)] = with_scaling(with_verdict(report, memory), reference)
    if not is_primary():
        return 0
    if args.all_stages:
        print(json.dumps(to_json(StagesReport(stages=reports))) if args.json else format_all_stages(reports))
    else:
        (report,) = reports.values()
        print(json.dumps(to_json(report)) if args.json else format_plan(report))
    return 0


_TARGET_FLAGS = (("--hosts", "hosts"), ("--gpus-per-host", "gpus_per_host"), ("--nics-per-host", "nics_per_host"),
                 ("--nic-gbps", "nic_gbps"))  # fmt: skip


def _target(args: argparse.Namespace):
    """``--target`` and the cluster flags that describe it, or None without ``--target``.

    Raises:
      ConfigError: a cluster flag without ``--target``, or a bad target (:func:`jzero.ledger.targets.parse_target`).
    """
    from jzero.ledger.targets import parse_target

    if args.target:
        return parse_target(args.target, args.hosts, args.gpus_per_host, args.nics_per_host, args.nic_gbps)
    for flag, name in _TARGET_FLAGS:
        if getattr(args, name) is not None:
            raise ConfigError(flag, "only with --target")
    return None


def _plan_search(args: argparse.Namespace, config: Config, target, memory: float, options) -> int:
    """``jzero plan --search``: the ranked table (or JSON), and the winner written where asked."""
    from jzero.config.loading import dump_config
    from jzero.planner.progress import SearchProgress
    from jzero.planner.search import refuse_unfit, search
    from jzero.planner.table import format_search, search_json

    sets = [*args.set, *options.sets()]
    with SearchProgress(enabled=not args.json) as bar:
        result = search(
            args.config, sets, target, memory, batches=options.batches(config.train.global_batch_size),
            time_budget_s=options.time_budget_s, on_progress=bar.update,
        )  # fmt: skip
    refuse_unfit(result, args.memory_per_device or f"{memory / 1e9:.4g} GB")
    if options.write is not None:
        options.write.write_text(dump_config(load_config(args.config, [*sets, *result.winner.sets])))
    print(json.dumps(search_json(result)) if args.json else format_search(result))
    if options.write is not None and not args.json:
        print(f"wrote {options.write}: jzero plan {options.write} --target {args.target} reproduces the winner")
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    """``jzero estimate``: the paper's per-device model-state bytes at each stage; no JAX."""
    from jzero.ledger.estimate import estimate, format_estimate, parse_count, parse_memory
    from jzero.records import to_json

    memory = parse_memory(args.memory_per_device) if args.memory_per_device else None
    result = estimate(
        parse_count(args.params), args.devices, args.model_parallel, args.precision, args.optimizer, memory, tuple(args.offload)
    )
    print(json.dumps(to_json(result)) if args.json else format_estimate(result))
    return 0


def cmd_launch(args: argparse.Namespace, build_parser: Callable[[], argparse.ArgumentParser]) -> int:
    """``jzero launch``: run a jzero command line as N local processes of one job; its exit status.
    ``build_parser`` (the parser hands it over: this module imports no parser) reads that command line."""
    from jzero.distributed.launch import launch, parse_spec

    spec = parse_spec(args.words, args.n, args.devices_per_process, args.max_restarts, parse=build_parser().parse_args)
    return launch(spec, args.max_restarts, args.shrink_on_failure)


def cmd_data_prepare(args: argparse.Namespace) -> int:
    """``jzero data prepare``: tokenize the sources into a token folder; 0, bad input (a ``ConfigError``) or
    a write the machine refused (an ``OutputWriteError``)."""
    from jzero.data.prepare import prepare_command

    with interrupt_raises():  # so that the prepare removes its temporary folder
        return prepare_command(args)


def cmd_sample(args: argparse.Namespace) -> int:
    """``jzero sample``: continue ``--prompt`` with the run's newest (or ``--step``) checkpoint, streamed to stdout."""
    from jzero.apps.sample import sample_command

    return sample_command(args)


def cmd_report(args: argparse.Namespace) -> int:
    """``jzero report``: the run's ``metrics.jsonl`` drawn as a PNG at ``--out``; no JAX."""
    from jzero.apps.plot import plot_command

    return plot_command(args)
