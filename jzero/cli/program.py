"""The ``jzero`` program's entry (the ``jzero`` script and ``python -m jzero.cli``): Ctrl-C's handler
goes in first, then the command line's own modules import (a few hundred milliseconds on a busy
host: a Ctrl-C there printed Python's traceback), then :func:`jzero.cli.main.main` runs."""

from __future__ import annotations

import signal
import threading

from jzero.cli.interrupts import on_sigint

__all__ = ["run"]


def run() -> int:
    """Run the ``jzero`` command of ``sys.argv``; returns its exit status (:func:`jzero.cli.main.main`)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, on_sigint)
    from jzero.cli.main import main

    return main()
