"""Closed standard streams, narrow text encodings and odd output paths, tried on the real
command in a child process: the work goes on, a written file is never lost, the exit status
says what happened, and a loop of links, a folder's name or a link are never replaced by a file."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tables_dict

from neuroshard.cli import EXIT_BROKEN_PIPE


def _cli(*args, close: tuple[int, ...] = (), env: dict | None = None) -> subprocess.CompletedProcess:
    """``neuroshard ARGS`` in a child with the descriptors in ``close`` closed, as ``>&-`` does."""
    def closer() -> None:
        for fd in close:
            os.close(fd)
    return subprocess.run([sys.executable, "-m", "neuroshard.cli", *map(str, args)], capture_output=not close,
                          text=True, timeout=120, preexec_fn=closer, env={**os.environ, **(env or {})})


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def tables(tmp_path) -> Path:
    path = tmp_path / "tables.json"
    path.write_text(json.dumps(tables_dict()))
    return path


def test_a_closed_stdout_keeps_the_written_plan_and_says_output_was_lost(tables, tmp_path):
    out = tmp_path / "plan.json"
    done = _cli("search", tables, "-d", "2", "-m", "1MiB", "-o", out, close=(1,))
    assert done.returncode == EXIT_BROKEN_PIPE
    assert json.loads(out.read_text())["format"] == "neuroshard.plan/v1"
    # the plan itself on the closed stream: lost, and said so
    assert _cli("search", tables, "-d", "2", "-m", "1MiB", "-o", "-", close=(1,)).returncode == EXIT_BROKEN_PIPE
    assert _cli("tables", "describe", tables, close=(1,)).returncode == EXIT_BROKEN_PIPE


def test_a_closed_stderr_does_not_stop_the_work(tables, tmp_path):
    out = tmp_path / "plan.json"
    done = _cli("search", tables, "-d", "2", "-m", "1MiB", "-o", out, close=(2,))
    assert done.returncode == 0 and out.exists()
    # both closed: the file is written all the same
    out.unlink()
    done = _cli("search", tables, "-d", "2", "-m", "1MiB", "-o", out, close=(1, 2))
    assert done.returncode == EXIT_BROKEN_PIPE and out.exists()


def test_names_the_encoding_cannot_carry_are_written_escaped(tables, tmp_path):
    data = json.loads(tables.read_text())
    data["tables"][0]["name"] = "tablé_ü"
    tables.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    ascii_env = {"LC_ALL": "POSIX", "PYTHONIOENCODING": "ascii"}
    out = tmp_path / "plan.json"
    for args in (("tables", "describe", tables), ("search", tables, "-d", "2", "-m", "1MiB", "-o", out),
                 ("plan", "show", out)):
        done = _cli(*args, env=ascii_env)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "tabl\\xe9_\\xfc" in done.stdout


def test_a_loop_of_links_is_one_line_as_input_and_as_output_and_stays_a_link(tables, tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop.name)
    assert _one_line(_cli("search", tables, "-d", "2", "-m", "1MiB", "-o", loop).stderr).endswith(
        "a loop of symbolic links; give another file name")
    assert "Too many levels of symbolic links" in _one_line(_cli("search", loop, "-d", "2", "-m", "1MiB", "-o",
                                                                 tmp_path / "p.json").stderr)
    done = _cli("tables", "generate", "--num-tables", "4", "--calibration-tables", "0", "-o", loop)
    assert done.returncode == 2 and "loop of symbolic links" in _one_line(done.stderr)
    assert loop.is_symlink() and os.readlink(loop) == loop.name


def test_a_trailing_slash_names_a_folder_not_a_file(tables, tmp_path):
    out = tmp_path / "nx7"
    done = _cli("search", tables, "-d", "2", "-m", "1MiB", "-o", f"{out}/")
    assert done.returncode == 2 and "names a folder" in _one_line(done.stderr)
    assert not out.exists()
