"""The README and docs/ pages: every relative link reaches a file and, with ``#anchor``, a heading
there; the README stays short enough to read in five minutes."""

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.M)


def prose(text: str) -> str:
    """The page without its fenced code blocks, where neither links nor headings count."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation but ``-`` and ``_`` dropped, spaces
    to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The page's heading anchors; a repeated heading gets ``-1``, ``-2``, ... as on GitHub."""
    seen: Counter[str] = Counter()
    found = set()
    for heading in HEADING.findall(prose(page.read_text())):
        base = slug(heading)
        found.add(f"{base}-{seen[base]}" if seen[base] else base)
        seen[base] += 1
    return found


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text())) if not re.match(r"(https?|mailto):", t)]


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (file.suffix != ".md" or anchor not in anchors(file)):
            broken.append(f"{target}: no such heading")
    return broken


def test_slug_matches_github():
    assert slug("Compiling for GPUs from a CPU host: `--target`") == "compiling-for-gpus-from-a-cpu-host---target"
    assert slug("Beyond one machine: jax.distributed, jzero launch") == "beyond-one-machine-jaxdistributed-jzero-launch"
    assert slug("Your own model through `jzero.build.setup` and hooks") == "your-own-model-through-jzerobuildsetup-and-hooks"


def test_repeated_headings_are_numbered(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Notes\n\n## Preemption\n\n```\n## not a heading\n```\n\n## Preemption\n\n## Preemption\n")
    assert anchors(page) == {"notes", "preemption", "preemption-1", "preemption-2"}


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## A section\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[ok](other.md#a-section), [ok](#page), [web](https://example.com/x#y)\n"
        "[gone](missing.md), [no anchor](other.md#b-section), [here](#nothing)\n"
        "```\n[in code](missing-too.md)\n```\n"
    )
    assert [b.split(":")[0] for b in broken_links(page)] == ["missing.md", "other.md#b-section", "#nothing"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    assert broken_links(page) == []


def test_docs_pages_have_a_title_and_are_listed_in_the_readme():
    readme_links = {(ROOT / t.partition("#")[0]).resolve() for t in links(ROOT / "README.md")}
    for page in PAGES[1:]:
        assert page.read_text().startswith("# "), f"{page.name} does not start with a # title"
        assert page in readme_links, f"README.md does not link to docs/{page.name}"


def test_readme_is_short():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"
