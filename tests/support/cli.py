"""The command line as the tests drive it: in-process through ``main``, or as a process."""

import os
import subprocess
import sys

from jzero.cli.main import main
from support.configs import ROOT
from support.xla import suite_flags


def sets(*overrides: str) -> list[str]:
    return [arg for kv in overrides for arg in ("--set", kv)]


def one_line_error(capsys, argv: list[str], fragment: str) -> str:
    """Run ``jzero argv`` in-process: exit 2, exactly one stderr line, ``jzero: error:`` and ``fragment``."""
    code = main(argv)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1, err[-2000:]
    assert lines[0].startswith("jzero: error: ") and fragment in lines[0], lines[0]
    assert "Traceback" not in out + err
    return lines[0]


def keyed_error(capsys, argv: list[str], key: str) -> str:
    """:func:`one_line_error` whose line names ``key`` first: ``jzero: error: KEY: ...``."""
    line = one_line_error(capsys, argv, f"{key}: ")
    assert line.startswith(f"jzero: error: {key}: "), line
    return line


def one_line_failure(capsys, argv: list[str], line: str) -> None:
    """Run ``jzero argv`` in-process: exit 1 (the machine refused a write), ``line`` alone on stderr."""
    assert main(argv) == 1
    assert capsys.readouterr() == ("", line + "\n")


def jzero_env() -> dict[str, str]:
    """A ``jzero`` subprocess's environment: the CPU, the suite's 8 devices and its fast compile."""
    return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=suite_flags())


def jzero_cli(*args, cwd=ROOT, timeout=300):
    return subprocess.run([sys.executable, "-m", "jzero.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def stderr_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]
