"""The examples in the README and docs/ work as written.

Every ``neuroshard`` command in a code block of README.md and docs/*.md parses with the
real command line (options, choices, values): a renamed or removed option fails here,
naming the file and line. The guide's small end-to-end blocks then run for real, in one
folder, in order, and its Python blocks after them (the README's "Plan your own tables"
runs in ``test_readme.py``, the README's TorchRec lines in a 2-rank DMP in
``test_torchrec_planner.py``, the Python blocks of docs/extending.md in
``test_extending.py``). Not run here: the guide's TorchRec blocks (the README's lines
again, and a DMP on a CUDA device), collection and pre-training at full size (hours),
and commands that need a GPU, Meta's dlrm_datasets files or torchrun."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from neuroshard.cli import build_parser, main
from neuroshard.cli_options import missing_input

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: a shell loop in a block (``for d in 2 4 8; do neuroshard ... $d ...; done``): its body, at the first value
#: a command line: ``neuroshard`` then a subcommand (not a line of printed output)
COMMAND = re.compile(r"^neuroshard (tables|collect|pretrain|calibrate|costmodel|search|export|train|evaluate|measure|"
                     r"plan|demo)\b")
LOOP = re.compile(r"^for (\w+) in (\S+)[^;]*; do (.*?);? done$")


def commands(path: Path) -> list[tuple[int, str]]:
    """(line number, command) of every ``neuroshard`` command in the file's code blocks
    (``\\``-continued lines joined, comments cut, loops taken at their first value)."""
    out, inside, pending = [], False, ""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            inside, pending = not inside, ""
            continue
        if not inside:
            continue
        text = pending + line.strip()
        if text.endswith("\\"):
            pending = text[:-1] + " "
            continue
        pending = ""
        loop = LOOP.match(text)
        if loop:
            name, value, text = loop.groups()
            text = text.replace(f"${name}", value)
        text = text.split("  #")[0].split(" # ")[0].strip()
        if COMMAND.match(text) and "…" not in text and "..." not in text:
            out.append((number, text))
    return out


EXAMPLES = [(f"{path.relative_to(ROOT)}:{number}", command) for path in DOCS for number, command in commands(path)]


def test_the_docs_have_commands_to_check():
    assert len(EXAMPLES) >= 45 and any(where.startswith("README.md") for where, _ in EXAMPLES)


@pytest.mark.parametrize("where,command", EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_every_documented_command_parses(where, command, capsys):
    argv = shlex.split(command)[1:]
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"{where}: `{command}` does not parse: {capsys.readouterr().err.strip()}")
    assert missing_input(args) is None, f"{where}: `{command}`: {missing_input(args)}"


#: the guide's blocks that run here, each named by its first command; sizes made small
#: (the commands are otherwise as written)
RUN = ["neuroshard tables generate --preset dlrm-2021 --num-tables 856",   # 1. tables
       "neuroshard search test.json --devices 8 --memory 16GiB -o plan.json",  # 4. search, show, export
       "neuroshard tables generate --preset dlrm-2021 --num-tables 12",   # optimizer state; run a plan
       ]
SMALLER = {"--num-tables 856": "--num-tables 96", "--steps 20": "--steps 2", "--iterations 20": "--iterations 2"}
#: lines of those blocks that need what a test machine lacks
NEEDS = {"from-dlrm": "Meta's dlrm_datasets tensors (a download)"}


def _blocks(path: Path) -> list[list[str]]:
    blocks, current = [], None
    for number, command in commands(path):
        if current and number == current[0] + 1:
            current[0] = number
            current[1].append(command)
        else:
            current = [number, [command]]
            blocks.append(current[1])
    return blocks


@pytest.mark.slow
@pytest.mark.gloo
def test_the_guides_small_blocks_run_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    blocks = [b for b in _blocks(ROOT / "docs" / "guide.md") if any(b[0].startswith(first) for first in RUN)]
    for first in RUN:
        assert any(b[0].startswith(first) for b in blocks), f"docs/guide.md has no block starting `{first}`: update RUN"
    ran = []
    for block in blocks:
        for command in block:
            if any(need in command for need in NEEDS):
                continue
            for big, small in SMALLER.items():
                command = command.replace(big, small)
            code = main(shlex.split(command)[1:])
            assert code == 0, f"docs/guide.md: `{command}` exited {code}: {capsys.readouterr().err[-800:]}"
            ran.append(command)
    # the guide's Python blocks that need no TorchRec model: run as written, after the commands made test.json
    text = (ROOT / "docs" / "guide.md").read_text(encoding="utf-8")
    python = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "torchrec" not in b]
    assert len(python) >= 2
    for block in python:
        exec(compile(block, "docs/guide.md", "exec"), {})
    assert len(ran) >= 14 and Path("plan.torchrec.json").exists() and Path("plan-adagrad.json").exists()
    assert Path("measured.json").exists()  # the last block: search, train and evaluate a 2-device plan
