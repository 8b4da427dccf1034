"""Preemption: SIGTERM or SIGINT asks the loop to save at the next step boundary and exit cleanly.

A second SIGINT aborts at once (``KeyboardInterrupt``). With several processes the request is
agreed at each step boundary, so every process saves the same step.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

import jax
import numpy as np
from jax.experimental import multihost_utils

__all__ = ["Preemption", "SIGNALS"]

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preemption:
    """A context manager that installs the handlers (main thread only) and restores the old ones.

    ``signal`` is what this process received; ``agreed`` is what :meth:`requested` found across
    all processes, the same on each: the signal's name, and with several processes the first one
    that received it.
    """

    def __init__(self) -> None:
        self.signal: str | None = None
        self.agreed: str | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> Preemption:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.signal is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            return
        self.signal = name
        message = f"jzero: {name}: saving at the next step boundary (SIGINT again aborts without saving)"
        print(message, file=sys.stderr, flush=True)

    def requested(self) -> bool:
        """Whether any process was asked to stop (a collective when there are several: every
        process must call it at the same step boundary)."""
        if self.agreed is not None:
            return True
        if jax.process_count() == 1:
            self.agreed = self.signal
            return self.agreed is not None
        local = signal.Signals[self.signal].value if self.signal else 0
        received = np.asarray(multihost_utils.process_allgather(np.int32(local))).ravel()
        senders = np.flatnonzero(received)
        if senders.size:
            first = int(senders[0])
            self.agreed = f"{signal.Signals(int(received[first])).name} to process {first}"
        return self.agreed is not None
