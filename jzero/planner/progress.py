"""The search's progress bar on stderr: candidates compiled and left, and the one compiling (rich);
off for ``--json``."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["SearchProgress"]


class SearchProgress:
    """``compiled 12/40 [bar] 0:01:02 stage 3, data=64, ...``; :meth:`update` is the search's ``on_progress``."""

    def __init__(self, enabled: bool = True):
        console = Console(stderr=True)
        self._progress = Progress(
            TextColumn("compiled"),
            MofNCompleteColumn(),
            BarColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[label]}"),
            console=console,
            disable=not (enabled and console.is_terminal),  # a log file gets the table alone
            transient=True,  # gone once the search ends: its table, or one line of bad input, stands alone
        )
        self._task = self._progress.add_task("search", total=None, label="")

    def __enter__(self) -> SearchProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.__exit__(*exc)

    def update(self, compiled: int, total: int, label: str) -> None:
        """Before each compile: ``compiled`` of ``total`` done, ``label`` next."""
        self._progress.update(self._task, completed=compiled, total=total, label=label)
