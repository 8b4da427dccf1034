"""The ``jzero`` program's entry (the ``jzero`` script and ``python -m jzero.cli``): Ctrl-C's handler
goes in first, then the command line's own modules import (a few hundred milliseconds on a busy
host: a Ctrl-C there printed Python's traceback), then :func:`jzero.cli.main.main` runs. Once it has
returned, Ctrl-C is ignored: the command is done, and while Python shuts down it restores SIGINT's
default action, under which a late Ctrl-C killed a finished ``checkpoint export`` by the signal,
status -2 and nothing said (a CI run of tests/training/test_faults.py)."""

from __future__ import annotations

import signal
import threading

from jzero.cli.interrupts import on_sigint

__all__ = ["run"]


def run() -> int:
    """Run the ``jzero`` command of ``sys.argv``; returns its exit status (:func:`jzero.cli.main.main`)."""
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:
        signal.signal(signal.SIGINT, on_sigint)
    try:
        from jzero.cli.main import main

        return main()
    finally:
        if main_thread:  # Python's shutdown leaves an ignored signal ignored (it resets handlers it set)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
