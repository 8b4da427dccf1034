"""Commands as a user runs them: the installed ``jzero`` script, each command a fresh process in
bash, in a folder of the user's, with a clean environment (:func:`user_env`). What the docs show
(``tests/test_doc_outputs.py``, ``tests/commands/``) runs here; nothing in this module imports JAX.

A command line may end with filters the way a page quotes part of an output: ``2>&1 | grep
[-v] [-E] PATTERN``, ``| head -n N``, ``| tail -n N``, ``| sed -n 'A,Bp'``, and with ``# exit N``,
the status it must exit with. The command runs without them; :func:`shown` applies them.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINKED = ("configs", "examples", "benchmarks")  # what the commands read relative to the repository root

# What the suite sets for its own processes (tests/conftest.py, support/xla.py) and a user has not:
# the simulated device count and fast compile, the CPU platform, the suite's compilation cache.
SUITE_PREFIXES = ("XLA_", "JAX_", "JZERO_", "PYTEST_")
SUITE_NAMES = ("XDG_CACHE_HOME",)


def user_env(home: Path, cache: Path | None = None, xla_flags: str | None = None) -> dict[str, str]:
    """A user's environment: this one without what the suite sets, ``HOME`` at ``home`` (so ``~/``
    in a command is the user's), and the venv's ``bin`` first on ``PATH``, where ``pip install`` put
    the ``jzero`` script.

    Args:
      home: the user's home folder (made here).
      cache: ``XDG_CACHE_HOME``, where JAX's compilation cache is (``jzero/jax`` in it); else the
        home's ``~/.cache``.
      xla_flags: an ``XLA_FLAGS`` of the user's, never a device count: the suite's compile speed
        (``support.xla.compile_flags``) where what a command prints of its program is not compared.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(SUITE_PREFIXES) and k not in SUITE_NAMES}
    home.mkdir(parents=True, exist_ok=True)
    env["HOME"] = str(home)
    if cache is not None:
        env["XDG_CACHE_HOME"] = str(cache)
    if xla_flags is not None:
        assert "device_count" not in xla_flags, "jzero sizes a user's CPU devices itself"
        env["XLA_FLAGS"] = xla_flags
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


@dataclasses.dataclass
class Command:
    """A command line: its environment, its program and arguments, its filters and its `# exit N`."""

    env: dict[str, str]
    argv: list[str]
    filters: list[list[str]]
    status: int | None

    @classmethod
    def parse(cls, line: str) -> Command:
        lex = shlex.shlex(line, posix=True, punctuation_chars="|")
        lex.whitespace_split, lex.commenters = True, ""
        tokens = list(lex)
        status = None
        if "#" in tokens:
            comment = " ".join(tokens[tokens.index("#") + 1 :])
            tokens = tokens[: tokens.index("#")]
            if m := re.match(r"exit (\d+)", comment):
                status = int(m[1])
        env = {}
        while tokens and re.match(r"[A-Z_][A-Z0-9_]*=", tokens[0]):
            name, _, value = tokens.pop(0).partition("=")
            env[name] = value
        parts, current = [], []
        for t in tokens:
            if t == "|":
                parts.append(current)
                current = []
            else:
                current.append(t)
        parts.append(current)
        argv, filters = parts[0], parts[1:]
        if argv and argv[-1] == "2>&1":
            argv = argv[:-1]
        elif filters:
            raise ValueError(f"{line}: filters apply to stdout and stderr together, so write `2>&1 |`")
        return cls(env, argv, filters, status)

    @property
    def base(self) -> str:
        """The command without its filters: what is run once and cached."""
        env = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        return " ".join([*env, *map(shlex.quote, self.argv)])


def apply_filters(text: str, filters: list[list[str]]) -> str:
    """``head``, ``tail``, ``grep [-v] [-E]`` and ``sed -n 'A,Bp'``, as the shell's would."""
    lines = text.splitlines()
    for f in filters:
        name, args = f[0], f[1:]
        if name in ("head", "tail"):
            n = int(args[1]) if args[0] == "-n" else int(args[0].lstrip("-"))
            lines = lines[:n] if name == "head" else lines[-n:] if n else []
        elif name == "grep":
            flags = [a for a in args if a.startswith("-")]
            (pattern,) = [a for a in args if not a.startswith("-")]
            assert set(flags) <= {"-v", "-E"}, f"grep {flags}: only -v and -E"
            lines = [line for line in lines if bool(re.search(pattern, line)) != ("-v" in flags)]
        elif name == "sed" and args[0] == "-n" and (m := re.fullmatch(r"(\d+|/.+?/|\$)(?:,(\d+|/.+?/|\$))?p", args[1])):
            lines = _sed_range(lines, m[1], m[2] or m[1])
        else:
            raise ValueError(f"filter {' '.join(f)}: use head, tail, grep [-v] [-E] or sed -n 'A,Bp'")
    return "\n".join(lines)


