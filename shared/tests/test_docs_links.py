"""Every relative link in the repository's Markdown resolves: to a file that exists and, with #anchor, to a heading."""

from __future__ import annotations

import re
from pathlib import Path

from test_docs_cited import ROOT, tracked_files

LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.*)$", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(path: Path) -> set[str]:
    return {github_slug(h) for h in HEADING.findall(FENCE.sub("", path.read_text()))}


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    problems = []
    text = FENCE.sub("", path.read_text())
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{path.relative_to(root)}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in headings(dest):
            problems.append(f"{path.relative_to(root)}: {target} (no heading with that anchor)")
    return problems


def test_every_relative_markdown_link_resolves():
    problems = [p for path in tracked_files("*.md") for p in broken_links(path)]
    assert not problems, "\n".join(problems)


def test_a_broken_link_and_a_missing_anchor_are_caught(tmp_path):
    md = ".md"  # names built from it, so that test_docs_cited does not take them for citations of documents
    (tmp_path / f"b{md}").write_text("# Real runs\n")
    doc = tmp_path / f"a{md}"
    doc.write_text(f"[ok](b{md}#real-runs) [gone](c{md}) [anchor](b{md}#make-run) [web](https://example.org/x{md})\n")
    assert broken_links(doc, root=tmp_path) == [
        f"a{md}: c{md} (no such file)",
        f"a{md}: b{md}#make-run (no heading with that anchor)",
    ]
