"""The run's picture: ``jzero report RUN_DIR --out FILE.png`` draws ``metrics.jsonl`` as a PNG.

Train and eval loss against the step, and beneath them tokens per second and MFU where the run
logged them. No JAX; matplotlib (the ``plot`` extra) is imported only to draw.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jzero.config.run_folder import RunDir, not_a_folder
from jzero.errors import ConfigError, path_error, show_value

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["INSTALL", "Metrics", "Series", "check_out", "draw", "plot_command", "read_metrics", "write_png"]

INSTALL = "pip install 'jzero[plot]' (in a clone: pip install -e '.[plot]')"
SIZE_INCHES, DPI = (8.0, 6.0), 100  # an 800 x 600 PNG


@dataclasses.dataclass(frozen=True)
class Series:
    """One quantity at the steps that logged it.

    Attributes:
      steps: the logged steps that hold it, in order.
      values: its value at each of those steps.
    """

    steps: tuple[int, ...]
    values: tuple[float, ...]

    def __bool__(self) -> bool:
        return bool(self.steps)


@dataclasses.dataclass(frozen=True)
class Metrics:
    """What the picture draws from a run's ``metrics.jsonl``.

    Attributes:
      name: the run's name (its folder's).
      loss: the training loss at each logged step.
      eval_loss: the eval loss at the eval steps (empty without eval).
      tokens_per_sec: the training rate at each logged step that has it.
      mfu: model FLOPs utilization, a fraction, where the device's peak is known (empty on CPU).
    """

    name: str
    loss: Series
    eval_loss: Series
    tokens_per_sec: Series
    mfu: Series


def read_metrics(run_dir: str | Path) -> Metrics:
    """Reads a run folder's ``metrics.jsonl``.

    A last line without its newline is skipped: the run is writing it, or was killed writing it.

    Args:
      run_dir: a run folder (``run.dir``).

    Returns:
      The run's :class:`Metrics`, ordered by step.

    Raises:
      ConfigError: no such folder, no ``metrics.jsonl``, a line that is not a record (named by its
        number), or no record with a loss; each names the path.
    """
    folder = Path(run_dir)
    if problem := not_a_folder(folder):
        raise ConfigError(str(folder), problem)
    path = RunDir(folder).metrics
    if not path.is_file():
        raise ConfigError(str(folder), f"is not a run folder: it holds no {path.name} (jzero train writes one)")
    rows = sorted(_rows(path), key=lambda row: row["step"])
    loss = _series(rows, "loss")
    if not loss:
        raise ConfigError(str(path), "holds no record with a loss: nothing to draw")
    name = folder.resolve().name
    return Metrics(name, loss, _series(rows, "eval_loss"), _series(rows, "tokens_per_sec"), _series(rows, "mfu"))


def _rows(path: Path) -> list[dict[str, Any]]:
    """Each record of the log; a complete line that is not one is bad input."""
    try:
        text = path.read_text(errors="replace")
    except OSError as err:
        raise ConfigError(str(path), f"could not be read: {err.strerror or err}") from None
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        lines = lines[:-1] if _record(lines[-1]) is None else lines  # torn mid-write
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if (row := _record(line)) is None:
            raise ConfigError(str(path), f"line {number} is not a record (a JSON object with a step): {show_value(line)}")
        rows.append(row)
    return rows


def _record(line: str) -> dict[str, Any] | None:
    """A line as a record: an object with an integer step and numbers for the figures it has."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    if not isinstance(row, dict) or type(row.get("step")) is not int:
        return None
    drawn = ("loss", "eval_loss", "tokens_per_sec", "mfu")
    numbers = all(isinstance(row[k], int | float) and not isinstance(row[k], bool) for k in drawn if k in row)
    return row if numbers else None


def _series(rows: list[dict[str, Any]], key: str) -> Series:
    kept = [(row["step"], float(row[key])) for row in rows if key in row]
    return Series(tuple(s for s, _ in kept), tuple(v for _, v in kept))


def check_out(out: str | Path) -> Path:
    """The ``--out`` path, checked before anything is drawn.

    Raises:
      ConfigError: not a ``.png`` name, its folder missing, or a folder itself.
    """
    path = Path(out)
    if path.suffix.lower() != ".png":
        raise ConfigError("--out", f"{out} must be a .png file")
    if not path.parent.is_dir():
        raise ConfigError("--out", f"{out}: its folder {path.parent} does not exist")
    if path.is_dir():
        raise ConfigError("--out", f"{out} is a folder")
    return path


