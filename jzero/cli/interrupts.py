"""Ctrl-C on the command line: :func:`on_sigint`, the handler :func:`jzero.cli.main.main` installs
(exit 130 at once, with one line), and :func:`interrupt_raises`, the blocks that must clean up first.

Its own module, below both :mod:`jzero.cli.main` and :mod:`jzero.cli.commands`, so that neither
imports the other.
"""

from __future__ import annotations

import _thread
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import NoReturn

from jzero.distributed.process import INTERRUPTED

__all__ = ["exit_interrupted", "interrupt_raises", "on_sigint"]


def exit_interrupted() -> NoReturn:
    """Print ``jzero: interrupted`` and end the process with status 130, skipping cleanup."""
    from jzero.distributed.process import exit_now  # imported already whenever fd 2 can be diverted

    exit_now("interrupted", INTERRUPTED)


def on_sigint(signum: int, frame: FrameType | None) -> None:
    """The SIGINT handler: :func:`exit_interrupted`."""
    # Exit here rather than raise KeyboardInterrupt: raised inside a finalizer or a callback it is
    # ignored with a traceback, and the command runs on.
    exit_interrupted()


@contextlib.contextmanager
def interrupt_raises() -> Iterator[None]:
    """Within the block SIGINT raises KeyboardInterrupt (Python's default) instead of exiting at
    once, so ``finally`` blocks run. Another handler than :func:`on_sigint` is left alone.

    A KeyboardInterrupt raised inside a finalizer or a garbage-collector callback (JAX's runs at
    each collection) can only be printed there, and the command would run on and exit 0: it is
    raised again in the block's own code instead."""
    if signal.getsignal(signal.SIGINT) is not on_sigint:  # ours is set only in the main thread
        yield
        return
    signal.signal(signal.SIGINT, _raise_interrupt)
    hook, sys.unraisablehook = sys.unraisablehook, _RaiseAgain(sys.unraisablehook)
    try:
        yield
    finally:
        sys.unraisablehook = hook
        signal.signal(signal.SIGINT, on_sigint)


class _RaiseAgain:
    """``sys.unraisablehook`` within :func:`interrupt_raises`: a swallowed KeyboardInterrupt is
    Ctrl-C again (``hook`` prints the rest)."""

    def __init__(self, hook):
        self.hook = hook

    def __call__(self, info) -> None:
        if info.exc_type is not None and issubclass(info.exc_type, KeyboardInterrupt):
            _ctrl_c_again()
        else:
            self.hook(info)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGINT within :func:`interrupt_raises`: KeyboardInterrupt, except while the hook above runs,
    where it would be swallowed too."""
    while frame is not None:
        if frame.f_code is _RaiseAgain.__call__.__code__:
            _ctrl_c_again()
            return
        frame = frame.f_back
    raise KeyboardInterrupt


_again = threading.Lock()  # held while a Ctrl-C is to be sent again: one at a time


def _ctrl_c_again() -> None:
    # From another thread, a moment later: SIGINT tripped from here would run its handler at once,
    # still inside the finalizer or the hook. If it lands in one again, the hook sends it again.
    if _again.acquire(blocking=False):
        timer = threading.Timer(0.01, _send_again)
        timer.daemon = True
        timer.start()


def _send_again() -> None:
    _again.release()
    _thread.interrupt_main(signal.SIGINT)
