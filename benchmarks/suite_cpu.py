"""Where the suite's CPU goes: a pytest plugin that logs each test's wall time, its process's CPU and
the CPU of the subprocesses it reaped (``resource.getrusage``), the seconds JAX's own duration events
gave in its process (tracing, lowering, XLA's compile), and a summary by file.

    PYTHONPATH=benchmarks SUITE_CPU_LOG=/tmp/cpu.jsonl python -m pytest -q -n 2 -p suite_cpu
    python benchmarks/suite_cpu.py /tmp/cpu.jsonl [/tmp/before.jsonl]     # by file, against a baseline

A subprocess's CPU counts once it has been waited for, so a test that leaves one running is
charged nothing for it. The log is appended to: start each run with a new file.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import resource
import sys
import time

import pytest

LOG = "SUITE_CPU_LOG"


def _cpu() -> tuple[float, float]:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


# JAX's duration events, by the name this log gives them
EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace", "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
          "/jax/core/compile/backend_compile_duration": "compile"}  # fmt: skip
_events: dict[str, float] = collections.defaultdict(float)


@functools.cache  # once per process
def _listen() -> None:
    """Sum JAX's duration events into ``_events``; registered at the first test, after the suite's
    conftest has set JAX's environment (importing JAX earlier would read it first)."""
    import jax.monitoring

    def listener(event: str, seconds: float, **_) -> None:
        if event in EVENTS:
            _events[EVENTS[event]] += seconds
            _events[EVENTS[event] + "s"] += 1

    jax.monitoring.register_event_duration_secs_listener(listener)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _listen()
    wall, (me, kids) = time.time(), _cpu()
    before = dict(_events)
    yield
    me_after, kids_after = _cpu()
    row = {"id": item.nodeid, "wall": time.time() - wall, "self": me_after - me, "kids": kids_after - kids,
           "worker": os.environ.get("PYTEST_XDIST_WORKER")}  # fmt: skip
    row.update({k: v - before.get(k, 0.0) for k, v in _events.items()})
    with open(os.environ[LOG], "a") as log:
        log.write(json.dumps(row) + "\n")


def _by_file(path: str) -> tuple[dict[str, list[float]], list[float]]:
    files: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    total = [0.0, 0.0, 0.0, 0]
    with open(path) as log:
        for line in log:
            row = json.loads(line)
            for sums in (files[row["id"].split("::")[0]], total):
                for k, value in enumerate((row["wall"], row["self"], row["kids"], 1)):
                    sums[k] += value
    return files, total


def main(path: str, baseline: str | None = None) -> None:
    files, total = _by_file(path)
    before = _by_file(baseline)[0] if baseline else {}
    print(f"{int(total[3])} tests: wall {total[0]:.0f} s, test processes {total[1]:.0f} CPU-s, subprocesses {total[2]:.0f} CPU-s")
    print("  wall   self   kids  tests  file" + ("  (wall before)" if baseline else ""))
    for name, (wall, me, kids, tests) in sorted(files.items(), key=lambda kv: -kv[1][0])[:30]:
        was = f"  ({before[name][0]:.1f})" if name in before else ""
        print(f"{wall:6.1f} {me:6.1f} {kids:6.1f} {int(tests):6d}  {name}{was}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
