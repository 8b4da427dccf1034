"""``jzero data prepare`` under faults beyond bad input: Ctrl-C and SIGKILL sent to a real process at
moments of its work, two prepares onto one ``--out``, a full, read-only or forbidden disk, an
``--out`` under a file and a NUL byte. Each is one line with its exit status, leaves what was
there byte for byte, and a rerun succeeds."""

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.cli import one_line_error
from support.disks import small_disk
from support.files import snapshot

from jzero.cli.main import main
from jzero.config.loading import ConfigError
from jzero.data.prepare import prepare
from jzero.data.tokens import HEADER_FILE, TOKENIZER_FILE

ROOT = Path(__file__).resolve().parents[2]
WORDS = ["alpha", "beta", "gamma", "delta", "def", "class", "return", "x", "y", "foo", "bar"]
# 15,000 short documents (2 MB): measured here, the temporary folder appears 0.5 s after start,
# tokenizing starts at 2.1 s and the prepare ends at 3.4 s; each moment leaves a second or more.
SLOW_DOCUMENTS = 15_000
MOMENTS = {"training": "the temporary folder exists", "tokenizing": "tokens.bin has bytes"}
FILES = sorted(["eval.bin", HEADER_FILE, TOKENIZER_FILE, "tokens.bin"])


def write_jsonl(path: Path, documents: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    texts = (" ".join(f"{rng.choice(WORDS)}{rng.randint(0, 99)}" for _ in range(20)) for _ in range(documents))
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    return str(path)


@pytest.fixture
def sources(tmp_path):
    """A slow corpus, a small one (its output is 172 KB) and a file of the user's, all in ``tmp_path``."""
    (tmp_path / "mine.txt").write_text("the user's own file")
    return write_jsonl(tmp_path / "slow.jsonl", SLOW_DOCUMENTS), write_jsonl(tmp_path / "small.jsonl", 400)


def command(source: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "jzero.cli", "data", "prepare", source, "--out", str(out), "--vocab-size", "300", "--quiet"]


def run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)


def start(source: str, out: Path) -> subprocess.Popen:
    return subprocess.Popen(command(source, out), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def partials(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f".{out.name}.partial-*")) if out.parent.is_dir() else []


def reached(out: Path, moment: str) -> bool:
    found = partials(out)
    if moment == "training" or not found:
        return bool(found)
    tokens = found[0] / "tokens.bin"
    return tokens.is_file() and tokens.stat().st_size > 0


def wait_until(proc: subprocess.Popen, ready, what: str) -> None:
    deadline = time.monotonic() + 60
    while not ready():
        assert proc.poll() is None, f"the prepare ended before {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no sign that {what}"
        time.sleep(0.01)


