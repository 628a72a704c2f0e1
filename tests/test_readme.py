"""The README's "Plan your own tables" runs as written: its tables file, its two commands
(whose output must be exactly the output the README shows) and its Python snippet."""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path

from conftest import run_cli

README = Path(__file__).resolve().parent.parent / "README.md"


def _section() -> str:
    text = README.read_text()
    start = text.index("## Plan your own tables")
    return text[start:text.index("\n## ", start + 1)]


def _blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block, in order."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"```(\w*)\n(.*?)```", text, re.S)]


def _widths(shown: str) -> str:
    """``plan show``'s text with each column block named by its width, not its range: which of a
    table's two equal column halves the search splits again is a float tie that the CPU decides
    (the README's output, pasted on an AMD EPYC, has item_history's cols 0-31 whole and 32-63
    halved, an Intel Xeon the other way round, every figure equal)."""
    return re.sub(r"cols (\d+)-(\d+)", lambda m: f"{int(m.group(2)) - int(m.group(1)) + 1} cols", shown)


def test_plan_your_own_tables_runs_as_written(tmp_path):
    blocks = _blocks(_section())
    tables = next(body for lang, body in blocks if lang == "json")
    json.loads(tables)  # the file as shown is valid JSON
    (tmp_path / "tables.json").write_text(tables)
    commands = next(body for lang, body in blocks if lang == "" and body.startswith("neuroshard search"))
    shown = next(body for lang, body in blocks if lang == "" and body.startswith("plan for"))
    outputs = []
    for line in commands.strip().splitlines():
        args = line.split()
        assert args[0] == "neuroshard"
        done = run_cli(*args[1:], cwd=tmp_path)
        assert done.returncode == 0, (line, done.stderr)
        outputs.append(done.stdout)
    assert _widths(outputs[-1]) == _widths(shown), "README's 'plan show' output is out of date: paste the new one"

    python = next(body for lang, body in blocks if lang == "python")
    (tmp_path / "plan.json").unlink()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(python, "README.md", "exec"), {})
    finally:
        os.chdir(cwd)
    assert (tmp_path / "plan.json").exists()
    assert printed.getvalue().splitlines()[0] == shown.splitlines()[0]
    cost, batch = printed.getvalue().splitlines()[-1].split()
    comment = re.search(r"# ([\d.]+) ms at batch (\d+)", python)
    assert round(float(cost), 2) == float(comment.group(1)) and int(batch) == int(comment.group(2))
