"""Mutation check: break jzero in small, obvious ways, one at a time, and run the tests that claim to
cover each; every mutant must fail at least one of them (issue 38's audit: these three passed every
test that covered them).

    python tests/mutations.py              # each mutation in turn; exit status 1 if a mutant survives
    python tests/mutations.py --list

Each mutation edits one source file in place and puts it back afterwards (also on Ctrl-C or an
error); the tests run as a subprocess on 8 simulated CPU devices, first unmutated (they must pass).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # the file, from the repository root
    old: str  # text that must occur exactly once
    new: str
    tests: tuple[str, ...]


MUTATIONS = (
    Mutation(
        "the prediction ignores every transfer",
        "jzero/training/prediction.py",
        "        transfers=tuple(transfers),\n",
        "        transfers=(),\n",
        ("tests/training/test_prediction.py",),
    ),
    Mutation(
        "tokens counted 8x too high",
        "jzero/training/loop.py",
        "        tokens = job.config.train.global_batch_size * job.config.model.seq_len\n",
        "        tokens = job.config.train.global_batch_size * job.config.model.seq_len * 8\n",
        ("tests/training/test_throughput.py",),
    ),
    Mutation(
        "stage 3's 1-D parameters left whole",
        "jzero/sharding/plan.py",
        "    entries = list(spec) + [None] * (len(shape) - len(spec))\n",
        "    entries = list(spec) + [None] * (len(shape) - len(spec))\n"
        "    if len(shape) == 1:\n        return P(*entries), None\n",
        ("tests/sharding/test_stages.py::test_live_bytes_match_paper_formula",),
    ),
)


def _tests_pass(tests: tuple[str, ...]) -> bool:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    argv = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env).returncode == 0


def run(mutation: Mutation) -> bool:
    """Whether the mutant is killed: its tests pass as the code is, and fail on the mutant."""
    path = ROOT / mutation.path
    original = path.read_text()
    if original.count(mutation.old) != 1:
        raise SystemExit(f"mutations.py: {mutation.path}: the text to mutate for {mutation.name!r} is not there once")
    if not _tests_pass(mutation.tests):
        raise SystemExit(f"mutations.py: {' '.join(mutation.tests)} fail on the code as it is")
    try:
        path.write_text(original.replace(mutation.old, mutation.new))
        return not _tests_pass(mutation.tests)
    finally:
        path.write_text(original)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args(argv)
    survived = []
    for m in MUTATIONS:
        if args.list:
            print(f"{m.name}: {m.path}; {' '.join(m.tests)}")
            continue
        killed = run(m)
        print(f"{'killed  ' if killed else 'SURVIVED'} {m.name} ({m.path}; {' '.join(m.tests)})", flush=True)
        survived += [] if killed else [m.name]
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
