"""``jzero plan --search``'s own flags, read and checked before anything is compiled: each bad one is
one line naming the flag (a :class:`~jzero.errors.ConfigError`). No JAX here."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

from jzero.errors import ConfigError, show_value

__all__ = ["BATCH_FACTORS", "DEFAULT_TIME_BUDGET_S", "SearchOptions", "parse_duration", "search_options"]

DEFAULT_TIME_BUDGET_S = 600.0
BATCH_FACTORS = (0.25, 0.5, 1, 2, 4)  # a free batch: the config's times these
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600}
_SEARCH_ONLY = ("--global-batch-size", "--time-budget", "--write")


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """The search's flags, read: ``batch`` is a size, ``"free"``, or None (the config's)."""

    batch: int | str | None
    time_budget_s: float
    write: Path | None

    def sets(self) -> list[str]:
        """Overrides for your config itself: a fixed batch is the batch of every candidate, yours too."""
        return [f"train.global_batch_size={self.batch}"] if isinstance(self.batch, int) else []

    def batches(self, config_batch: int) -> list[int]:
        """The global batch sizes to search."""
        if self.batch == "free":
            return sorted({int(config_batch * f) for f in BATCH_FACTORS if config_batch * f >= 1 and (config_batch * f) % 1 == 0})
        return [self.batch or config_batch]


def parse_duration(text: str, key: str = "--time-budget") -> float:
    """``600``, ``600s``, ``10m``, ``1.5h`` -> seconds, more than 0.

    Raises:
      ConfigError: naming ``key``: not a duration, or not more than 0 seconds.
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*", str(text), re.IGNORECASE)
    if not match:
        raise ConfigError(key, f"expected seconds or a duration like 600s, 10m or 1h, got {show_value(text)}")
    seconds = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if not 0 < seconds < math.inf:
        raise ConfigError(key, f"must be more than 0 seconds, got {show_value(text)}")
    return seconds


def _batch(text: str | None) -> int | str | None:
    if text is None or text.strip().lower() == "free":
        return None if text is None else "free"
    if not re.fullmatch(r"\s*[0-9]+\s*", text) or int(text) < 1:
        raise ConfigError("--global-batch-size", f"expected a positive whole number or 'free', got {show_value(text)}")
    return int(text)


def search_options(
    search: bool, target: str | None, all_stages: bool, batch: str | None, time_budget: str | None, write: str | None
) -> SearchOptions | None:
    """The search's options from ``jzero plan``'s flags; None without ``--search``.

    Raises:
      ConfigError: ``--search`` without ``--target`` or with ``--all-stages``; a search flag without
        ``--search``; a bad batch or time budget; a ``--write`` path that exists (nothing is overwritten).
    """
    given = dict(zip(_SEARCH_ONLY, (batch, time_budget, write), strict=True))
    if not search:
        for flag, value in given.items():
            if value is not None:
                raise ConfigError(flag, "only with --search")
        return None
    if not target:
        raise ConfigError("--search", "needs --target: the search compiles for the GPUs you will run on, e.g. --target h100x64")
    if all_stages:
        raise ConfigError("--all-stages", "not with --search, which searches the stages itself")
    out = Path(write) if write else None
    if out is not None and out.exists():
        raise ConfigError("--write", f"{out} exists: give a new path (nothing is overwritten)")
    if out is not None and not out.resolve().parent.is_dir():
        raise ConfigError("--write", f"{out.parent} is not a folder")
    budget = DEFAULT_TIME_BUDGET_S if time_budget is None else parse_duration(time_budget)
    return SearchOptions(_batch(batch), budget, out)
