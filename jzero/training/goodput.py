"""Where a run's wall time went: training steps against start-up, compile, data, checkpoints, eval
and the profiler's own start and stop. Goodput is the steps' share.

The loop times each of the others where it happens (:meth:`Goodput.timed`); the steps' time is
what the loop took besides them. A checkpoint save or an eval first waits for the step in flight
(outside its timer), so the step's own device time is not charged to them; a batch's loading is
charged only when the step before it had finished by then (otherwise the device was busy and
nothing waited).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from jzero.ledger.startup import GoodputReport

__all__ = ["KINDS", "NOT_TRAINING", "Goodput", "format_goodput"]

KINDS = ("startup", "compile", "data", "checkpoint", "eval", "profile")  # besides the steps themselves
NOT_TRAINING = ("checkpoint", "eval", "profile")  # what tokens/s leaves out of its intervals (data waits stay in)


class Goodput:
    """Seconds per kind of work since it was made; :meth:`report` gives the shares."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.seconds = dict.fromkeys(KINDS, 0.0)

    @contextlib.contextmanager
    def timed(self, kind: str) -> Iterator[None]:
        """Charge the block's wall time to ``kind`` (one of :data:`KINDS`), less what was charged
        inside it to other kinds (a compile inside the start-up)."""
        t0, inner = time.perf_counter(), sum(self.seconds.values())
        try:
            yield
        finally:
            self.seconds[kind] += time.perf_counter() - t0 - (sum(self.seconds.values()) - inner)

    def charge(self, kind: str, seconds: float) -> None:
        self.seconds[kind] += seconds

    def report(self) -> GoodputReport:
        """The wall time, the seconds by kind (``steps``, ``startup``, ...; the steps' time is the
        wall time less every other kind's) and ``goodput``, the steps' share."""
        wall = time.perf_counter() - self.started
        steps = max(wall - sum(self.seconds.values()), 0.0)
        return GoodputReport(wall_s=wall, goodput=steps / wall if wall > 0 else 0.0, seconds={"steps": steps, **self.seconds})


def format_goodput(report: GoodputReport) -> str:
    """One line: ``goodput 0.81 of 95.2 s: steps 81.0%, start-up 3.1%, compile 9.8%, ...``."""
    wall = report.wall_s
    parts = ", ".join(f"{kind.replace('startup', 'start-up')} {100 * s / wall:.1f}%" for kind, s in report.seconds.items())
    return f"goodput {report.goodput:.2f} of {wall:.1f} s: {parts}"