def draw(metrics: Metrics) -> Figure:
    """Draws the run: loss above, throughput below when the run logged any.

    Args:
      metrics: from :func:`read_metrics`.

    Returns:
      The ``matplotlib.figure.Figure`` (not attached to pyplot: nothing global to close).

    Raises:
      ConfigError: matplotlib is not installed (the ``plot`` extra).
    """
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError("", f"jzero report draws with matplotlib, which is not installed: {INSTALL}") from None
    fig = Figure(figsize=SIZE_INCHES, dpi=DPI, layout="constrained")
    throughput = bool(metrics.tokens_per_sec or metrics.mfu)
    axes = fig.subplots(2, 1, sharex=True, height_ratios=(2, 1)) if throughput else [fig.subplots()]
    fig.suptitle(metrics.name, fontweight="bold")
    _draw_loss(axes[0], metrics)
    if throughput:
        _draw_throughput(axes[1], metrics)
    axes[-1].set_xlabel("step")
    return fig


def _draw_loss(ax: Axes, metrics: Metrics) -> None:
    loss, evals = metrics.loss, metrics.eval_loss
    lone = "o" if len(loss.steps) == 1 else None  # a line through one point draws nothing
    ax.plot(loss.steps, loss.values, label="train loss", color="tab:blue", linewidth=1.2, marker=lone)
    title = f"loss {_g(loss.values[0])} at step {loss.steps[0]:,} → {_g(loss.values[-1])} at step {loss.steps[-1]:,}"
    if evals:
        ax.plot(evals.steps, evals.values, "o-", label="eval loss", color="tab:orange", markersize=4, linewidth=1)
        title += f"; eval {_g(evals.values[-1])} at step {evals.steps[-1]:,}"
    ax.set_title(title, fontsize=10)
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right")


def _draw_throughput(ax: Axes, metrics: Metrics) -> None:
    tps, mfu = metrics.tokens_per_sec, metrics.mfu
    parts, handles = [], []
    if tps:
        handles += ax.plot(tps.steps, tps.values, label="tokens/s", color="tab:green", linewidth=1)
        ax.set_ylabel("tokens/s")
        ax.set_ylim(bottom=0)  # a rate's scale starts at zero, so a dip reads at its size
        parts.append(f"median {_g(_median(tps.values))} tokens/s")
    if mfu:
        twin = ax.twinx() if tps else ax  # its own scale: a fraction, not a rate
        handles += twin.plot(mfu.steps, [100 * v for v in mfu.values], label="MFU", color="tab:purple", linewidth=1)
        twin.set_ylabel("MFU (%)")
        twin.set_ylim(bottom=0)
        parts.append(f"MFU {100 * _median(mfu.values):.1f}%")
    ax.set_title(", ".join(parts), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(handles=handles, loc="lower right")


def _median(values: tuple[float, ...]) -> float:
    finite = [v for v in values if math.isfinite(v)]  # a NaN would make the median meaningless
    return statistics.median(finite) if finite else math.nan


def _g(value: float) -> str:
    """A figure as the title shows it: 3 significant digits, thousands separated."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def write_png(fig: Figure, out: Path) -> None:
    """Writes the figure as a PNG at ``out``, replacing a file there only once the new one is whole.

    Raises:
      OutputWriteError: the machine refused the file (its folder read-only, the disk full).
      ConfigError: ``--out`` cannot be a file (:func:`jzero.errors.path_error`).
    """
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        fig.savefig(tmp, format="png")
        os.replace(tmp, out)
    except OSError as err:
        raise path_error("--out", out, err, "write") from None
    finally:
        tmp.unlink(missing_ok=True)


def plot_command(args: argparse.Namespace) -> int:
    """``jzero report``: checks ``--out``, reads the run, draws it; 0, bad input (a ``ConfigError``), or a
    write the machine refused (an ``OutputWriteError``)."""
    out = check_out(args.out)
    fig = draw(read_metrics(args.run_dir))
    write_png(fig, out)
    width, height = fig.canvas.get_width_height()
    print(f"wrote {out} ({width} x {height})")
    return 0
