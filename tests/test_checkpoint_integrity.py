"""Checkpoints carry a checksum of their contents: a damaged file (a zeroed block, weights
overwritten with plausible floats) is refused in one line naming it, where it used to load
and move every estimate; a file written before checksums loads with one note."""
from __future__ import annotations

import io
import logging
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tables_dict

from neuroshard.costmodels import DEFAULT_CHECKPOINT, checkpoint
from neuroshard.costmodels.base import CostModels
from neuroshard.errors import NeuroShardError
from neuroshard.measured import calibrate as calibrate_module

V1_CHECKPOINT = Path(__file__).parent / "data" / "cpu-default-v1.pt"
BLOCK = 4096


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "neuroshard.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


def _search(tables_file: Path, model: Path, out: Path) -> subprocess.CompletedProcess:
    return _cli("search", tables_file, "-d", "2", "-m", "1MiB", "--cost-model", model, "-o", out)


def _largest_tensor_record(raw: bytes) -> tuple[int, int]:
    """(offset, size) in the file of the largest tensor's bytes (a zip member stored uncompressed)."""
    archive = zipfile.ZipFile(io.BytesIO(raw))
    info = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    assert info.compress_type == zipfile.ZIP_STORED
    name_len, extra_len = np.frombuffer(raw[info.header_offset + 26:info.header_offset + 30], dtype="<u2")
    return info.header_offset + 30 + int(name_len) + int(extra_len), info.file_size


def test_the_shipped_checkpoint_carries_its_checksum():
    payload = torch.load(DEFAULT_CHECKPOINT, weights_only=True)
    assert payload[checkpoint.CHECKSUM_FIELD] == checkpoint.state_checksum(payload)
    assert payload[checkpoint.CHECKSUM_FIELD].startswith("sha256:")


def test_a_saved_checkpoint_round_trips_its_checksum(analytic_models, tmp_path):
    path = analytic_models.save(tmp_path / "m.pt")
    payload = torch.load(path, weights_only=True)
    assert payload[checkpoint.CHECKSUM_FIELD] == checkpoint.state_checksum(payload)
    CostModels.load(path)
    # the checksum covers names and dtypes, not only bytes
    renamed = {**payload, "name": payload["name"] + "x"}
    assert checkpoint.state_checksum(renamed) != payload[checkpoint.CHECKSUM_FIELD]


