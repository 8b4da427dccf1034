"""Every command output quoted in README.md and docs/*.md is a marked block that a test reruns, or
checks against a stored run of its command: a quote that no longer matches what jzero prints fails.

A marker is an HTML comment (GitHub does not render it) on the line right before a ```text block:

    <!-- output: jzero plan configs/gpt-tiny.yaml -->     the block is what this command prints
    <!-- transcript -->                                   the block's `$ ` lines are commands (a `\\` at
                                                         the end continues one), each followed by what it prints

What a command prints is its stdout and stderr as a terminal shows them. A command may end with
filters, which apply to both streams, so it says so: `2>&1 | grep PATTERN` (also `grep -v`),
`| head -n N`, `| tail -n N`, `| sed -n 'A,Bp'` (A and B: line numbers, `/regex/` or `$`). A `$`
line may end with `# exit N`: the command must exit with status N. Between `output`/`transcript`
and the colon or the end:

    (stored)          checked against the stored run in benchmarks/results/doc_outputs.json (what
                      each command printed, unfiltered, its seconds and the commit), not rerun: for
                      commands too slow for the suite (GPU-target compiles, long runs, other device
                      counts). `--stored` below reruns them, as subprocesses of the real `jzero`,
                      each with a cold compilation cache, as a user's first run.
    (recorded: WHY)   neither rerun nor stored, for what no script repeats (a kill from another
                      shell in mid-run); WHY says so.
    , after: ACTION   the step named in ACTIONS below is done first (damaging a file, say): a step
                      that is no command of jzero's.

The rule (CONTRIBUTING.md, "Quoted output"): every fenced block names its language; a ```text
block is output and carries a marker; there are no indented code blocks. Live blocks run as a user
runs them (tests/support/commands.py: the installed `jzero`, a fresh process each, with none of the
suite's device count, platform or cache, and a home of their own), in one session, in the order of
PAGES: a command runs once and every block that quotes the same words shows that run (so
docs/ledger.md, docs/checkpoints.md and docs/training.md quote one run). Paths under /tmp/ are a
temporary folder's, and relative paths (`configs/`, `runs/`) are from a folder that links the
repository's configs/, examples/ and benchmarks/.

Regenerate (from the repository root, in the venv):

    python tests/test_doc_outputs.py                      # check every block, print the differences
    python tests/test_doc_outputs.py --write [PAGE ...]   # rewrite the blocks that differ (live ones
                                                          # rerun, stored ones from their stored run)
    python tests/test_doc_outputs.py --stored --no-live [PAGE ...]   # rerun and store the stored ones (minutes)

A block that matches up to the masks is left as it is, so rewriting does not churn timings.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from support.commands import Command, Session, apply_filters, normal, shown, unfiltered, user_env

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
STORED = ROOT / "benchmarks" / "results" / "doc_outputs.json"

FENCE = re.compile(r"^( *)```(.*)$")
MARKER = re.compile(
    r"<!-- (?P<kind>output|transcript)(?: \((?P<mode>stored|recorded: [^)]+)\))?(?:, after: (?P<after>[^:]+?))?"
    r"(?:: (?P<command>.+?))? -->",
    re.S,
)


# ---------------------------------------------------------------------------------------------
# What may differ between two runs of one command, or between machines. Everything else (bytes,
# counts, specs, ratios, messages, paths) must match to the character: sizes in bytes and the
# compiled program's figures are deterministic, and the CPU backend compiles the same program at
# the suite's XLA optimisation level as at the default one (checked with --subprocess).


@dataclasses.dataclass(frozen=True)
class Mask:
    """``pattern``'s groups vary; ``close``: they must agree within this relative tolerance (as
    numbers) rather than not at all; ``line_starts``: only on lines that start so."""

    pattern: str
    why: str
    close: float | None = None
    line_starts: str = ""


MASKS = [
    # Whether JAX's persistent compilation cache already holds a program depends on what ran before.
    Mask(r"compiled in (\d+(?:\.\d+)? s(?:, read from JAX's compilation cache in \S+)?)", "a compile's wall time, and the cache"),
    Mask(r"(\d+(?:\.\d+)?)", "goodput: shares of the wall time", line_starts="goodput "),
    Mask(r"\.unreadable-(\d+)", "the time at which a damaged step was set aside"),
    Mask(r"/d/([0-9a-f]{32})", "OCDBT names its data files at random"),
    Mask(r"checksum ([0-9a-f]{16}), ([0-9a-f]{16})", "a data file's bytes: OCDBT's file names inside it are random"),
    # OCDBT packs a step's arrays into data files as its writes finish: the same state takes a few
    # percent more or less on disk from one save to the next (the tensors' own bytes do not vary).
    Mask(r"ok, (\d+(?:\.\d+)? [KMGT]?i?B) verified", "a checkpoint step's bytes on disk"),
    # The spaces before it too: the table right-aligns the size, so 10.01 MiB takes one more column than 9.43 MiB.
    Mask(r"^ +\d+  (?:yes|no) .*?(\s+\d+(?:\.\d+)? [KMGT]?i?B)$", "a checkpoint step's bytes on disk"),
    # The loss sums floats in an order that depends on the CPU and XLA's options. Floor, measured: 20
    # steps of configs/gpt-tiny.yaml at the suite's --xla_backend_optimization_level=0 against the
    # default differed by at most 1.1e-6 relative (3.0804992 and 3.0804958 at step 20); printing 4
    # decimals adds up to 1e-4 between two quotes of a loss near 1. 2e-3 is 20x the latter.
    Mask(r"\bloss (\d+\.\d+)(?: -> (\d+\.\d+))?", "the loss: float sums in a CPU's order", close=2e-3),
]


def masked(text: str) -> tuple[str, list[float]]:
    """``text`` with every varying group replaced by ``…``, and the values of the ``close`` ones."""
    lines, close = [], []
    for line in text.splitlines():
        for mask in MASKS:
            if not line.startswith(mask.line_starts):
                continue
            out, last = [], 0
            for match in re.finditer(mask.pattern, line):
                for g in range(1, (match.re.groups or 0) + 1):
                    if match.group(g) is None or match.start(g) < last:
                        continue
                    out.append(line[last : match.start(g)] + "…")
                    last = match.end(g)
                    if mask.close is not None:
                        close.append(float(match.group(g)))
            line = "".join(out) + line[last:]
        lines.append(line)
    return "\n".join(lines), close


def differences(want: str, got: str) -> str:
    """'' when ``got`` matches ``want`` after masking, else a diff of the two."""
    (a, a_close), (b, b_close) = masked(want), masked(got)
    tol = max((m.close for m in MASKS if m.close), default=0.0)
    if a == b and all(abs(x - y) <= tol * max(abs(x), abs(y), 1.0) for x, y in zip(a_close, b_close, strict=True)):
        return ""
    diff = difflib.unified_diff(want.splitlines(), got.splitlines(), "in the page", "printed now", lineterm="", n=1)
    return "\n".join(diff) if a != b else f"numbers outside {tol:g} (relative): {a_close} in the page, {b_close} now"


# ---------------------------------------------------------------------------------------------
# The pages' blocks


@dataclasses.dataclass
class Block:
    page: str  # relative to the repository root
    line: int  # the first line of its text, 1-based
    end: int  # the line of its closing fence, 1-based
    kind: str  # output | transcript
    mode: str  # live | stored | recorded: ...
    after: str | None
    command: str | None  # an output block's
    text: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def steps(self) -> list[tuple[str, str, str]]:
        """(the command's lines as written, the command, what the page says it printed)."""
        if self.kind == "output":
            return [("", self.command, self.text)]
        steps: list[tuple[str, str, list[str]]] = []
        lines = self.text.splitlines()
        i = 0
        while i < len(lines):
            if not lines[i].startswith("$ "):
                if not steps:
                    raise ValueError(f"{self.where}: a transcript starts with a `$ ` line")
                steps[-1][2].append(lines[i])
                i += 1
                continue
            written = [lines[i]]
            while written[-1].endswith("\\") and i + 1 < len(lines):
                i += 1
                written.append(lines[i])
            command = " ".join(part.rstrip("\\").strip() for part in written)[2:]
            steps.append(("\n".join(written), command, []))
            i += 1
        return [(w, c, "\n".join(o)) for w, c, o in steps]

    def render(self, outputs: list[str]) -> str:
        """The block's text with these outputs."""
        if self.kind == "output":
            return normal(outputs[0])
        return "\n".join(f"{w}\n{o}".rstrip("\n") if o else w for (w, _, _), o in zip(self.steps(), outputs, strict=True))


def blocks(page: Path) -> tuple[list[Block], list[str]]:
    """The page's marked blocks, and what breaks the rule: an unlabelled fence, an unmarked ```text
    block, a marker that is not right before a ```text block, an indented code block."""
    rel = str(page.relative_to(ROOT))
    lines = page.read_text().splitlines()
    found, broken = [], []
    i, last_text = 0, ""  # last_text: the last non-blank line outside fences
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            if (
                re.match(r" {4,}\S", lines[i])
                and i > 0
                and not lines[i - 1].strip()
                and not re.match(r" *([-*+] |\d+\. |\|)| {2,}\S", last_text)
            ):
                broken.append(f"{rel}:{i + 1}: an indented code block; fence it and name its language")
            if lines[i].strip():
                last_text = lines[i]
            i += 1
            continue
        indent, info = fence.groups()
        close = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if close is None:
            broken.append(f"{rel}:{i + 1}: an unclosed fence")
            break
        text = "\n".join(line[len(indent) :] for line in lines[i + 1 : close])
        marker = _marker_before(lines, i)
        if not info.strip():
            broken.append(f"{rel}:{i + 1}: a fence with no language: ```text for output, else ```bash, ```python, ...")
        elif info.strip() == "text" and marker is None:
            broken.append(f"{rel}:{i + 1}: a ```text block (output) with no <!-- output: ... --> or <!-- transcript --> marker")
        elif marker is not None and info.strip() != "text":
            broken.append(f"{rel}:{i + 1}: a marker before a ```{info.strip()} block; quoted output is ```text")
        elif marker is not None:
            m = MARKER.fullmatch(marker)
            if not m or (m["kind"] == "output") != bool(m["command"]):
                broken.append(f"{rel}:{i + 1}: a marker that does not parse: {marker}")
            else:
                command = m["command"].strip() if m["command"] else None
                found.append(Block(rel, i + 2, close + 1, m["kind"], m["mode"] or "live", m["after"], command, text))
        i = close + 1
    return found, broken


def _marker_before(lines: list[str], i: int) -> str | None:
    """The HTML comment that ends on the line before line ``i``, if it is a marker."""
    if i == 0 or not lines[i - 1].rstrip().endswith("-->"):
        return None
    start = i - 1
    while start > 0 and not lines[start].lstrip().startswith("<!--"):
        start -= 1
    comment = " ".join(line.strip() for line in lines[start:i])
    return comment if re.match(r"<!-- (output|transcript)\b", comment) else None


def all_blocks(pages: list[Path] = PAGES) -> list[Block]:
    return [b for page in pages for b in blocks(page)[0]]


# ---------------------------------------------------------------------------------------------
# Running the commands


def _flip_one_bit(session: Session, step: str) -> None:
    """One bit flipped in the middle of the largest data file of ``step``'s state."""
    state = session.folder / "tmp" / "demo" / "checkpoints" / step / "state"
    files = sorted(state.rglob("d/*"), key=lambda p: p.stat().st_size)
    data = bytearray(files[-1].read_bytes())
    data[len(data) // 2] ^= 0x10
    files[-1].write_bytes(bytes(data))


def _bad_jsonl(session: Session) -> None:
    (session.folder / "empty.jsonl").write_text("")
    (session.folder / "docs.jsonl").write_text('{"text": "one document"}\n{"body": "no text"}\n')


def _bpe_data(session: Session) -> None:
    """docs/data.md's first command: BPE on the standard library's sources."""
    stdlib = "STDLIB=$(python -c 'import sysconfig; print(sysconfig.get_paths()[\"stdlib\"])')"
    sources = "$(find \"$STDLIB\" -name '*.py' -not -path '*/site-packages/*' | sort)"
    status, text = session.bash(f"{stdlib}; jzero data prepare {sources} --out data/stdlib-bpe --vocab-size 4096")
    assert status == 0, text


def _bpe_run(session: Session) -> None:
    """docs/data.md's two commands: BPE on the standard library's sources, then 300 steps on it."""
    session.after("the BPE data prepared")
    session.run("jzero train configs/gpt-tiny-bpe.yaml")


# The steps that are no command, by the name a marker gives them after `after: `.
ACTIONS: dict[str, Callable[[Session], None]] = {
    "one bit flipped in step 3": lambda s: _flip_one_bit(s, "3"),
    "an empty empty.jsonl, and docs.jsonl whose line 2 has no text": _bad_jsonl,
    "the default run trained": lambda s: s.run("jzero train configs/gpt-tiny.yaml") and None,
    "the BPE data prepared": _bpe_data,
    "the BPE run trained": _bpe_run,
}


def compare(block: Block, outputs: list[str]) -> tuple[str, str]:
    """The differences between ``block`` and what it should show, ``outputs`` (filtered: see
    :func:`shown`), and the block's text with them."""
    text = block.render(outputs)
    return differences(normal(block.text), text), text


def check(block: Block, session: Session) -> tuple[str, str, list[str], list[float]]:
    """Rerun ``block``'s commands: the differences, the block's text now (:func:`compare`), and
    what each command printed and its seconds."""
    if block.after:
        session.after(block.after)
    printed, seconds, ran = [], [], set()
    for _, command, _ in block.steps():  # a command a transcript repeats runs again: what it changed matters
        done = session.run(command, again=unfiltered(command) in ran)
        ran.add(unfiltered(command))
        printed.append(done.text)
        seconds.append(done.seconds)
    return *compare(block, [shown(c, p) for (_, c, _), p in zip(block.steps(), printed, strict=True)]), printed, seconds


def stored_runs() -> dict[str, list[dict]]:
    return json.loads(STORED.read_text()) if STORED.exists() else {}


def stored_entry(block: Block, stored: dict[str, list[dict]]) -> dict | None:
    """``block``'s stored run: the one of its page that ran the block's commands, each as written
    or without its filters (``printed`` is what the line in ``commands`` printed)."""
    lines = [c for _, c, _ in block.steps()]

    def ran(e: dict) -> bool:
        pairs = zip(e["commands"], lines, strict=False)
        return len(e["commands"]) == len(lines) and all(r in (c, unfiltered(c)) for r, c in pairs)

    return next((e for e in stored.get(block.page, []) if ran(e)), None)


def stored_shown(block: Block, entry: dict) -> list[str]:
    """What ``block`` shows of its stored run: the filters applied where the run left them out."""
    runs = zip(block.steps(), entry["commands"], entry["printed"], strict=True)
    return [normal(p) if r == c else shown(c, p) for (_, c, _), r, p in runs]


# ---------------------------------------------------------------------------------------------
# The tests


def test_every_output_block_is_marked():
    broken = [b for page in PAGES for b in blocks(page)[1]]
    assert broken == [], "\n".join(broken)
    for b in all_blocks():
        if b.after:
            assert b.after in ACTIONS, f"{b.where}: no action named {b.after!r} in ACTIONS"
        for _, command, _ in b.steps():
            Command.parse(command)  # filters written as the rule says


def test_the_rule_finds_what_it_should(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n<!-- output: jzero estimate --params 1B\n  --devices 8 -->\n```text\nout\n```\n\n"
        "```text\nunmarked\n```\n\n```\nno language\n```\n\n<!-- output: jzero plan x -->\n```bash\njzero\n```\n\n"
        "Prints:\n\n    $ jzero plan x\n\n- a list\n\n    its indented paragraph\n\n<!-- transcript (stored), after: x -->\n"
        "```text\n$ jzero a \\\n    --b c\none\n$ jzero d\n```\n"
    )
    found, broken = blocks(page)
    assert [(b.line, b.kind, b.mode, b.after, b.command) for b in found] == [
        (6, "output", "live", None, "jzero estimate --params 1B --devices 8"),
        (32, "transcript", "stored", "x", None),
    ]
    assert [b.split(": ")[1].split(" ")[1] for b in broken] == ["```text", "fence", "marker", "indented"]
    assert found[1].steps() == [("$ jzero a \\\n    --b c", "jzero a --b c", "one"), ("$ jzero d", "jzero d", "")]
    assert found[1].render(["two", "three"]) == "$ jzero a \\\n    --b c\ntwo\n$ jzero d\nthree"


def test_commands_and_filters():
    c = Command.parse("X=1 jzero plan 'a b' 2>&1 | grep -v '^blocks/' | head -n 2  # exit 0")
    assert (c.env, c.argv, c.filters, c.status, c.base) == (
        {"X": "1"}, ["jzero", "plan", "a b"], [["grep", "-v", "^blocks/"], ["head", "-n", "2"]], 0, "X=1 jzero plan 'a b'"
    )  # fmt: skip
    with pytest.raises(ValueError, match="2>&1"):
        Command.parse("jzero plan | head -n 1")
    text = "a\nblocks/x\nb\nc\nd"
    assert apply_filters(text, [["grep", "-v", "^blocks/"], ["tail", "-n", "2"]]) == "c\nd"
    assert apply_filters(text, [["sed", "-n", "/^b$/,/d/p"]]) == "b\nc\nd"
    assert apply_filters(text, [["sed", "-n", "2,3p"]]) == "blocks/x\nb"
    assert apply_filters(text, [["head", "-1"]]) == "a"


def test_masks_hide_only_what_varies():
    run = "trained steps 0 -> 4: loss 4.9541 -> 3.0805\ngoodput 0.73 of 79.5 s: steps 73.0%, eval 4.9%"
    other = "trained steps 0 -> 4: loss 4.9540 -> 3.0806\ngoodput 0.41 of 99.1 s: steps 41.0%, eval 9.9%"
    assert differences(run, other) == ""
    assert differences(run, other.replace("eval", "evals")) != ""  # the words are checked
    assert differences(run, other.replace("3.0806", "3.1805")) != ""  # a loss beyond the tolerance
    assert differences(run, other.replace("0 -> 4", "0 -> 5")) != ""  # steps are exact
    assert differences("compiled in 12.7 s", "compiled in 1.7 s, read from JAX's compilation cache in /tmp/c") == ""
    assert differences("temporaries 11.24 MiB, ratio 1.32", "temporaries 11.25 MiB, ratio 1.32") != ""  # bytes: exact
    assert differences("4 of 4 async overlap compute", "3 of 4 async overlap compute") != ""
    row = "       2  yes        yes              3        8          1  data=8 x model=1                {}"
    assert differences(row.format("9.52 MiB"), row.format("9.19 MiB")) == ""  # a step's bytes on disk
    assert differences(row.format(" 9.43 MiB"), row.format("10.01 MiB")) == ""  # ... one column wider
    assert differences(row.format("9.52 MiB"), row.format("9.19 MiB").replace("model=1", "model=2")) != ""
    assert differences(row.format("9.52 MiB"), row.format("9.19 MiB").replace("yes", "no", 1)) != ""


def test_quoted_outputs_match_a_rerun(tmp_path, user_cache):
    """Every live block, rerun as a user runs it (:class:`support.commands.Session`: the installed
    ``jzero``, a fresh process each, no device count or platform of the suite's, a home of its own),
    in one session (each command once); all differences in one report."""
    failures = check_live(tmp_path, user_cache)
    rerun = "quoted output differs; `python tests/test_doc_outputs.py --write` rewrites it"
    assert not failures, rerun + ":\n\n" + "\n\n".join(failures)[-20000:]


def check_live(folder: Path, cache: Path | None = None) -> list[str]:
    """:func:`test_quoted_outputs_match_a_rerun`'s run: each live block's differences."""
    session = Session(folder / "user", user_env(folder / "home", cache), ACTIONS)
    failures = []
    for block in all_blocks():
        if block.mode == "live":
            diff = check(block, session)[0]
            if diff:
                failures.append(f"{block.where}:\n{diff}")
    return failures


def test_stored_outputs_match_their_blocks():
    """Every stored block is its stored run, and every stored run is some block's."""
    stored, failures, used = stored_runs(), [], set()
    for block in all_blocks():
        if block.mode != "stored":
            continue
        entry = stored_entry(block, stored)
        if entry is None:
            rerun = f"`python tests/test_doc_outputs.py --stored --no-live {block.page}` (minutes), then `--write`"
            failures.append(f"{block.where}: no stored run; {rerun}")
            continue
        used.add(id(entry))
        diff = compare(block, stored_shown(block, entry))[0]
        if diff:
            failures.append(f"{block.where}:\n{diff}")
    unused = [(p, e["commands"]) for p, entries in stored.items() for e in entries if id(e) not in used]
    assert not failures and not unused, "\n\n".join(failures) + "".join(f"\nstored run of no block: {u}" for u in unused)


# ---------------------------------------------------------------------------------------------
# Regenerating


def _rewrite(block: Block, text: str) -> None:
    page = ROOT / block.page
    lines = page.read_text().splitlines(keepends=True)
    indent = re.match(r" *", lines[block.line - 2])[0]
    new = [f"{indent}{line}\n" if line else "\n" for line in text.splitlines()]
    lines[block.line - 1 : block.end - 1] = new
    page.write_text("".join(lines))


def _commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    status = ["git", "status", "--porcelain", "--untracked-files=no", "jzero"]
    dirty = subprocess.run(status, cwd=ROOT, capture_output=True, text=True)
    return head + (" with uncommitted changes to jzero/" if dirty.stdout.strip() else "")


def regenerate(
    pages: list[Path],
    write: bool,
    stored: bool,
    live_too: bool,
    only: dict[Path, set[int]] | None = None,
    force: bool = False,
) -> int:
    """Check the pages' blocks: the live ones rerun (unless not ``live_too``), the stored ones
    against benchmarks/results/doc_outputs.json, rerunning them first with ``stored`` (each run
    saved at once). ``write`` rewrites the blocks that differ (with ``force``, also those that
    differ only where masked); ``only`` picks blocks of a page by their first line. Returns how
    many differ."""
    only = only or {}
    differ = 0
    runs = stored_runs()
    with tempfile.TemporaryDirectory() as live_dir:
        env = user_env(Path(live_dir) / "home")
        live = Session(Path(live_dir) / "live", env, ACTIONS)
        stored_sessions: dict[str, Session] = {}
        for page in pages:
            rewrites = []
            for block in blocks(page)[0]:
                if only.get(page) and block.line not in only[page]:
                    continue
                commands = [c for _, c, _ in block.steps()]
                if block.mode == "live" and live_too:
                    diff, text, _, seconds = check(block, live)
                elif block.mode == "stored":
                    if stored:
                        if block.page not in stored_sessions:
                            folder = Path(live_dir) / "stored" / page.stem
                            stored_sessions[block.page] = Session(folder, env, ACTIONS, cold_cache=True)
                        _, _, printed, seconds = check(block, stored_sessions[block.page])
                        entries = [e for e in runs.get(block.page, []) if e is not stored_entry(block, runs)]
                        ran = [unfiltered(c) for c in commands]  # what ran; the block's filters apply to its output
                        entry = {"commands": ran, "printed": printed, "seconds": [round(x, 1) for x in seconds]}
                        runs[block.page] = [*entries, {**entry, "commit": _commit()}]
                        STORED.write_text(json.dumps(runs, indent=1, ensure_ascii=False) + "\n")
                    entry = stored_entry(block, runs)
                    if entry is None:
                        print(f"{block.where}: no stored run; rerun it with --stored", flush=True)
                        differ += 1
                        continue
                    seconds = entry["seconds"]
                    diff, text = compare(block, stored_shown(block, entry))
                else:
                    continue
                print(f"{block.where}: {'differs' if diff else 'ok'} ({sum(seconds):.1f} s)", flush=True)
                if diff:
                    differ += 1
                    print(diff)
                if diff or (force and normal(block.text) != text):
                    rewrites.append((block, text))
            if stored:
                kept = {id(e) for b in blocks(page)[0] if b.mode == "stored" and (e := stored_entry(b, runs))}
                relative = str(page.relative_to(ROOT))
                if relative in runs and len(kept) < len(runs[relative]):  # stored runs of no block
                    runs[relative] = [e for e in runs[relative] if id(e) in kept]
                    STORED.write_text(json.dumps(runs, indent=1, ensure_ascii=False) + "\n")
            if write:
                for block, text in sorted(rewrites, key=lambda r: -r[0].line):
                    _rewrite(block, text)
    return differ


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", help="README.md or docs/*.md (default: all), or PAGE:LINE for one block")
    parser.add_argument("--write", action="store_true", help="rewrite the blocks that differ")
    parser.add_argument("--stored", action="store_true", help="rerun the stored blocks, as subprocesses, and store their runs")
    parser.add_argument("--no-live", action="store_true", help="leave the live blocks out")
    parser.add_argument("--force", action="store_true", help="with --write, also rewrite what differs only where masked")
    parser.add_argument("--stored-file", type=Path, default=STORED, help="where the stored runs are (default: %(default)s)")
    args = parser.parse_args()
    STORED = args.stored_file
    chosen: dict[Path, set[int]] = {}
    for name in args.pages:
        page, _, line = name.partition(":")
        chosen.setdefault(Path(page).resolve(), set()).update([int(line)] if line else [])
    pages = list(chosen) or PAGES
    differ = regenerate(pages, args.write, args.stored, not args.no_live, chosen, args.force)
    sys.exit(1 if differ and not args.write else 0)
