"""This process: starting JAX quietly, and exiting at once.

JAX is imported with its platforms set before its backends start (:func:`import_jax`); with the
``gpu-target`` extra on a host without a GPU, the CUDA plugin's native no-GPU notices are dropped
from fd 2, which is diverted meanwhile. :func:`exit_now` is the one way out that skips Python's
shutdown, and it writes to the real stderr even while fd 2 is diverted.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import NoReturn

from jzero.compiler.platforms import cuda_driver_present, gpu_compiler_available, platforms_for
from jzero.compiler.xla_flags import check_xla_flags

__all__ = [
    "BAD_INPUT",
    "DIVERGED",
    "INTERRUPTED",
    "LOST_PEER",
    "RUN_FAILED",
    "cuda_driver_present", "exit_now", "import_jax", "platforms_for", "start_backends",
]

# Exit statuses of a jzero process, which the launcher reads from each of its processes.
RUN_FAILED = 1  # a run stopped (a RunError)
BAD_INPUT = 2  # a JzeroError: one line naming the key or path
LOST_PEER = 3  # a peer process was lost; this one ended without finishing the run
# More than train.max_skipped_in_a_row non-finite steps in a row (a TooManySkipped): not 3, as the
# launcher restarts a lost peer's job, and a restart would resume the same batches and diverge again.
DIVERGED = 4
INTERRUPTED = 130  # Ctrl-C


# What the CUDA plugin's native code prints on stderr whenever JAX starts on a host without a GPU.
_NO_GPU_NOTICES = ("cudart_stub.cc", "All log messages before absl::InitializeLog() is called")
_stderr_fd: int | None = None  # the real stderr while fd 2 is diverted (for exit_now)


@contextlib.contextmanager
def _dropping_no_gpu_notices() -> Iterator[None]:
    """Divert fd 2 (native code writes there directly) and pass on every line but the notices;
    without the plugin there are none, and nothing is diverted."""
    global _stderr_fd
    if not gpu_compiler_available():
        yield
        return
    sys.stderr.flush()
    _stderr_fd = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(_stderr_fd, 2)
            os.close(_stderr_fd)
            _stderr_fd = None
            caught.seek(0)
            for line in caught.read().decode(errors="replace").splitlines(keepends=True):
                if not any(notice in line for notice in _NO_GPU_NOTICES):
                    sys.stderr.write(line)


def import_jax(target: bool = False) -> None:
    """Import JAX and set its platforms (:func:`platforms_for`) before its backends start.

    With the ``gpu-target`` extra on a host without a GPU, the CUDA plugin's native code prints
    notices that there is no GPU when JAX is imported and when its backends start; the command line
    drops exactly those lines (see :func:`start_backends`). An ``XLA_FLAGS`` that XLA would abort on is
    refused first (:func:`jzero.compiler.xla_flags.check_xla_flags`).
    """
    check_xla_flags()
    with _dropping_no_gpu_notices():
        import jax
    platforms = platforms_for(target)
    if platforms and jax.config.jax_platforms != platforms:
        jax.config.update("jax_platforms", platforms)


def start_backends() -> None:
    """Start JAX's backends now, dropping the CUDA plugin's no-GPU notices (:func:`import_jax`)."""
    import jax

    with _dropping_no_gpu_notices():
        jax.devices()


def exit_now(message: str, status: int) -> NoReturn:
    """``jzero: message`` on the real stderr, and exit with ``status`` at once, skipping Python's
    shutdown: that would wait for threads and barriers that lost peers never join, and after an
    interrupt inside JAX's tracing or compiling it crashed (SIGSEGV). Nothing is lost that a kill
    would keep: checkpoints commit atomically, and an export removes its temporary file first."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a flush re-entered from a signal handler; the line below still goes out
            pass
    os.write(_stderr_fd or 2, f"jzero: {message}\n".encode())
    os._exit(status)
