"""Ctrl-C on the command line: :func:`on_sigint`, the handler :func:`jzero.cli.main.main` installs
(exit 130 at once, with one line), and :func:`interrupt_raises`, the blocks that must clean up first.

Its own module, below both :mod:`jzero.cli.main` and :mod:`jzero.cli.commands`, so that neither
imports the other.
"""

from __future__ import annotations

import contextlib
import signal
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
    once, so ``finally`` blocks run. Another handler than :func:`on_sigint` is left alone."""
    ours = signal.getsignal(signal.SIGINT) is on_sigint  # set only in the main thread
    if ours:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ours:
            signal.signal(signal.SIGINT, on_sigint)
