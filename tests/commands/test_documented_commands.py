"""Every ``jzero`` command that README.md and the user pages show, run the way a user runs it: the
installed ``jzero`` script, a fresh process each, in a clean environment (no device count or
platform of the suite's, a home folder of its own: :mod:`support.commands`), in the order a page
gives, each after the ones it needs.

Each command a page shows is one of three things, and :func:`test_every_command_the_pages_show_runs_as_a_user`
checks that no command is left out or stale:

- a quoted output's (a live block): ``tests/test_doc_outputs.py`` reruns it as a user and compares
  what it prints with the page;
- a step of a scenario here (:data:`LLAMA`, :data:`LORA`, :data:`GPT`, :data:`TOKENS`), run as
  written, a training run only ever shortened by ``--set train.steps=N`` appended;
- :data:`ELSEWHERE`, which says where it runs instead and why not here.

The pages' ``~/models/Llama-3.1-8B`` is a tiny Llama that ``transformers`` writes into the user's
home, with its own ``tokenizer.json``: the commands run with ``~`` as the shell expands it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import sysconfig
from pathlib import Path

from support.commands import ROOT, Session, expected_status, user_env
from support.hf_families import write_hf
from support.hf_llama import write_hf_llama, write_tokenizer
from support.xla import compile_flags
from test_doc_outputs import all_blocks

PAGES = ("README.md", "docs/llama.md", "docs/lora.md", "docs/sampling.md", "docs/checkpoints.md", "docs/data.md",
         "docs/own-loop.md", "docs/families.md")  # fmt: skip
SHORT = " --set train.steps=2"  # a training run's only change: two steps, not hundreds
ANY = r"(?s)."  # a sample of a model trained two steps: any text, but some


@dataclasses.dataclass(frozen=True)
class Step:
    """A command as a page shows it, what is appended to it here (a shorter run), and a pattern its
    output must match (besides exit status 0, or its ``# exit N``, and no traceback)."""

    shown: str
    appended: str = ""
    prints: str = ""

    @property
    def line(self) -> str:
        """The command that runs: ``appended`` goes before the filters a page quotes it through."""
        command, filters = re.match(r"(.*?)((?: 2>&1 \|.*)?)$", self.shown).groups()
        return command + self.appended + filters


# docs/llama.md: import, fine-tune on the model's own tokens, start a config of yours from the
# weights, export; and the import's own `next:` line, which names the run folder as init_from.
LLAMA = [
    Step("jzero checkpoint import ~/models/Llama-3.1-8B --out runs/llama-8b --set zero.stage=3 --set mesh.axes.data=8",
         prints=r"imported .*Llama-3\.1-8B: 102,720 parameters at stage 3 on data=8 x model=1, its tokenizer"),
    Step("jzero data prepare 'corpus/*.jsonl' --tokenizer ~/models/Llama-3.1-8B --out data/llama-tokens",
         prints=r"vocabulary 320, uint16"),
    Step("jzero train runs/llama-8b/config.yaml --set train.steps=1000 --set data.tokens=data/llama-tokens", SHORT,
         prints=r"trained steps 0 -> 2: .*; saved step 2; run dir runs/llama-8b"),
    Step("jzero train my-llama.yaml --set train.init_from=~/models/Llama-3.1-8B", SHORT,
         prints=r"trained steps 0 -> 2: .*; run dir runs/my-llama"),
    Step("jzero checkpoint export runs/llama-8b --format hf --out exported/llama-8b --dtype bfloat16",
         prints=r"exported step 2 as Hugging Face Llama: 21 tensors, .* as bfloat16 in 1 safetensors file to exported/llama-8b"),
]  # fmt: skip

# docs/lora.md: import, train adapters from the Hugging Face folder, export them merged and apart.
LORA = [
    Step("jzero checkpoint import ~/models/Llama-3.1-8B --out runs/llama-8b", prints=r"at stage 0 on data=8 x model=1"),
    Step("jzero train runs/llama-8b/config.yaml --set run.dir=runs/llama-8b-lora --set train.init_from=~/models/Llama-3.1-8B "
         "--set lora.rank=16 --set \"lora.targets=['q_proj','k_proj','v_proj','o_proj']\"", SHORT,
         prints=r"trained steps 0 -> 2: .*; run dir runs/llama-8b-lora"),
    Step("jzero checkpoint export runs/llama-8b-lora --format hf --out exported/merged --merge-lora",
         prints=r"\(LoRA's adapters merged\): 21 tensors"),
    Step("jzero checkpoint export runs/llama-8b-lora --format hf --out exported/with-adapters",
         prints=r"LoRA's adapters: 16 tensors in PEFT's layout in exported/with-adapters/lora"),
]  # fmt: skip

# docs/families.md: a Qwen2 (tests/support/hf_families.py's) from import at stage 3 with tensor
# parallelism to LoRA adapters in PEFT's layout.
FAMILY = [
    Step("jzero checkpoint import ~/models/Qwen2.5-0.5B --out runs/qwen --set zero.stage=3 --set mesh.axes.data=4 "
         "--set mesh.axes.model=2", prints=r"at stage 3 on data=4 x model=2, its tokenizer"),
    Step("jzero data prepare 'corpus/*.jsonl' --tokenizer ~/models/Qwen2.5-0.5B --out data/qwen-tokens",
         prints=r"vocabulary 320, uint16"),
    Step("jzero train runs/qwen/config.yaml --set run.dir=runs/qwen-lora --set data.tokens=data/qwen-tokens "
         "--set lora.rank=16 --set \"lora.targets=['q_proj','k_proj','v_proj','o_proj']\"", SHORT,
         prints=r"trained steps 0 -> 2: .*; run dir runs/qwen-lora"),
    Step('jzero sample runs/qwen-lora --prompt "def wrap(text, width):" --max-tokens 32 --temperature 0', prints=ANY),
    Step("jzero checkpoint export runs/qwen-lora --format hf --out exported/qwen-lora",
         prints=r"as Hugging Face Qwen2: .*\nLoRA's adapters: 24 tensors in PEFT's layout in exported/qwen-lora/lora"),
]  # fmt: skip

# docs/own-loop.md: your own model from the command line (model.entry).
OWN = [Step("jzero train configs/own-model.yaml", SHORT, prints=r"trained steps 0 -> 2: .*; run dir runs/own-model")]

# Shown, but run elsewhere, and why.
CI = ".ci/run"  # its first command runs these as written, in a fresh virtualenv of jzero's plain install
ELSEWHERE = {
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[plot]' && jzero train configs/gpt-tiny.yaml": CI,
    **{f'jzero sample runs/gpt-tiny --prompt "{prompt} " --max-tokens 120 --temperature {t} --seed 0': CI
       for prompt, t in (("def", 0.8), ("def", 0.5), ("class", 0.5))},
    "jzero data prepare $(find \"$STDLIB\" -name '*.py' -not -path '*/site-packages/*' | sort) --out data/stdlib-bpe "
    "--vocab-size 4096": CI,
    "jzero train configs/gpt-tiny.yaml": CI,  # docs/sampling.md's: README's command 1
    "jzero train configs/gpt-tiny-bpe.yaml": CI,
    'jzero sample runs/gpt-tiny-bpe --prompt "    def" --max-tokens 50 --temperature 0.5 --seed 0': CI,
    "jzero data prepare SOURCES... --out DIR (--vocab-size N | --tokenizer FILE_OR_HF_DIR) [--eval-fraction F] [--quiet]":
        "a synopsis, not a command",
    # docs/data.md's refusals of a damaged token folder: the page's figures are the whole standard
    # library's BPE folder (9,216,704 tokens, minutes to prepare); its stored run is a user's
    # (`python tests/test_doc_outputs.py --stored --no-live docs/data.md`), tests/data/ tests each refusal.
    **{f"jzero train configs/gpt-tiny-bpe.yaml --set run.dir=/tmp/err-run {words} --quiet": "a stored block of docs/data.md"
       for words in ("--set model.vocab_size=256", "--set train.eval_batches=100", "--set data.tokens=/tmp/x",
                     "--set data.tokens=/tmp/y")},
    # The same run as README's command 1, its lines filtered as the page quotes them
    "jzero train configs/gpt-tiny.yaml 2>&1 | grep -E '^(step (10|100|1000) |goodput|trained)'":
        "a stored block of docs/sampling.md: the 1,000-step run of README's command 1, which .ci/run runs",
    **{f"jzero plan {words} 2>&1 | grep -E '^(jzero plan|total|compiled step|predicted|verdict)'":
       "a stored block of docs/llama.md: a GPU target's compile of a 8B or 70B model; tests/ledger/ compiles GPU targets"
       for words in ("configs/llama3-8b.yaml --target h100x8",
                     "configs/llama3.1-70b.yaml --target h100x64 --set train.global_batch_size=64")},
    "jzero plan configs/gpt-tiny.yaml --target h100x8 --set model.name=mistral --set model.d_model=512 --set model.n_layers=2 "
    "--set model.n_heads=8 --set model.n_kv_heads=4 --set model.seq_len=1024 --set model.sliding_window=256 "
    "--set precision.compute_dtype=bfloat16 --set train.global_batch_size=8 2>&1 | grep -E '^attention|cuDNN'":
        "a stored block of docs/families.md: a GPU target's compile; tests/models/test_attention.py compiles one",
    "jzero sample runs/gpt-tiny --prompt \"def \" 2>&1 | grep '^jzero: note'":
        "a stored block of docs/sampling.md, after the page's 1,000-step run; .ci/run samples that run",
}  # fmt: skip

SCENARIOS = {"LLAMA": LLAMA, "LORA": LORA, "FAMILY": FAMILY, "OWN": OWN}


# ---------------------------------------------------------------------------------------------
# What the pages show


def shown_commands() -> dict[str, str]:
    """Each ``jzero`` command the pages show (in a ```bash block, as a transcript's ``$`` line or an
    output marker's command), with where: ``{command: "page:line"}``."""
    found: dict[str, str] = {}
    for page in PAGES:
        for line, command in _bash_commands(ROOT / page):
            found.setdefault(command, f"{page}:{line}")
    for block in all_blocks([ROOT / page for page in PAGES]):
        for _, command, _ in block.steps():
            if re.match(r"(\w+=\S+ )*jzero ", command):
                found.setdefault(_plain(command), block.where)
    return found


def _bash_commands(page: Path) -> list[tuple[int, str]]:
    """The lines of a page's ```bash blocks that run ``jzero``, continuations joined, comments dropped."""
    commands, lines, i = [], page.read_text().splitlines(), 0
    while i < len(lines):
        if lines[i].strip() != "```bash":
            i += 1
            continue
        i += 1
        while lines[i].strip() != "```":
            start, text = i + 1, lines[i].strip()
            while text.endswith("\\"):
                i += 1
                text = text[:-1].rstrip() + " " + lines[i].strip()
            if re.search(r"(^|&& )jzero ", text):
                commands.append((start, _plain(text)))
            i += 1
    return commands


def _plain(command: str) -> str:
    """A command without a trailing comment (``# exit N`` is a transcript's, kept) and with single spaces."""
    command = re.sub(r"\s+#\s(?!exit \d).*$", "", command)
    return " ".join(command.split())


def test_every_command_the_pages_show_runs_as_a_user():
    """Each command the pages show is a live quoted block's, a scenario's step, or ELSEWHERE's; and
    each step and ELSEWHERE entry is still on a page (a page that changes a command fails here)."""
    shown = shown_commands()
    live = {_plain(c) for b in all_blocks([ROOT / p for p in PAGES]) if b.mode == "live" for _, c, _ in b.steps()}
    steps = {_plain(s.shown) for scenario in SCENARIOS.values() for s in scenario}
    elsewhere = {_plain(c) for c in ELSEWHERE}
    run_nowhere = [f"{where}: {c}" for c, where in shown.items() if c not in live | steps | elsewhere]
    assert not run_nowhere, "commands the pages show that nothing runs:\n" + "\n".join(run_nowhere)
    stale = sorted((steps | elsewhere) - set(shown))
    assert not stale, "commands no page shows any more:\n" + "\n".join(stale)


def test_the_commands_ci_runs_are_in_its_script_as_written():
    """Each command ELSEWHERE leaves to .ci/run is a line of its first command (or the end of one,
    after ``&&``), as the page shows it; a training run may have ``--set train.steps=N`` after it."""
    script = (ROOT / CI).read_text().split("first_command() {", 1)[1].split("\n}\n", 1)[0].splitlines()
    for command in [c for c, where in ELSEWHERE.items() if where == CI]:
        shape = r"(.* && )?" + re.escape(command) + r"( --set train\.steps=\d+)?"
        assert any(re.fullmatch(shape, line) for line in script), command


# ---------------------------------------------------------------------------------------------
# The scenarios


def _hf_llama(folder: Path) -> Path:
    """A tiny Llama written by ``transformers`` (sharded safetensors) with its own ``tokenizer.json``."""
    write_hf_llama(folder)
    write_tokenizer(folder, 320)
    return folder


def _session(tmp_path: Path, cache: Path) -> Session:
    """A user's folder and home; the suite's compile speed (no device count: jzero sizes the devices)."""
    return Session(tmp_path / "work", user_env(tmp_path / "home", cache, compile_flags()))


def _run(session: Session, steps: list[Step]) -> dict[str, str]:
    """Run ``steps`` in order: each exits as its page says (0 unless ``# exit N``), prints no
    traceback and matches its pattern. Returns what each printed, by its page's words."""
    printed = {}
    for step in steps:
        ran = session.run(step.line)
        wanted = expected_status(step.shown) or 0
        assert ran.status == wanted, f"{step.line}: exit status {ran.status}, not {wanted}:\n{ran.text[-3000:]}"
        assert "Traceback" not in ran.text, f"{step.line}:\n{ran.text[-3000:]}"
        assert re.search(step.prints, ran.text, re.M), f"{step.line}: nothing matches {step.prints!r} in:\n{ran.text[-3000:]}"
        printed[step.shown] = ran.text
    return printed


def _home_model(session: Session, hf_llama: Path) -> None:
    shutil.copytree(hf_llama, Path(session.env["HOME"]) / "models" / "Llama-3.1-8B")


def test_the_llama_and_lora_pages_from_import_to_export(tmp_path, user_cache):
    """Each page in a user's folder and home of its own; one model (torch's start-up is seconds)."""
    hf_llama = _hf_llama(tmp_path / "hf")
    _llama_page(_session(tmp_path / "llama", user_cache), hf_llama)
    _lora_page(_session(tmp_path / "lora", user_cache), hf_llama)


def _corpus(session: Session) -> None:
    corpus = session.folder / "corpus"
    corpus.mkdir()
    for name in ("textwrap.py", "shlex.py"):  # documents of JSON lines: a user's corpus/*.jsonl
        text = (Path(sysconfig.get_paths()["stdlib"]) / name).read_text()
        (corpus / f"{Path(name).stem}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in text.split("\n\n")))


def _llama_page(session: Session, hf_llama: Path) -> None:
    _home_model(session, hf_llama)
    _corpus(session)
    _run(session, LLAMA[:3])
    # "a config of yours": the import's, writing its own run folder
    config = (session.folder / "runs/llama-8b/config.yaml").read_text()
    (session.folder / "my-llama.yaml").write_text(re.sub(r"(?m)^  dir: .*$", "  dir: runs/my-llama", config))
    _run(session, LLAMA[3:])
    exported = session.folder / "exported/llama-8b"
    assert json.loads((exported / "config.json").read_text())["torch_dtype"] == "bfloat16"


def _lora_page(session: Session, hf_llama: Path) -> None:
    _home_model(session, hf_llama)
    _run(session, LORA)
    adapters = session.folder / "exported/with-adapters/lora"
    assert json.loads((adapters / "adapter_config.json").read_text())["r"] == 16
    assert not (session.folder / "exported/merged/lora").exists()


def test_the_families_page_from_a_qwen_import_to_peft_adapters(tmp_path, user_cache):
    session = _session(tmp_path, user_cache)
    home = Path(session.env["HOME"]) / "models" / "Qwen2.5-0.5B"
    write_hf(home, "qwen2")
    write_tokenizer(home, 320)
    _corpus(session)
    _run(session, FAMILY)
    config = json.loads((session.folder / "exported/qwen-lora/lora/adapter_config.json").read_text())
    assert (config["r"], config["target_modules"]) == (16, ["k_proj", "o_proj", "q_proj", "v_proj"])


def test_your_own_model_from_the_command_line(tmp_path, user_cache):
    _run(_session(tmp_path, user_cache), OWN)
