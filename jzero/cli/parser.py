"""The ``jzero`` command line's parser: :func:`build_parser`, one small function per subcommand.

Standard library only at import, besides :mod:`jzero.cli.commands` (which imports no JAX either):
:func:`jzero.cli.main.main` builds this parser before anything imports JAX.
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import NoReturn

from jzero.cli.commands import (
    cmd_checkpoint_export,
    cmd_checkpoint_import,
    cmd_checkpoint_info,
    cmd_checkpoint_verify,
    cmd_data_prepare,
    cmd_estimate,
    cmd_launch,
    cmd_plan,
    cmd_report,
    cmd_sample,
    cmd_train,
)
from jzero.config.schema import EXPORT_DTYPES, EXPORT_FORMATS

__all__ = ["build_parser", "version_line"]

_VERSIONED = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint")
_TRAIN_EXAMPLES = """examples:
  jzero train configs/gpt-tiny.yaml
  jzero train configs/gpt-tiny.yaml --set zero.stage=2 --set mesh.axes.data=4 --set mesh.axes.model=2 --set run.dir=runs/tp2"""
_LAUNCH_USAGE = "jzero launch -n N [--devices-per-process K] [--max-restarts R] [--shrink-on-failure] -- train CONFIG [--set ...]"

_Subcommands = argparse._SubParsersAction  # what add_subparsers returns


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, no usage dump
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def version_line() -> str:
    """``jzero 0.1.0 (jax 0.10.2, ..., CUDA plugin: none)``: what a bug report needs, importing no JAX.

    Returns:
      One line: jzero's version, its stack's (or ``not installed``) and the CUDA plugins found.
    """
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


class _JsonSchema(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None) -> NoReturn:  # like --version: no config needed
        import json

        from jzero.ledger.report import CheckedPlanReport, StagesReport
        from jzero.records import json_schema

        print(json.dumps(json_schema(CheckedPlanReport | StagesReport)))
        raise SystemExit(0)


def build_parser() -> argparse.ArgumentParser:
    """The ``jzero`` parser: ``train``, ``plan``, ``estimate``, ``launch``, ``checkpoint``, ``data``, ``sample`` and ``report``.

    Returns:
      A parser whose bad input prints one line and exits with status 2; each subcommand's
      namespace has ``func``, the command to run with it.
    """
    parser = _Parser(prog="jzero", description="ZeRO stages 0-3 for Flax, as JAX sharding specs.")
    parser.add_argument("--version", action=_Version, nargs=0, help="jzero's version and its stack's, then exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_train(sub)
    _add_plan(sub)
    _add_estimate(sub)
    _add_launch(sub)
    _add_checkpoint(sub)
    _add_data(sub)
    _add_sample(sub)
    _add_report(sub)
    return parser


def _with_config(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="train config YAML (e.g. configs/gpt-tiny.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a dotted config key")


def _add_train(sub: _Subcommands) -> None:
    train = sub.add_parser(
        "train", help="train a model", epilog=_TRAIN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _with_config(train)
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.add_argument("--no-resume", action="store_true", help="refuse a run.dir that holds a run or checkpoints")
    train.set_defaults(func=cmd_train)


def _add_plan(sub: _Subcommands) -> None:
    plan = sub.add_parser("plan", help="shardings, bytes per device and collectives, without allocating")
    _with_config(plan)
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    plan.add_argument(
        "--json-schema", action=_JsonSchema, nargs=0, help="print --json's JSON Schema (no config needed), then exit"
    )
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
    plan.add_argument(
        "--nics-per-host", type=int, default=None, help="with --target: NICs per host (default: one per GPU, as in a DGX)"
    )
    plan.add_argument(
        "--nic-gbps",
        type=float,
        default=None,
        help="with --target: each NIC's line rate in Gb/s (default: the DGX NIC, 400 for H100)",
    )
    plan.add_argument("--search", action="store_true", help="with --target: find the fastest configuration that fits")
    plan.add_argument(
        "--global-batch-size", default=None, help="with --search: a batch size, or 'free' to search it (default: the config's)"
    )
    plan.add_argument(
        "--time-budget", default=None, help="with --search: compile for at most this long, e.g. 600, 600s, 10m (default 10m)"
    )
    plan.add_argument(
        "--write", default=None, metavar="OUT.yaml", help="with --search: write the winner as a config (a new file)"
    )
    plan.set_defaults(func=cmd_plan)


def _add_estimate(sub: _Subcommands) -> None:
    from jzero.ledger.estimate import OPTIMIZER_STATE_BYTES, PRECISIONS  # no JAX here

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


def _add_launch(sub: _Subcommands) -> None:
    run = sub.add_parser(
        "launch", help="run a jzero command as N processes of one jax.distributed job on this machine", usage=_LAUNCH_USAGE
    )
    run.add_argument("-n", type=int, required=True, help="processes to start")
    run.add_argument("--devices-per-process", type=int, default=1, help="simulated CPU devices each (default 1)")
    run.add_argument("--max-restarts", type=int, default=0, help="start the job again after a failure, up to R times")
    run.add_argument(
        "--shrink-on-failure", action="store_true", help="restart on the largest smaller count the mesh and batch allow"
    )
    run.add_argument("words", nargs=argparse.REMAINDER, help="-- then a jzero command line: train or plan")
    run.set_defaults(func=functools.partial(cmd_launch, build_parser=build_parser))  # to read the command after --


def _add_checkpoint(sub: _Subcommands) -> None:
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
    export = ckpt_sub.add_parser("export", help="consolidated parameters as safetensors, or a Llama run as a Hugging Face folder")
    export.add_argument("run_dir")
    export.add_argument("--step", type=int, default=None, help="a committed step (default: the latest)")
    formats = "safetensors: one file of jzero's names; hf: a folder transformers loads (a Llama run)"
    export.add_argument("--format", default="safetensors", choices=EXPORT_FORMATS, help=formats)
    export.add_argument("--out", required=True, help="the .safetensors file (--format hf: the folder) to write; must not exist")
    export.add_argument("--dtype", default="float32", choices=EXPORT_DTYPES)
    export.add_argument("--force", action="store_true", help="--format hf: replace --out once the new folder is complete")
    export.add_argument("--merge-lora", action="store_true", help="fold a LoRA run's adapters into the weights they adapt")
    export.set_defaults(func=cmd_checkpoint_export)
    imp = ckpt_sub.add_parser("import", help="a Hugging Face Llama folder as a run at step 0, at the stage and mesh --set asks")
    imp.add_argument("hf_dir", help="config.json, the safetensors (one file, or an index and its files), tokenizer.json")
    imp.add_argument("--out", required=True, help="the run folder to write (must not hold a run)")
    imp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a dotted config key")
    imp.set_defaults(func=cmd_checkpoint_import)


def _add_data(sub: _Subcommands) -> None:
    data = sub.add_parser("data", help="prepare token data for data.tokens")
    data_sub = data.add_subparsers(dest="action", required=True, parser_class=_Parser)
    prep = data_sub.add_parser(
        "prepare", help="tokenize text files, folders, globs or JSONL into a token folder (tokens, validation split, tokenizer)"
    )
    prep.add_argument("sources", nargs="+", help="text files, folders, globs, or .jsonl files with a text field")
    prep.add_argument("--out", required=True, help="the token folder to write (must not exist, or be empty)")
    which = prep.add_mutually_exclusive_group(required=True)
    which.add_argument("--vocab-size", type=int, default=None, help="train a BPE tokenizer of this many ids")
    which.add_argument("--tokenizer", default=None, help="use this tokenizer.json instead")
    prep.add_argument("--eval-fraction", type=float, default=0.02, help="share of documents held out for validation")
    prep.add_argument("--quiet", action="store_true", help="no progress bar")
    prep.set_defaults(func=cmd_data_prepare)


def _add_sample(sub: _Subcommands) -> None:
    sample = sub.add_parser("sample", help="continue a prompt with a run's trained model (KV-cache decoding)")
    sample.add_argument("run_dir", help="a run folder (run.dir) with a checkpoint")
    sample.add_argument("--prompt", default="", help="the text to continue (default: none)")
    sample.add_argument("--max-tokens", type=int, default=200, help="tokens to generate (default 200)")
    sample.add_argument("--temperature", type=float, default=0.8, help="0: greedy (default 0.8)")
    sample.add_argument("--top-k", type=int, default=None, help="sample from the K most likely tokens only")
    sample.add_argument("--seed", type=int, default=0, help="the sampling key's seed")
    sample.add_argument("--step", type=int, default=None, help="a committed checkpoint step (default: the newest)")
    sample.set_defaults(func=cmd_sample)


def _add_report(sub: _Subcommands) -> None:
    report = sub.add_parser("report", help="draw a run's loss, eval loss, tokens/s and MFU as a PNG (plot extra)")
    report.add_argument("run_dir", metavar="RUN_DIR", help="a run folder (run.dir) with a metrics.jsonl")
    report.add_argument(
        "--out", required=True, metavar="FILE.png", help="the PNG to write (replaced if it exists, as a plot is redrawn)"
    )
    report.set_defaults(func=cmd_report)
