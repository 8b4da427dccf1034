"""Preemption: SIGTERM or SIGINT asks the loop to save at the next step boundary and exit cleanly.

A second SIGINT aborts at once (``KeyboardInterrupt``), also when both arrive while the main
thread is inside JAX's native code: Python then runs the handler once for both, so the handler counts
the deliveries that ``signal.set_wakeup_fd`` wrote. With several processes the request is agreed at
each step boundary, so every process saves the same step.
"""

from __future__ import annotations

import os
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
        self._wakeup: tuple[int, int] | None = None  # (read, write) ends of the deliveries' pipe

    def __enter__(self) -> Preemption:
        if threading.current_thread() is threading.main_thread():
            self._count_deliveries()
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if self._wakeup is not None:
            signal.set_wakeup_fd(-1)
            for fd in self._wakeup:
                os.close(fd)
            self._wakeup = None

    def _count_deliveries(self) -> None:
        """Have Python's C-level handler write one byte per delivered signal to a pipe, unless the
        process already uses a wakeup fd (an asyncio loop): that one is left in place."""
        read, write = os.pipe()
        for fd in (read, write):
            os.set_blocking(fd, False)
        previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        if previous == -1:
            self._wakeup = (read, write)
            return
        signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)

    def _sigints(self) -> int:
        """The SIGINTs delivered since the handler last ran (at least the one it runs for)."""
        if self._wakeup is None:
            return 1
        try:
            written = os.read(self._wakeup[0], 4096)
        except BlockingIOError:
            written = b""
        return max(1, written.count(signal.SIGINT.value))

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        presses = self._sigints() if signum == signal.SIGINT else 0
        if self.signal is not None:
            if presses:
                raise KeyboardInterrupt
            return
        self.signal = name
        message = f"jzero: {name}: saving at the next step boundary (SIGINT again aborts without saving)"
        print(message, file=sys.stderr, flush=True)
        if presses > 1:  # the second Ctrl-C came before Python ran the handler for the first
            raise KeyboardInterrupt

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
