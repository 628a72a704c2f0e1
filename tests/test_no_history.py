"""What a user reads names no work session, no tracker issue and no revision: the package (its
code, help, messages and data files), the README, docs/, and the code and notes of examples/ and
experiments/ say why a thing is so by citing docs/decisions.md or docs/results.md, never
"session 12", "issue 25" or "revision 3"."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HISTORY = re.compile(r"(session|issue|revision) [0-9]", re.IGNORECASE)
#: beside the package: the code and notes a user reads (results files are data, written by that code)
BESIDE = ("examples", "experiments")


def _files() -> list[Path]:
    package = [p for ext in ("*.py", "*.md", "*.json") for p in (ROOT / "neuroshard").rglob(ext)]
    beside = [p for folder in BESIDE for ext in ("*.py", "*.md") for p in (ROOT / folder).rglob(ext)]
    return sorted(package) + [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(beside)]


def test_the_files_to_check_exist():
    files = _files()
    assert ROOT / "README.md" in files and ROOT / "docs" / "guide.md" in files
    assert any(p.suffix == ".py" for p in files) and any(p.suffix == ".json" for p in files)
    for folder in BESIDE:
        assert any(p.suffix == ".py" and p.is_relative_to(ROOT / folder) for p in files), folder


def test_no_session_or_issue_numbers_in_what_users_read():
    hits = []
    for path in _files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            for match in HISTORY.finditer(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r} in {line.strip()[:120]}")
    if hits:
        pytest.fail(f"{len(hits)} mentions of a session, an issue or a revision (cite docs/decisions.md instead):\n"
                    + "\n".join(hits), pytrace=False)