def _sed_range(lines: list[str], a: str, b: str) -> list[str]:
    def at(address: str, start: int) -> int:
        if address == "$":
            return len(lines) - 1
        if address.startswith("/"):
            return next((i for i in range(start, len(lines)) if re.search(address[1:-1], lines[i])), len(lines))
        return int(address) - 1

    first = at(a, 0)
    return lines[first : at(b, first + (a != b)) + 1]


def normal(text: str) -> str:
    """Trailing spaces and blank lines dropped: what a page can hold."""
    return "\n".join(line.rstrip() for line in text.splitlines()).strip("\n")


def expected_status(line: str) -> int | None:
    """The status a line's ``# exit N`` says its command exits with, or None."""
    m = re.search(r"\s#\s+exit (\d+)\s*$", line)
    return int(m[1]) if m else None


def unfiltered(line: str) -> str:
    """``line`` without its filters and its comment: the command that runs."""
    return re.sub(r"\s+#\s.*$|\s*2>&1.*$", "", line)


def shown(line: str, printed: str) -> str:
    """What a page shows of ``printed``, the output of ``line``'s command: its filters applied."""
    return normal(apply_filters(printed, Command.parse(line).filters))


@dataclasses.dataclass
class Ran:
    """One command's run: its exit status, what it printed (stdout and stderr, as a terminal shows
    them, with the session's folder written back as the page has it) and its seconds."""

    status: int
    text: str
    seconds: float


class Session:
    """A user's folder that commands run in, one fresh bash process each, with ``env``
    (:func:`user_env`). ``/tmp/`` in their words is ``folder/tmp/``, and relative paths are from
    ``folder``, which links the repository's configs/, examples/ and benchmarks/.

    Args:
      folder: the user's working folder (made here).
      env: the commands' environment.
      actions: the steps that are no command, by name (:meth:`after`).
      cold_cache: each command with a JAX compilation cache of its own, as a user's first run.
    """

    def __init__(self, folder: Path, env: Mapping[str, str], actions: Mapping[str, Callable[[Session], None]] | None = None,
                 cold_cache: bool = False):  # fmt: skip
        self.folder, self.env, self.actions, self.cold_cache = folder, dict(env), dict(actions or {}), cold_cache
        (folder / "tmp").mkdir(parents=True, exist_ok=True)
        for name in LINKED:
            if (ROOT / name).exists() and not (folder / name).exists():
                (folder / name).symlink_to(ROOT / name)
        self.cache: dict[str, Ran] = {}
        self.done: set[str] = set()

    def words(self, text: str) -> str:
        return text.replace("/tmp/", f"{self.folder}/tmp/")

    def unwords(self, text: str) -> str:
        return text.replace(f"{self.folder}/tmp/", "/tmp/").replace(f"{self.folder}/", "")

    def after(self, action: str) -> None:
        """Do the step named ``action`` once (damaging a file, say)."""
        if action not in self.done:
            self.actions[action](self)
            self.done.add(action)

    def run(self, line: str, again: bool = False) -> Ran:
        """``line``'s command run without its filters (once: the same words again get the same run,
        unless ``again``). A ``# exit N`` it ends with must hold.

        Raises:
          AssertionError: the command exited otherwise than its ``# exit N`` says.
        """
        key = unfiltered(line)
        if key not in self.cache or again:
            start = time.perf_counter()
            status, text = self.bash(key)
            self.cache[key] = Ran(status, self.unwords(text), time.perf_counter() - start)
        ran, status = self.cache[key], expected_status(line)
        if status is not None and ran.status != status:
            raise AssertionError(f"{line}: exit status {ran.status}, not {status}:\n{ran.text}")
        return ran

    def bash(self, line: str) -> tuple[int, str]:
        """Run ``line`` (with ``/tmp/`` made the session's) in bash in the folder: its status and output."""
        env = dict(self.env)
        if self.cold_cache:
            (self.folder / "cache").mkdir(exist_ok=True)
            env["XDG_CACHE_HOME"] = tempfile.mkdtemp(dir=self.folder / "cache")
        command = ["bash", "-c", self.words(line)]
        done = subprocess.run(command, cwd=self.folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        return done.returncode, done.stdout.decode(errors="replace")  # a sample of an untrained model: any bytes
