"""Faults on the way out (issue 28), tried for real: a file-size limit while writing
(``RLIMIT_FSIZE`` in a child process, the stand-in for a full disk), a closed standard
output, a poisoned checkpoint, devices and FIFOs as inputs and outputs, symlinks,
invalid plans shown, a run with more ranks than its plan, control characters in names.
Each gives one line and a non-zero exit (quiet for a closed pipe), writes nothing
half-done and replaces no device node."""
from __future__ import annotations

import json
import os
import resource
import stat
import subprocess
import sys
import threading
from pathlib import Path, PurePosixPath

import pytest
import torch
from conftest import tables_dict

from neuroshard.cli import EXIT_BROKEN_PIPE, EXIT_INVALID, main
from neuroshard.costmodels import DEFAULT_CHECKPOINT
from neuroshard.errors import FormatError, WriteError
from neuroshard.io import append_jsonl, atomic_write_text, read_jsonl
from neuroshard.tables import TableSet


def _cli(*args: str, limit_bytes: int | None = None, **popen) -> subprocess.CompletedProcess:
    """The real command in a child process, with a file-size limit when asked."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    return subprocess.run([sys.executable, "-m", "neuroshard.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=120, preexec_fn=limit if limit_bytes is not None else None, **popen)


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def plan_file(tables_file, tmp_path) -> Path:
    out = tmp_path / "plan.json"
    assert main(["search", str(tables_file), "-d", "2", "-m", "1MiB", "-o", str(out)]) == 0
    return out


def test_a_write_over_the_file_size_limit_is_one_line_and_keeps_the_old_file(tables_file, tmp_path):
    out = tmp_path / "plan.json"
    out.write_text("the old plan\n")
    done = _cli("search", tables_file, "-d", "2", "-m", "1MiB", "-o", out, limit_bytes=200)
    assert done.returncode == 2
    line = _one_line(done.stderr)
    assert line.startswith(f"neuroshard: error: {out}: cannot write it (File too large)") and "intact" in line
    assert out.read_text() == "the old plan\n" and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    # a dataset record that does not fit is not left half-written
    records = tmp_path / "records.jsonl"
    append_jsonl(records, {"a": 1})
    size = records.stat().st_size
    code = (f"import resource; resource.setrlimit(resource.RLIMIT_FSIZE, ({size + 10}, {size + 10}))\n"
            f"from neuroshard.io import append_jsonl\n"
            f"try:\n    append_jsonl({str(records)!r}, {{'b': 'x' * 100}})\n"
            f"except OSError as exc:\n    print(type(exc).__name__, exc)")
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert printed.startswith("WriteError") and "records before it are intact" in printed
    assert records.stat().st_size == size and read_jsonl(records) == [{"a": 1}]


def test_a_closed_standard_output_ends_quietly(tables_file):
    for args in (["tables", "describe", tables_file], ["search", tables_file, "-d", "2", "-m", "1MiB", "-o", "-"]):
        child = subprocess.Popen([sys.executable, "-m", "neuroshard.cli", *map(str, args)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
        child.stdout.close()  # the reader is gone before the first line (`| head -c 0`)
        err = child.stderr.read().decode()
        assert child.wait(timeout=120) == EXIT_BROKEN_PIPE, err
        assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err


def test_a_checkpoint_predicting_nan_is_refused_naming_it(tables_file, tmp_path):
    payload = torch.load(DEFAULT_CHECKPOINT, map_location="cpu", weights_only=True)

    def poison(value):
        if isinstance(value, dict):
            return {k: poison(v) for k, v in value.items()}
        if isinstance(value, list):
            return [poison(v) for v in value]
        return torch.full_like(value, float("nan")) if torch.is_tensor(value) and value.is_floating_point() else value

    bad = tmp_path / "nan.pt"
    torch.save(poison(payload), bad)
    out = tmp_path / "plan.json"
    done = _cli("search", tables_file, "-d", "2", "-m", "1MiB", "--cost-model", bad, "-o", out)
    assert done.returncode == 2 and not out.exists()
    line = _one_line(done.stderr)
    assert f"{bad}: cost model 'cpu-default' predicts NaN or infinite compute costs" in line


def test_a_garbage_checkpoint_is_one_short_line_without_unsafe_advice(tables_file, tmp_path):
    bad = tmp_path / "garbage.pt"
    torch.save({"format": PurePosixPath("x")}, bad)  # a pickle of a class a weights-only load refuses
    done = _cli("costmodel", "show", bad)
    line = _one_line(done.stderr)
    assert done.returncode == 2 and line.startswith(f"neuroshard: error: {bad}: not a cost-model checkpoint")
    assert "weights_only" not in line and len(line) < 200


def test_devices_and_fifos_as_inputs_are_read_with_a_bound(tmp_path):
    done = _cli("tables", "describe", "/dev/zero")
    assert done.returncode == 2 and "/dev/zero: tables file is not a text file (it has runs of NUL bytes)" in \
        _one_line(done.stderr)
    fifo = tmp_path / "tables.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(json.dumps(tables_dict())))
    writer.start()
    assert len(TableSet.read(fifo)) == 3  # a pipe is read to its end like a file
    writer.join()
    done = _cli("search", "/dev/null", "-d", "2", "-m", "1MiB", "-o", tmp_path / "p.json")
    assert done.returncode == 2 and "/dev/null" in _one_line(done.stderr)


def test_outputs_write_through_symlinks_device_nodes_and_fifos(tables_file, tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert main(["search", str(tables_file), "-d", "2", "-m", "1MiB", "-o", str(link)]) == 0
    assert link.is_symlink() and json.loads(target.read_text())["format"] == "neuroshard.plan/v1"
    # /dev/null stays the device node it is (as root, a rename would have replaced it)
    assert main(["search", str(tables_file), "-d", "2", "-m", "1MiB", "-o", "/dev/null"]) == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    atomic_write_text(fifo, "through the pipe\n")
    reader.join(timeout=30)
    assert got == ["through the pipe\n"] and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_write_error_names_the_path_and_keeps_the_old_file(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "f.json").write_text("old")
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    with pytest.raises(WriteError, match="not-a-folder/f.json: cannot write it .*nothing was written"):
        atomic_write_text(blocker / "f.json", "new")  # a file where the folder should be
    if os.geteuid() != 0:  # root writes read-only files and folders anyway
        os.chmod(folder / "f.json", 0o444)
        assert main(["tables", "generate", "--preset", "criteo-kaggle", "-o", str(folder / "f.json")]) == 2
        os.chmod(folder / "f.json", 0o644)
    assert (folder / "f.json").read_text() == "old"


def test_plan_show_of_an_invalid_plan_says_so_on_stderr_and_exits_1(plan_file, capsys):
    data = json.loads(plan_file.read_text())
    data["shards"][0]["num_rows"] -= 1  # a row of the table is in no shard
    plan_file.write_text(json.dumps(data))
    assert main(["plan", "show", str(plan_file)]) == EXIT_INVALID == 1
    out, err = capsys.readouterr()
    assert "plan is invalid" not in out and f"{plan_file}: plan is invalid:" in err
    assert main(["plan", "validate", str(plan_file)]) == EXIT_INVALID


def test_a_run_with_more_ranks_than_its_plan_is_refused(plan_file, tables_file, capsys):
    assert main(["train", str(plan_file), "--tables", str(tables_file), "--devices", "3", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "plan is for 2 devices, 3 given: rank 2 would sit idle; give --devices 2" in err


@pytest.mark.parametrize("name", ["t\n0", "t\x000", "t\x1b[31m", "t\u0085"])
def test_names_with_control_characters_are_refused(tmp_path, name):
    data = tables_dict()
    data["tables"][0]["name"] = name
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    with pytest.raises(FormatError, match=r"table #0: field 'name' .* has a control character"):
        TableSet.read(path)
    data = tables_dict(name=name)
    path.write_text(json.dumps(data))
    with pytest.raises(FormatError, match="field 'name' .* has a control character"):
        TableSet.read(path)
