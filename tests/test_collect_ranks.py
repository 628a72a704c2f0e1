"""``collect compute`` under torchrun: each rank its share of the samples in its own part
file, resumable; readers and ``collect merge`` fold the parts without loss or duplicates."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from neuroshard.cli import main
from neuroshard.costmodels.samples import load_compute_data, read_meta
from neuroshard.costmodels.samples.store import part_files, part_header
from neuroshard.errors import NeuroShardError
from neuroshard.measured.collect import collect_compute

FAST = ["--batch-size", "64", "--flush-bytes", "1MiB", "--warmup", "0", "--repeats", "1", "--max-repeats", "1",
        "--memory", "16MiB", "--row-cap", "5000", "--max-tables-per-device", "3", "--no-progress"]
KWARGS = dict(batch_size=64, flush_bytes=1 << 20, warmup=0, repeats=1, max_repeats=1, memory_bytes=16 << 20,
              max_rows=5000, max_tables=3, progress=False)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


def _samples(path: Path) -> list[int]:
    return [r["sample"] for r in _lines(path) if "sample" in r]


def _torchrun() -> list[str]:
    exe = Path(sys.executable).with_name("torchrun")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]


@pytest.mark.gloo
@pytest.mark.timing
def test_torchrun_ranks_split_the_samples_and_merge(tables_file, tmp_path):
    out = tmp_path / "ranks"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                          "MASTER_PORT")}
    cmd = [*_torchrun(), "--standalone", "--nproc_per_node", "2", "-m", "neuroshard.cli", "collect", "compute",
           str(tables_file), "--samples", "7", "-o", str(out), *FAST]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-1500:]
    assert "rank 0 of 2 measured 4" in done.stdout and "rank 1 of 2 measured 3" in done.stdout
    parts = part_files(out, "compute.jsonl")
    assert [p.name for p in parts] == ["compute.rank0-of2.jsonl", "compute.rank1-of2.jsonl"]
    assert _samples(parts[0]) == [0, 2, 4, 6] and _samples(parts[1]) == [1, 3, 5]
    assert part_header(parts[1])["part"] == {"rank": 1, "world_size": 2}
    assert read_meta(out)["config"]["batch_size"] == 64  # meta.json, written by rank 0
    merged = load_compute_data(out)
    assert [r["sample"] for r in merged] == list(range(7))

    single = tmp_path / "single"
    assert main(["collect", "compute", str(tables_file), "--samples", "7", "-o", str(single), *FAST]) == 0
    alone = load_compute_data(single)
    assert [(r["sample"], r["shards"]) for r in merged] == [(r["sample"], r["shards"]) for r in alone]

    # a rerun with the same world size finds everything on disk
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert again.returncode == 0, again.stderr[-1500:]
    assert "measured 0" in again.stdout and [_samples(p) for p in parts] == [[0, 2, 4, 6], [1, 3, 5]]

    assert main(["collect", "merge", str(out)]) == 0
    assert part_files(out, "compute.jsonl") == []
    assert _samples(out / "compute.jsonl") == list(range(7))
    assert load_compute_data(out) == merged


@pytest.mark.timing
def test_a_torn_part_resumes_and_duplicates_count_once(tables_file, tmp_path):
    out = tmp_path / "d"
    assert collect_compute(tables_file, 6, out, rank=1, world_size=2, **KWARGS) == 3
    part = out / "compute.rank1-of2.jsonl"
    assert _samples(part) == [1, 3, 5] and not (out / "meta.json").exists()  # meta.json is rank 0's to write
    data = part.read_bytes()
    part.write_bytes(data[:-20])  # killed while writing sample 5
    assert _samples(part) == [1, 3]
    assert collect_compute(tables_file, 6, out, rank=1, world_size=2, **KWARGS) == 1
    assert _samples(part) == [1, 3, 5] and part_header(part) is not None
    first = {r["sample"]: r for r in load_compute_data(out)}

    # a single-process run into the same folder measures only what no part holds
    assert collect_compute(tables_file, 8, out, **KWARGS) == 5
    assert _samples(out / "compute.jsonl") == [0, 2, 4, 6, 7]
    # the same sample twice (a part and the main file): the main file's record counts, once
    with open(out / "compute.jsonl", "a") as handle:
        handle.write(json.dumps({**first[3], "cost_ms": 999.0}) + "\n")
    records = load_compute_data(out)
    assert [r["sample"] for r in records] == list(range(8))
    assert records[3]["cost_ms"] == 999.0 and records[1] == first[1]


@pytest.mark.timing
def test_a_part_measured_differently_is_refused(tables_file, tmp_path, capsys):
    out = tmp_path / "d"
    assert collect_compute(tables_file, 4, out, rank=0, world_size=2, **KWARGS) == 2
    assert collect_compute(tables_file, 4, out, rank=1, world_size=2, **KWARGS) == 2
    part = out / "compute.rank1-of2.jsonl"
    lines = part.read_text().splitlines()
    header = json.loads(lines[0])
    header["meta"]["hardware"]["hostname"] = "another-node"  # other machines of one kind: accepted
    part.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    assert [r["sample"] for r in load_compute_data(out)] == [0, 1, 2, 3]

    header["meta"]["config"]["seed"] = 5
    part.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    with pytest.raises(NeuroShardError, match="measured differently.*config.seed"):
        load_compute_data(out)
    capsys.readouterr()
    assert main(["collect", "merge", str(out)]) == 2
    err = capsys.readouterr().err
    assert "compute.rank1-of2.jsonl" in err and "config.seed" in err and len(err.strip().splitlines()) == 1
    assert part.exists() and (out / "compute.rank0-of2.jsonl").exists()  # nothing removed
    with pytest.raises(NeuroShardError, match="config.seed"):  # nor collected into
        collect_compute(tables_file, 6, out, rank=0, world_size=2, **KWARGS)
