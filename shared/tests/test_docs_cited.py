"""Every document the code cites lives in the repository's docs/ (nothing points at material outside it)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A path ending in .md in prose or a docstring; not a string literal (code that builds a path, e.g. in a test).
CITATION = re.compile(r"(?<![\w/.\"'])((?:\.\./)*[\w./-]*\b[\w-]+\.md)\b")


def tracked_files(pattern: str) -> list[Path]:
    """The repository's files matching a git pathspec (committed, or new and not ignored)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", pattern], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return [ROOT / line for line in out.stdout.split() if (ROOT / line).is_file()]


def test_every_cited_document_is_in_docs():
    problems = []
    for path in tracked_files("*.py"):
        if path == Path(__file__).resolve():
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            for cited in CITATION.findall(line):
                target = (ROOT / cited).resolve()
                if not cited.startswith("docs/") or not target.is_file():
                    problems.append(f"{path.relative_to(ROOT)}:{lineno} cites {cited}")
    assert not problems, "\n".join(problems)