@pytest.mark.parametrize("fill", ["zeros", "floats"])
def test_a_damaged_block_of_weights_is_one_line_naming_the_file(tables_file, tmp_path, fill):
    raw = bytearray(DEFAULT_CHECKPOINT.read_bytes())
    offset, size = _largest_tensor_record(bytes(raw))
    start = offset + (size // 2 // BLOCK) * BLOCK - BLOCK // 2  # a 4 KiB block in the middle of the weights
    start = max(offset, min(start, offset + size - BLOCK))
    values = np.random.default_rng(0).normal(0.0, 0.05, BLOCK // 4).astype(np.float32).tobytes()
    raw[start:start + BLOCK] = bytes(BLOCK) if fill == "zeros" else values
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(bytes(raw))
    out = tmp_path / "plan.json"
    done = _search(tables_file, damaged, out)
    assert done.returncode == 2 and not out.exists(), done.stderr
    [line] = _lines(done.stderr)
    assert line.startswith(f"neuroshard: error: {damaged}: checksum mismatch: the file is damaged")
    assert "calibrate" in line and "restore" in line


def test_a_zeroed_block_in_the_middle_of_the_file_is_one_line(tables_file, tmp_path):
    raw = bytearray(DEFAULT_CHECKPOINT.read_bytes())
    start = (len(raw) // 2) // BLOCK * BLOCK
    raw[start:start + BLOCK] = bytes(BLOCK)
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(bytes(raw))
    done = _search(tables_file, damaged, tmp_path / "plan.json")
    assert done.returncode == 2
    [line] = _lines(done.stderr)
    assert line.startswith(f"neuroshard: error: {damaged}: ") and "damaged" in line and "Traceback" not in line


def test_one_weight_changed_without_its_checksum_is_refused(tmp_path):
    payload = torch.load(DEFAULT_CHECKPOINT, weights_only=True)
    weights = [v for k, v in _tensors(payload) if v.is_floating_point() and v.numel() > 100]
    weights[0].view(-1)[7] += 0.01  # a plausible weight, nothing a check of the contents can see
    edited = tmp_path / "edited.pt"
    torch.save(payload, edited)  # by hand: the stored checksum is the old one
    with pytest.raises(NeuroShardError, match=r"edited\.pt: checksum mismatch: the file is damaged"):
        CostModels.load(edited)
    done = _cli("costmodel", "show", edited)
    assert done.returncode == 2 and len(_lines(done.stderr)) == 1 and "checksum mismatch" in done.stderr


def _tensors(value, name=""):
    if isinstance(value, torch.Tensor):
        yield name, value
    elif isinstance(value, dict):
        for k in sorted(value):
            yield from _tensors(value[k], f"{name}/{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _tensors(v, f"{name}[{i}]")


def test_an_old_checkpoint_loads_with_one_note(tables_file, tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(checkpoint, "_NOTED_UNCHECKED", set())
    with caplog.at_level(logging.WARNING, logger="neuroshard.costmodels.checkpoint"):
        first = CostModels.load(V1_CHECKPOINT)
        CostModels.load(V1_CHECKPOINT)
    notes = [r for r in caplog.records if "no checksum" in r.getMessage()]
    assert len(notes) == 1 and str(V1_CHECKPOINT) in notes[0].getMessage()
    assert first.name
    done = _search(tables_file, V1_CHECKPOINT, tmp_path / "plan.json")
    assert done.returncode == 0 and (tmp_path / "plan.json").exists()
    [note] = _lines(done.stderr)
    assert "no checksum" in note and str(V1_CHECKPOINT) in note


def test_a_code_carrying_file_is_refused_in_exactly_one_line(tables_file, tmp_path):
    """A bare pickle (protocol 4, not torch's): torch warns about the protocol; we say one line."""
    import pickle
    raw = tmp_path / "code.pt"
    raw.write_bytes(pickle.dumps({"x": Path("/nonexistent")}, protocol=4))
    done = _search(tables_file, raw, tmp_path / "plan.json")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"neuroshard: error: {raw}: not a cost-model checkpoint")
    assert "Warning" not in done.stderr


def test_a_damaged_calibration_cache_entry_is_ignored_with_a_warning(tmp_path, monkeypatch, caplog):
    """The cache's entry fails its checksum: a warning, then the calibration is done again."""
    from neuroshard.costmodels import load_cost_models
    from neuroshard.tables import TableSet
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    tables = TableSet.from_dict(tables_dict())
    models = load_cost_models()
    key = calibrate_module._cache_key(tables, models, 2, 4, 0)
    entry = calibrate_module.cache_dir() / f"{key}.pt"
    entry.parent.mkdir(parents=True)
    payload = torch.load(DEFAULT_CHECKPOINT, weights_only=True)
    next(v for _, v in _tensors(payload) if v.is_floating_point() and v.numel() > 100).view(-1)[3] *= 1.5
    torch.save(payload, entry)
    calls = []

    class Report:
        def format(self) -> str:
            return "calibrated again"

    def calibrate_again(*args, **kwargs):
        calls.append(args)
        return models, Report()

    monkeypatch.setattr(calibrate_module, "calibrate", calibrate_again)
    with caplog.at_level(logging.WARNING, logger="neuroshard.measured.calibrate"):
        got = calibrate_module.calibrated_models(tables, models, devices=2, sets=4)
    assert got is models and len(calls) == 1
    [warning] = [m for m in (r.getMessage() for r in caplog.records) if "ignoring a broken calibration cache" in m]
    assert "checksum mismatch" in warning
    # re-written by the new writer: the next call reads it from the cache, checksum and all
    assert checkpoint.state_checksum(torch.load(entry, weights_only=True)) == \
        torch.load(entry, weights_only=True)[checkpoint.CHECKSUM_FIELD]
    calibrate_module.calibrated_models(tables, models, devices=2, sets=4)
    assert len(calls) == 1
