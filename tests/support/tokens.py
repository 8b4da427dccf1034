"""A small corpus of every source kind, for token-folder tests."""

import json
import shutil

from jzero.data.tokenizer import EOS

VOCAB = 300  # the 256 bytes, the 2 special tokens and a few merges: trains in milliseconds


FRACTION = 0.25


def write_corpus(root):
    """Files, a folder, a glob and JSONL: 12 documents, one of them not valid UTF-8, one holding EOS's text."""
    (root / "tree" / "sub").mkdir(parents=True)
    (root / "tree" / "a.py").write_text("def add(x, y):\n    return x + y\n" * 20)
    (root / "tree" / "sub" / "b.py").write_bytes(b"class B:\n    name = 'caf\xe9'\n" * 10)  # Latin-1
    (root / "one.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 30)
    for i in range(3):
        (root / f"note{i}.md").write_text(f"# note {i}\n" + "some words of a note\n" * (i + 5))
    lines = [{"text": f"line document {i} " * (i + 3)} for i in range(5)]
    lines[2]["text"] += f" {EOS} is text here"
    (root / "docs.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    (root / "single.jsonl").write_text(json.dumps({"text": "x = 1\n", "id": 7}) + "\n")
    return [str(root / name) for name in ("tree", "one.txt", "note*.md", "docs.jsonl", "single.jsonl")]


def copy_folder(corpus, tmp_path):
    folder = tmp_path / "tokens"
    shutil.copytree(corpus[1], folder)
    return folder
