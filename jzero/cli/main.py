"""The ``jzero`` command line: ``train``, ``plan``, ``estimate``, ``launch``, ``checkpoint info|verify|export``,
``data prepare``, ``sample`` and ``report``.

Bad input (config, flag, mesh, data path) prints one line naming the key and exits with status 2;
a run or a write that failed for another reason (:class:`~jzero.errors.RunError`), one line and 1.
Ctrl-C prints ``jzero: interrupted`` and exits with status 130, from the first moment: the program's
entry (:mod:`jzero.cli.program`) sets the handler before this module imports, and this module
and the rest of :mod:`jzero.cli` (:mod:`~jzero.cli.parser`, :mod:`~jzero.cli.commands`,
:mod:`~jzero.cli.interrupts`) import only the standard library, :mod:`jzero.config.loading` and
:mod:`jzero.distributed.process` (no JAX); the commands import JAX and Orbax (seconds) inside
:func:`main`, with its handlers in place.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading

from jzero.cli.interrupts import exit_interrupted, on_sigint
from jzero.cli.parser import build_parser, version_line
from jzero.distributed.process import BAD_INPUT, INTERRUPTED, RUN_FAILED
from jzero.errors import JzeroError, RunError

__all__ = ["build_parser", "main", "version_line"]


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status: 0, 1 (a run failed), 2 (bad input), 4 (``jzero train``:
    more than ``train.max_skipped_in_a_row`` non-finite steps in a row) or 130 (Ctrl-C).

    With ``argv`` None, jzero is the program (the ``jzero`` script, ``python -m jzero.cli``) and owns
    the process: Ctrl-C exits at once with one line, even while JAX imports. Called with a list (in
    a Python process of yours), it leaves your SIGINT handling alone and returns 130 on
    KeyboardInterrupt.
    """
    program = argv is None
    previous = None
    if program and threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        args = build_parser().parse_args(argv)
        # Orbax logs its background threads' failures with tracebacks; jzero reports them in one line.
        logging.getLogger("absl").setLevel(logging.CRITICAL)
        if args.command not in ("estimate", "launch", "data", "report"):  # the commands that need no JAX
            from jzero.distributed.process import import_jax

            import_jax(target=bool(getattr(args, "target", None)))  # each command starts the backends it sizes
        return args.func(args)
    except JzeroError as err:  # a config key, a flag, a plan or a checkpoint: one line naming it
        print(f"jzero: error: {err}", file=sys.stderr)
        return BAD_INPUT
    except RunError as err:  # a write the machine refused (a full disk, a read-only folder): one line
        print(f"jzero: {err}", file=sys.stderr)
        return RUN_FAILED
    except KeyboardInterrupt:
        if program:
            exit_interrupted()
        print("jzero: interrupted", file=sys.stderr)
        return INTERRUPTED
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
