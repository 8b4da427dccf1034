"""``jzero launch``: one jzero command as N processes of one ``jax.distributed`` job on this machine.

Each process gets K simulated CPU devices (``runtime.cpu_devices``) and the job's coordinator in its
environment (:data:`jzero.distributed.runtime.ENV_COORDINATOR` and the others), which
``runtime.distributed: auto`` reads; the collectives use gloo. Output lines are prefixed with the
process index, and the exit status is the worst of the processes'. With ``--max-restarts`` a failed
job is started again, on the same count or (``--shrink-on-failure``) the largest smaller one the mesh
and the batch allow; ``jzero train`` resumes from the newest committed checkpoint, resharded.

No JAX here: the launcher only starts, watches and restarts processes.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import BinaryIO

from jzero.config.loading import load_config
from jzero.config.run_folder import RunDir
from jzero.config.schema import MAX_CPU_DEVICES, Config
from jzero.distributed.process import BAD_INPUT, DIVERGED, INTERRUPTED
from jzero.distributed.runtime import ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID
from jzero.errors import ConfigError
from jzero.sharding.axes import check_batch_divides, mesh_text, resolve_axes

__all__ = [
    "LaunchSpec",
    "fit_problem",
    "free_port",
    "launch",
    "parse_spec",
    "process_env",
    "shrunk_count",
]

LAUNCHABLE = ("train", "plan")
GRACE_S = 30  # beyond runtime.heartbeat_timeout_s, before the launcher kills a survivor itself


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    """What to start: ``words`` (a jzero command line) as ``processes`` x ``devices_per_process``."""

    words: tuple[str, ...]
    processes: int
    devices_per_process: int
    config: Config  # the command's config, as each process will read it

    def command(self) -> list[str]:
        return [sys.executable, "-m", "jzero.cli", *self.words, "--set", f"runtime.cpu_devices={self.devices_per_process}"]


def fit_problem(config: Config, processes: int, devices_per_process: int) -> str | None:
    """Why ``processes`` x ``devices_per_process`` devices cannot run ``config``'s mesh and batch,
    or None: the mesh must use every device (each process holds part of it), ``mesh.dcn`` must
    span the processes, and the global batch must split over the batch axes."""
    total = processes * devices_per_process
    launched = f"{processes} processes x {devices_per_process} devices = {total}"
    try:
        axes = resolve_axes(config.mesh.axes, total)
    except ConfigError as err:
        return f"{err} ({launched} launched)"
    used = math.prod(axes.values())
    if used != total:
        return f"mesh.axes: {mesh_text(axes)} uses {used} of the {launched} devices launched; every process needs its part"
    ways = math.prod(config.mesh.dcn.values())
    if config.mesh.dcn and ways != processes:
        return f"mesh.dcn: the dcn sizes multiply to {ways}, not the {processes} processes launched"
    try:
        check_batch_divides(config.train.global_batch_size, axes, config.train.microbatches)
    except ConfigError as err:
        return f"{err} ({launched} launched)"
    return None


def shrunk_count(config: Config, processes: int, devices_per_process: int) -> int | None:
    """The largest count below ``processes`` that :func:`fit_problem` accepts, or None."""
    return next((n for n in range(processes - 1, 0, -1) if fit_problem(config, n, devices_per_process) is None), None)


def parse_spec(
    words: Sequence[str],
    processes: int,
    devices_per_process: int,
    max_restarts: int = 0,
    *,
    parse: Callable[[list[str]], argparse.Namespace],
) -> LaunchSpec:
    """Check a launch before anything starts; every refusal is one :class:`ConfigError`.

    ``parse`` reads the command after ``--`` as ``jzero`` itself would (the command line passes its
    own parser's ``parse_args``), so a bad flag is refused before any process starts.
    """
    if max_restarts < 0:
        raise ConfigError("--max-restarts", f"must be >= 0, got {max_restarts}")
    if processes < 1:
        raise ConfigError("-n", f"must be at least 1 process, got {processes}")
    if not 1 <= devices_per_process <= MAX_CPU_DEVICES:
        raise ConfigError("--devices-per-process", f"must be in [1, {MAX_CPU_DEVICES}], got {devices_per_process}")
    words = tuple(words[1:] if words and words[0] == "--" else words)
    if not words or words[0] not in LAUNCHABLE:
        got = repr(words[0]) if words else "nothing"
        raise ConfigError("launch", f"runs a jzero command after --: {' or '.join(LAUNCHABLE)}, got {got}")
    args = parse(list(words))  # a bad flag exits 2 with its one line
    if getattr(args, "target", None):
        raise ConfigError("--target", "compiles for GPUs from one process; run jzero plan --target without launch")
    config = load_config(args.config, [*args.set, f"runtime.cpu_devices={devices_per_process}"])
    if config.runtime.distributed != "auto":  # off, or a job of its own: the same for every process
        raise ConfigError("runtime.distributed", "must be auto under jzero launch, which gives each process its place")
    problem = fit_problem(config, processes, devices_per_process)
    if problem:
        key, _, detail = problem.partition(": ")
        raise ConfigError(key, detail)
    return LaunchSpec(words, processes, devices_per_process, config)


def process_env(coordinator: str, processes: int, index: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of process ``index`` of a job on this machine: the job's variables, which
    ``runtime.distributed: auto`` reads, on the CPU platform. A device count forced through
    ``XLA_FLAGS`` is dropped: each process takes ``runtime.cpu_devices``."""
    env = dict(os.environ if base is None else base)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join(flags)
    return env | {
        "JAX_PLATFORMS": "cpu",
        ENV_COORDINATOR: coordinator,
        ENV_NUM_PROCESSES: str(processes),
        ENV_PROCESS_ID: str(index),
        "PYTHONUNBUFFERED": "1",
    }


def free_port() -> int:
    """A localhost port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _die_with_launcher() -> None:
    """In each child, before exec: Linux kills it if the launcher itself dies."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _status(returncode: int) -> int:
    """A shell's exit status: 128 + N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _describe(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with status {returncode}"


def _say(text: str) -> None:
    print(f"jzero launch: {text}", file=sys.stderr, flush=True)


class Processes:
    """N processes of one command, their output prefixed, watched until all have exited."""

    def __init__(self, spec: LaunchSpec, processes: int):
        self.port = free_port()
        self.processes = processes
        self.children: list[subprocess.Popen] = []
        self.pumps: list[threading.Thread] = []
        for i in range(processes):
            env = process_env(f"localhost:{self.port}", processes, i)
            child = subprocess.Popen(
                spec.command(),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # a terminal's Ctrl-C reaches the launcher, which passes it on once
                preexec_fn=_die_with_launcher,
            )
            self.children.append(child)
            for stream, out in ((child.stdout, sys.stdout), (child.stderr, sys.stderr)):
                pump = threading.Thread(target=_pump, args=(stream, out, f"[{i}] ".encode()), daemon=True)
                pump.start()
                self.pumps.append(pump)

    def signal_all(self, signum: int) -> None:
        for child in self.children:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(signum)

    def wait(self, bound_s: float) -> list[int]:
        """Wait for every process. Once one has failed, the others have ``bound_s`` to end on their
        own (they notice the loss through JAX's heartbeats) before the launcher kills them."""
        failed_at: float | None = None
        reported: set[int] = set()
        while [c.poll() for c in self.children].count(None):
            for i, child in enumerate(self.children):
                if child.returncode not in (None, 0) and i not in reported:
                    reported.add(i)
                    _say(f"process {i} (pid {child.pid}) {_describe(child.returncode)}")
                    failed_at = failed_at or time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > bound_s:
                for i, child in enumerate(self.children):
                    if child.poll() is None:
                        _say(f"process {i} (pid {child.pid}) did not end within {bound_s:g}s of the failure; killing it")
                        child.kill()
                failed_at = math.inf
            time.sleep(0.1)
        for pump in self.pumps:
            pump.join()
        for i, child in enumerate(self.children):
            if child.returncode != 0 and i not in reported:
                _say(f"process {i} (pid {child.pid}) {_describe(child.returncode)}")
        return [c.returncode for c in self.children]


# What the runtime prints on every start, expected and not actionable: gloo's connection lines (from
# several threads at once, so cut and interleaved) and JAX's note that recoverable mode is on.
_GLOO_PIECES = re.compile(rb"\[Gloo\] Rank( \d+)?|is connected to( \d+)?|peer ranks\.?|Expected number of connected|is :|\d+")
_RECOVERABLE_NOTE = b"Using experimental recoverable task feature"


def runtime_noise(line: bytes) -> bool:
    """Whether ``line`` is only gloo's connection chatter or JAX's recoverable-mode note."""
    return _RECOVERABLE_NOTE in line or not _GLOO_PIECES.sub(b"", line).strip() and line.strip() != b""


def _pump(stream: BinaryIO, out: object, prefix: bytes) -> None:
    target = out.buffer  # type: ignore[attr-defined]
    for line in iter(stream.readline, b""):
        if runtime_noise(line):
            continue
        target.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
        target.flush()
    stream.close()


@contextlib.contextmanager
def _forwarding(job_of: list[Processes | None], interrupted: list[bool]) -> Iterator[None]:
    """SIGTERM and SIGINT to the launcher go to every process of the current job (which save and
    stop, as one process would); the launcher then restarts nothing."""

    def forward(signum: int, frame: FrameType | None) -> None:
        interrupted[0] = True
        _say(f"{signal.Signals(signum).name}: passing it on to every process")
        if job_of[0] is not None:
            job_of[0].signal_all(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def launch(spec: LaunchSpec, max_restarts: int = 0, shrink_on_failure: bool = False) -> int:
    """Run ``spec`` and, after a failure, restart it up to ``max_restarts`` times.

    Returns:
      The worst exit status of the last attempt's processes (128 + N for a signal N).
    """
    processes, restarts = spec.processes, 0
    run_dir = Path(spec.config.run.dir)
    bound = spec.config.runtime.heartbeat_timeout_s + GRACE_S
    current: list[Processes | None] = [None]
    interrupted = [False]
    with _forwarding(current, interrupted):
        while True:
            job = current[0] = Processes(spec, processes)
            pids = " ".join(str(c.pid) for c in job.children)
            _say(f"{processes} processes x {spec.devices_per_process} CPU devices, coordinator localhost:{job.port}; pids {pids}")
            codes = job.wait(bound)
            worst = max(_status(c) for c in codes)
            if worst == 0 or interrupted[0] or worst in (BAD_INPUT, DIVERGED, INTERRUPTED) or restarts >= max_restarts:
                return worst
            restarts += 1
            before = processes
            if shrink_on_failure:
                smaller = shrunk_count(spec.config, processes, spec.devices_per_process)
                if smaller is None:
                    _say(f"no count below {processes} processes fits the mesh and the batch; not restarting")
                    return worst
                processes = smaller
            _say(_restart_line(spec, run_dir, restarts, max_restarts, before, processes))


def _restart_line(spec: LaunchSpec, run_dir: Path, restart: int, of: int, before: int, after: int) -> str:
    k = spec.devices_per_process
    old, new = (mesh_text(resolve_axes(spec.config.mesh.axes, n * k)) for n in (before, after))
    layout = f"{after} processes x {k} devices, mesh {new}"
    if after != before:
        layout += f" (was {before} x {k}, mesh {old})"
    run = RunDir(run_dir)
    step, logged = run.newest_committed_step(), run.last_logged_step()
    if spec.words[0] != "train":
        return f"restart {restart} of {of}: {layout}"
    if step is None:
        return f"restart {restart} of {of}: {layout}; no committed checkpoint in {run_dir}, starting from step 0"
    redo = ""
    if logged is not None and logged > step:
        redo = f"; the failed attempt had logged step {logged}, so {logged - step} steps are computed again"
    return f"restart {restart} of {of}: {layout}; resuming from step {step}, the newest committed checkpoint{redo}"
