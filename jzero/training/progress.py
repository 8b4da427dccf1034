"""A progress bar showing step, loss and tokens/s (rich), quiet when disabled."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["TrainProgress"]


class TrainProgress:
    """The bar (``enabled``); ``silent`` also drops the announcements, as on every process but 0."""

    def __init__(self, total_steps: int, enabled: bool = True, silent: bool = False):
        self.enabled = enabled and not silent
        self.silent = silent
        self.console = Console(stderr=True)
        # A bar redrawn in place on a terminal, from the first step on (a run with nothing to do
        # shows none); elsewhere, a line per logged step and no bar.
        self._started = False
        self._progress = Progress(
            TextColumn("step"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[tps]} tok/s"),
            TextColumn("{task.fields[eval]}"),
            TimeElapsedColumn(),
            console=self.console,
            disable=not (self.enabled and self.console.is_terminal),
        )
        self._eval = ""
        self._task = self._progress.add_task("train", total=total_steps, loss="-", tps="-", eval="")

    def __enter__(self) -> TrainProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._started:
            self._progress.stop()

    def _start(self) -> None:
        if not self._started:
            self._progress.start()
            self._started = True

    def note(self, text: str) -> None:
        if self.enabled:
            self._progress.console.print(text, highlight=False, soft_wrap=True)

    def announce(self, text: str) -> None:
        """Printed even when the bar is off: what the run resumed from, and warnings."""
        if not self.silent:
            self._progress.console.print(text, highlight=False, soft_wrap=True)

    def advance(self, step: int) -> None:
        self._start()
        self._progress.update(self._task, completed=step)

    def update(self, step: int, record: dict[str, Any]) -> None:
        """Show a logged record: its loss and tokens/s, and the last eval loss (and perplexity)."""
        if "eval_loss" in record:
            self._eval = f"eval {record['eval_loss']:.4f} (ppl {record['eval_perplexity']:.1f})"
        fields = {"loss": f"{record['loss']:.4f}", "tps": f"{record['tokens_per_sec']:,.0f}", "eval": self._eval}
        self._start()
        self._progress.update(self._task, completed=step, **fields)
        if self.enabled and not self.console.is_terminal:
            line = f"step {step}  loss {fields['loss']}  {fields['tps']} tok/s"
            self.console.print(line + (f"  {self._eval}" if "eval_loss" in record else ""), highlight=False)
