"""``jzero plan --search``: the fastest configuration that provably fits, for a GPU target.

The search enumerates :func:`jzero.planner.candidates.candidates`, drops those whose estimated
bytes exceed the budget, and compiles the rest deviceless, best estimate first, each from the same
abstract state, until the time budget runs out. Your config as given is compiled first. A candidate
is **certified** when its compiled device peak (the compiler's own memory analysis) is within the
budget; the certified ones are ranked by the compiled step's predicted tokens/s
(:mod:`jzero.ledger.prediction`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from jzero.config.loading import load_config
from jzero.config.schema import Config
from jzero.dtypes import FP8_RECIPES
from jzero.errors import ConfigError, JzeroError, error_line
from jzero.ledger.plan_report import with_verdict
from jzero.ledger.render import human_bytes
from jzero.ledger.report import CheckedPlanReport
from jzero.ledger.targets import Target, target_devices
from jzero.ledger.timing import Hardware, predict
from jzero.models.names import DECODERS, GPT
from jzero.planner.candidates import candidates, estimate, estimate_inputs
from jzero.training.job import Job, build_job
from jzero.training.report import plan_report

__all__ = ["YOURS", "Row", "Search", "pareto", "refuse_unfit", "search", "smallest_peak"]

YOURS = "your config"
BUILT_IN = (GPT, *DECODERS)  # the models whose layer shape prices a candidate (jzero.models.sizes.layer_shape)


@dataclasses.dataclass
class Row:
    """One compiled candidate: its label and ``--set`` words (none for your config as given), the
    estimate that ordered it, and its plan report with the verdict (or the error its compile raised)."""

    label: str
    sets: list[str]
    estimated_bytes: float | None
    estimated_tokens_per_sec: float | None
    report: CheckedPlanReport | None = None
    error: str | None = None

    @property
    def fits(self) -> bool:
        return bool(self.report and self.report.fits)

    @property
    def tokens_per_sec(self) -> float:
        return (self.report.predicted.tokens_per_sec or 0.0) if self.report else 0.0  # None: no prediction


@dataclasses.dataclass
class Search:
    """What a search did and found."""

    target: str
    memory_per_device: float
    time_budget_s: float
    considered: int
    over_budget: int  # ruled out by the estimate, never compiled
    refused: int  # refused by config validation or planning
    left: int  # not compiled when the time budget ran out
    elapsed_s: float
    rows: list[Row]

    @property
    def certified(self) -> list[Row]:
        """The compiled rows that fit and have a prediction, fastest first."""
        return sorted((r for r in self.rows if r.fits and r.tokens_per_sec), key=lambda r: -r.tokens_per_sec)

    @property
    def winner(self) -> Row | None:
        return next(iter(self.certified), None)

    @property
    def yours(self) -> Row:
        return self.rows[0]


def pareto(rows: list[Row]) -> list[Row]:
    """The rows no other row beats on both device peak (lower) and predicted tokens/s (higher)."""
    front, best = [], -1.0
    for row in sorted(rows, key=lambda r: (r.report.device_peak, -r.tokens_per_sec)):
        if row.tokens_per_sec > best:
            front.append(row)
            best = row.tokens_per_sec
    return front


def search(
    config_path: str | Path,
    sets: list[str],
    target: Target,
    memory_per_device: float,
    *,
    batches: list[int] | None = None,
    time_budget_s: float = 600.0,
    on_progress: Callable[[int, int, str], None] | None = None,
) -> Search:
    """Search ``target``'s configurations of a config for the fastest that fits.

    Args:
      config_path: the config file; ``sets`` its ``--set`` overrides.
      sets: overrides applied before each candidate's own.
      target: the GPUs.
      memory_per_device: the budget, bytes per device.
      batches: the global batch sizes to consider (default: the config's only).
      time_budget_s: compiles start while this many seconds have not passed.
      on_progress: called ``(compiled, to_compile, label)`` before each compile.

    Returns:
      The :class:`Search`; its :attr:`Search.winner` is None when nothing fits.
    """
    start = time.perf_counter()
    config = load_config(config_path, sets)
    if config.model.name not in BUILT_IN:
        raise ConfigError(
            "--search", "prices the candidates of jzero's own models (jzero.models.architectures) by their layers' shapes, "
            "which a model of your own does not give: plan it without --search, with your stage and mesh",
        )  # fmt: skip
    devices = target_devices(target)
    base = build_job(config, devices)
    base.check_xla_options()  # one line and exit 2, not a refusal in every candidate's row
    figures = estimate_inputs(base.plan, base.config, base.flops_per_token, np.dtype(base.precision.compute_dtype).itemsize)
    hardware = target.hardware()
    batches = batches or [base.config.train.global_batch_size]
    queue, considered, over = [], 0, 0
    for candidate in candidates(figures, target, batches, base.config.zero, float8_recipe(base.config)):
        considered += 1
        nbytes, cost = estimate(candidate, figures, target)
        if nbytes > memory_per_device:
            over += 1
            continue
        queue.append((predict(cost, hardware).tokens_per_sec, nbytes, candidate))
    queue.sort(key=lambda item: -item[0])
    rows = [_compile(base, Row(YOURS, [], None, None), memory_per_device, hardware)]
    refused = 0
    for done, (tokens, nbytes, candidate) in enumerate(queue):
        if time.perf_counter() - start >= time_budget_s:
            break
        if on_progress:
            on_progress(done, len(queue), candidate.label)
        row = Row(candidate.label, candidate.sets(), nbytes, tokens)
        job = _job(config_path, [*sets, *row.sets], devices, base)
        if job is None:
            refused += 1
            continue
        rows.append(_compile(job, row, memory_per_device, hardware))
    else:
        done = len(queue)
    left = len(queue) - done
    elapsed = time.perf_counter() - start
    return Search(target.name, memory_per_device, time_budget_s, considered, over, refused, left, elapsed, rows)


def float8_recipe(config: Config) -> str | None:
    """The float8 recipe the search tries beside none: the config's, or ``tensorwise`` (torchtitan's
    default); None where the compute is not bfloat16."""
    compute = config.precision.compute_dtype or config.precision.param_dtype
    if compute != "bfloat16":
        return None
    return config.precision.fp8 if config.precision.fp8 != FP8_RECIPES[0] else FP8_RECIPES[1]


def _job(config_path: str | Path, sets: list[str], devices: list, base: Job) -> Job | None:
    """The candidate's job from the base job's abstract state; None when its config or plan is refused."""
    try:
        return build_job(load_config(config_path, sets), devices, abstract=base.abstract)
    except JzeroError:
        return None


def _compile(job: Job, row: Row, memory_per_device: float, hardware: Hardware) -> Row:
    """Compile a candidate and keep its plan report with the verdict; a compile that fails is kept with its error line."""
    try:
        _, compiled = job.compile_step()
        row.report = with_verdict(plan_report(job, compiled, hardware), memory_per_device)
    except Exception as err:  # noqa: BLE001 - one candidate XLA cannot compile must not end the search
        row.error = error_line(err)
    return row


def smallest_peak(result: Search) -> Row | None:
    """The compiled row with the smallest device peak (what a budget nothing fits is told)."""
    compiled = [r for r in result.rows if r.report]
    return min(compiled, key=lambda r: r.report.device_peak, default=None)


def refuse_unfit(result: Search, budget_text: str) -> None:
    """Raise when nothing certified fits, naming the smallest compiled peak and what gave it.

    Raises:
      ConfigError: naming ``--memory-per-device``.
    """
    if result.winner is not None:
        return
    smallest = smallest_peak(result)
    found = "no candidate compiled"
    if smallest is not None:
        found = f"the smallest compiled device peak was {human_bytes(smallest.report.device_peak)} ({smallest.label})"
    raise ConfigError("--memory-per-device", f"no candidate fits in {budget_text} per device: {found}")
