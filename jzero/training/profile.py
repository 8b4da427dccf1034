"""``run.profile``: a ``jax.profiler`` trace of a window of train steps, one ``train`` step annotation
per step, into ``<run.dir>/profile/`` (TensorBoard's profile plugin reads its ``.xplane.pb``;
Perfetto opens its ``perfetto_trace.json.gz``); and what a GPU trace says of the collectives'
overlap with compute (:func:`collective_overlap`)."""

from __future__ import annotations

import contextlib
import gzip
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax

from jzero.config.schema import ProfileConfig
from jzero.training.hooks import writing

__all__ = ["STEP_NAME", "ProfileWindow", "collective_overlap"]

STEP_NAME = "train"  # the annotation's name; its ``step_num`` is the step's number (1-based)


class ProfileWindow:
    """Traces steps ``start + 1`` to ``start + steps``: the trace starts before the first of them and
    stops once the last one's outputs are ready. With no config, it does nothing.

    Args:
      config: ``run.profile``, or None.
      folder: where the trace goes (``<run.dir>/profile``).
      overhead: called with the seconds the trace's start and stop took (not the steps').
    """

    def __init__(self, config: ProfileConfig | None, folder: Path, overhead: Callable[[float], None] = lambda s: None):
        self.config, self.folder, self.overhead = config, folder, overhead
        self.active = False

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[list[Any]]:
        """Around the call that runs step ``step`` (1-based); put its outputs in the yielded list, so
        that the trace ends only once the last traced step has run."""
        outputs: list[Any] = []
        c = self.config
        if c is None or not c.start < step <= c.start + c.steps:
            yield outputs
            return
        if not self.active:
            t0 = time.perf_counter()
            with writing(self.folder):
                self.folder.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(self.folder), create_perfetto_trace=True)
            self.active = True
            self.overhead(time.perf_counter() - t0)
        with jax.profiler.StepTraceAnnotation(STEP_NAME, step_num=step):
            yield outputs
        if step == c.start + c.steps:
            self.close(outputs)

    def close(self, outputs: Any = None) -> None:
        """Stop a trace in progress (at its last step, or when the run stops early)."""
        if self.active:
            jax.block_until_ready(outputs)  # the last traced step, inside the trace
            t0 = time.perf_counter()
            jax.profiler.stop_trace()
            self.active = False
            self.overhead(time.perf_counter() - t0)


# A GPU's kernels in a trace: the process XProf names "/device:GPU:N", one thread per CUDA stream
# ("Stream #N(...)"). NCCL's kernels are named "nccl..." (torchtitan's profiler tells them apart the
# same way); copies and memsets are neither communication nor compute.
_GPU_PROCESS = "/device:GPU:"
_STREAM = "Stream"
_NOT_COMPUTE = ("memcpy", "memset")


def collective_overlap(trace: str | Path) -> dict[str, Any]:
    """How much of the collectives' time on each GPU ran under compute, from a ``jax.profiler``
    trace: the time NCCL kernels ran while a compute kernel ran on the same GPU, against the time
    they ran alone.

    Args:
      trace: a ``perfetto_trace.json.gz`` (or its uncompressed JSON) that ``jax.profiler`` wrote.

    Returns:
      ``devices``, per GPU process name: ``communication_s`` (the union of its NCCL kernels' time),
      ``hidden_s`` (of that, the time some compute kernel ran too), ``exposed_s`` (the rest) and
      ``hidden_share``; and the same four summed over the GPUs under ``total`` (None without NCCL
      kernels, as in a CPU trace or on one GPU).
    """
    devices = {d: _overlap(comm, compute) for d, (comm, compute) in sorted(_gpu_kernels(_events(trace)).items()) if comm}
    return {"devices": devices, "total": _summed(list(devices.values())) if devices else None}


def _events(trace: str | Path) -> list[dict]:
    path = Path(trace)
    with gzip.open(path, "rt") if path.suffix == ".gz" else path.open() as f:
        events = json.load(f)
    return events["traceEvents"] if isinstance(events, dict) else events


def _named(events: list[dict], kind: str) -> dict[Any, str]:
    """The names trace metadata gives processes (``process_name``: by pid) or threads (by pid, tid)."""
    key = (lambda e: e["pid"]) if kind == "process_name" else (lambda e: (e["pid"], e.get("tid")))
    return {key(e): e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == kind}


def _gpu_kernels(events: list[dict]) -> dict[str, tuple[list, list]]:
    """Each GPU's kernel spans on its streams (microseconds): (NCCL's, compute's)."""
    processes, threads = _named(events, "process_name"), _named(events, "thread_name")
    kernels: dict[str, tuple[list, list]] = {}
    for e in events:
        device = processes.get(e.get("pid"), "")
        on_a_stream = threads.get((e.get("pid"), e.get("tid")), "").startswith(_STREAM)
        if e.get("ph") != "X" or not device.startswith(_GPU_PROCESS) or not on_a_stream:
            continue
        name, span = e.get("name", "").lower(), (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
        comm, compute = kernels.setdefault(device, ([], []))
        if "nccl" in name:
            comm.append(span)
        elif not name.startswith(_NOT_COMPUTE):
            compute.append(span)
    return kernels


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _overlap(comm: list, compute: list) -> dict[str, float]:
    """Seconds of ``comm``'s union, and of that the part inside ``compute``'s union (spans in us)."""
    comm, compute = _union(comm), _union(compute)
    total = sum(b - a for a, b in comm)
    hidden, j = 0.0, 0
    for a, b in comm:
        while j < len(compute) and compute[j][1] <= a:
            j += 1
        k = j
        while k < len(compute) and compute[k][0] < b:
            hidden += min(b, compute[k][1]) - max(a, compute[k][0])
            k += 1
    return _figures(total * 1e-6, hidden * 1e-6)


def _figures(communication: float, hidden: float) -> dict[str, float]:
    share = hidden / communication if communication else 0.0
    return {"communication_s": communication, "hidden_s": hidden, "exposed_s": communication - hidden, "hidden_share": share}


def _summed(rows: list[dict[str, float]]) -> dict[str, float]:
    return _figures(sum(r["communication_s"] for r in rows), sum(r["hidden_s"] for r in rows))