def listing(folder: Path) -> list[str]:
    """Every path under ``folder``, empty folders and hidden files too."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def assert_prepared(out: Path) -> None:
    assert sorted(p.name for p in out.iterdir()) == FILES
    assert json.loads((out / HEADER_FILE).read_text())["splits"]["train"]["tokens"] > 0


@pytest.mark.parametrize("moment", MOMENTS)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "sigkill"])
def test_a_signal_during_prepare_leaves_nothing_a_rerun_does_not_clean(tmp_path, sources, sig, moment):
    """Ctrl-C removes the temporary folder and the parent made for it at once; after SIGKILL the
    rerun removes it (its process is dead). The signal comes a random 0-0.3 s after the moment."""
    slow, small = sources
    out = tmp_path / "new" / "tok"
    before, kept = listing(tmp_path), snapshot(tmp_path)
    delay = random.uniform(0, 0.3)
    proc = start(slow, out)
    wait_until(proc, lambda: reached(out, moment), MOMENTS[moment])
    time.sleep(delay)
    assert proc.poll() is None, f"the prepare ended within {delay:.2f} s of the moment: {proc.communicate()}"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    if sig == signal.SIGINT:
        assert (proc.returncode, err) == (130, "jzero: interrupted\n"), f"delay {delay:.2f} s"
        assert listing(tmp_path) == before
    else:
        assert proc.returncode == -signal.SIGKILL and len(partials(out)) == 1
    done = run(command(small, out))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert_prepared(out)
    made = {"new", "new/tok", *(f"new/tok/{name}" for name in FILES)}
    assert listing(tmp_path) == sorted({*before, *made})  # no temporary folder left
    assert {k: v for k, v in snapshot(tmp_path).items() if not k.startswith("new/")} == kept


def test_two_prepares_onto_one_out_each_give_the_loser_one_line(tmp_path, sources):
    """A prepare started while another writes ``--out`` is refused at once. A folder that appears at
    ``--out`` while a prepare writes (another one won) is kept, and the prepare refused at its end."""
    slow, small = sources
    out = tmp_path / "tok"
    before, kept = listing(tmp_path), snapshot(tmp_path)
    first = start(slow, out)
    wait_until(first, lambda: reached(out, "training"), MOMENTS["training"])
    second = run(command(small, out))
    held = f"another jzero data prepare (pid {first.pid}) is writing {out}; wait for it to end, or choose another --out"
    assert (second.returncode, second.stderr) == (2, f"jzero: error: --out: {held}\n")
    assert first.poll() is None, "the first prepare ended too soon for this test"
    out.mkdir()
    (out / "theirs.txt").write_text("written by the winner")
    _, err = first.communicate(timeout=60)
    meanwhile = f"{out} was written meanwhile, by another process; not overwritten"
    assert (first.returncode, err) == (2, f"jzero: error: --out: {meanwhile}\n")
    assert listing(tmp_path) == sorted([*before, "tok", "tok/theirs.txt"])  # no temporary folder left
    assert snapshot(tmp_path) == {**kept, "tok/theirs.txt": b"written by the winner"}


@pytest.mark.parametrize("disk", ["full", "read-only"])
def test_a_full_or_read_only_disk_is_one_line_and_a_rerun_recovers(tmp_path, sources, capsys, disk):
    """A real 64 KiB tmpfs, which the small output (172 KB) does not fit, then grown to 1 MiB; or one
    of 1 MiB remounted read-only, then read-write. The user's file beside ``--out`` is kept."""
    _, small = sources
    with small_disk(tmp_path / "disk", "64k" if disk == "full" else "1m") as folder:
        (folder / "mine.txt").write_text("the user's own file")
        before = listing(folder), snapshot(folder)
        if disk == "read-only":
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        out = folder / "sub" / "tok"
        args = ["data", "prepare", small, "--out", str(out), "--vocab-size", "300", "--quiet"]
        assert main(args) == 1
        reason = "No space left on device" if disk == "full" else "Read-only file system"
        assert capsys.readouterr() == ("", f"jzero: --out: cannot write {out}: {reason}\n")
        assert (listing(folder), snapshot(folder)) == before
        subprocess.run(["mount", "-o", "remount,rw,size=1m", str(folder)], check=True)  # the cause is gone
        assert main(args) == 0
        assert_prepared(out)
        assert (folder / "mine.txt").read_text() == "the user's own file" and partials(out) == []


# Python -c: os.mkdir refuses, with EACCES, what it would create under FOLDER (root writes anywhere).
DENY_MKDIR = """
import errno, os, runpy, sys
folder, real = sys.argv.pop(1), os.mkdir
def mkdir(path, *args, **kwargs):
    if os.path.abspath(path).startswith(folder + os.sep):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
    return real(path, *args, **kwargs)
os.mkdir = mkdir
runpy.run_module("jzero.cli", run_name="__main__")
"""


def test_a_folder_it_may_not_write_in_is_one_line_and_exit_1(tmp_path, sources):
    _, small = sources
    out = tmp_path / "tok"
    before = listing(tmp_path), snapshot(tmp_path)
    done = run([sys.executable, "-c", DENY_MKDIR, str(tmp_path), *command(small, out)[3:]])
    assert (done.returncode, done.stdout, done.stderr) == (1, "", f"jzero: --out: cannot write {out}: Permission denied\n")
    assert (listing(tmp_path), snapshot(tmp_path)) == before


@pytest.mark.parametrize("under", ["file/tok", "file/sub/tok"])
def test_an_out_under_a_file_is_one_line_and_exit_2(tmp_path, capsys, under):
    (tmp_path / "a.txt").write_text("some text")
    (tmp_path / "file").write_text("a file, not a folder")
    before = listing(tmp_path), snapshot(tmp_path)
    out = tmp_path / under
    one_line_error(capsys, ["data", "prepare", str(tmp_path / "a.txt"), "--out", str(out), "--vocab-size", "300"],
                   f"--out: cannot write {out}: Not a directory")  # fmt: skip
    assert (listing(tmp_path), snapshot(tmp_path)) == before


@pytest.mark.parametrize("key", ["--out", "SOURCES", "--tokenizer"])
def test_a_nul_byte_in_a_path_is_one_line(tmp_path, key):
    (tmp_path / "a.txt").write_text("some text")
    paths = {"--out": tmp_path / "out", "SOURCES": str(tmp_path / "a.txt"), "--tokenizer": None}
    paths[key] = f"{tmp_path}/o\0ut"
    before = listing(tmp_path)
    options = {"vocab_size": None, "tokenizer": paths["--tokenizer"]} if key == "--tokenizer" else {"vocab_size": 300}
    with pytest.raises(ConfigError, match=f"^{key}: a path must not contain a NUL byte, got '.*o\\\\x00ut'$"):
        prepare([paths["SOURCES"]], paths["--out"], **options, progress=False)
    assert listing(tmp_path) == before
