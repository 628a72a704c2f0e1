"""Collection: durable records, resume after a real kill -9, meta.json checks, loaders."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from neuroshard.cli import main
from neuroshard.costmodels.samples import (
    comm_arrays,
    compute_arrays,
    load_comm_data,
    load_compute_data,
    read_meta,
    record_shards,
)
from neuroshard.costmodels.samples.store import locked
from neuroshard.errors import NeuroShardError
from neuroshard.measured.collect import collect_comm, parse_dims, sample_shard_set
from neuroshard.tables import Table, TableSet

FAST = ["--batch-size", "256", "--flush-bytes", "4MiB", "--warmup", "0", "--repeats", "3", "--max-repeats", "3",
        "--no-progress"]


@pytest.fixture
def varied_tables_file(tmp_path):
    """12 random tables and one of 3,000,000 rows (not conftest's small ``varied_tables_file``)."""
    rng = np.random.default_rng(1)
    tables = [Table(f"t{i}", int(rng.integers(100, 50000)), int(rng.choice([8, 32, 128])), float(rng.uniform(1, 10)),
                    {"zipf_alpha": float(rng.uniform(0, 1.2))}) for i in range(12)]
    tables.append(Table("huge", 3_000_000, 64, 2.0))
    path = tmp_path / "tables.json"
    TableSet("small", tables, batch_size=256).write(path)
    return path


def _cli(*args):
    return [sys.executable, "-m", "neuroshard.cli", "collect", *args]


def test_parse_dims():
    assert parse_dims("4..128") == [4, 8, 16, 32, 64, 128]
    assert parse_dims("16,64") == [16, 64]
    with pytest.raises(NeuroShardError):
        parse_dims("big")


def test_shard_sets_follow_the_rules(varied_tables_file):
    tables = TableSet.read(varied_tables_file).tables
    memory = 4 << 20
    for i in range(30):
        shards = sample_shard_set(tables, np.random.default_rng(i), 5, memory, 256, [4, 8, 16, 32, 64, 128], 0.3)
        assert 1 <= len(shards) <= 5
        assert sum(s.size_bytes() for s in shards) <= memory
        for s in shards:
            src = TableSet.read(varied_tables_file)[s.extra["source_table"]]
            assert s.embedding_dim in (4, 8, 16, 32, 64, 128) and s.embedding_dim <= src.embedding_dim
            assert s.num_embeddings <= src.num_embeddings


@pytest.mark.timing
def test_resume_after_kill_9(varied_tables_file, tmp_path):
    out = tmp_path / "data"
    cmd = _cli("compute", "--tables", str(varied_tables_file), "--samples", "14", "--out", str(out),
               "--max-tables-per-device", "4", "--memory", "64MiB", "--max-rows", "20000", *FAST)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    path = out / "compute.jsonl"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and len(path.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"finished or failed before the kill: {proc.stderr.read().decode()[-500:]}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]
    assert 3 <= len(before) < 14
    with open(path, "a") as handle:  # as if the kill had torn a line mid-write
        handle.write('{"sample": 99, "batch_size"')
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-500:]
    records = load_compute_data(out)
    assert [r["sample"] for r in records] == list(range(14))  # none lost, none duplicated
    raw = [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]
    assert sorted(r["sample"] for r in raw) == list(range(14))
    assert [r["shards"] for r in records[:len(before)]] == [r["shards"] for r in before]  # untouched
    tables = TableSet.read(varied_tables_file).tables
    for r in records:  # sample i is the set drawn from seed + i
        expect = sample_shard_set(tables, np.random.default_rng(r["sample"]), 4, 64 << 20, 256,
                                  [4, 8, 16, 32, 64, 128], 0.2)
        assert [s.to_dict() for s in expect] == r["shards"]
        assert r["kernel"] in ("fbgemm_tbe", "embedding_bag") and r["batch_size"] == 256
        assert r["cost_ms"] > 0 and r["fwd_ms"] > 0 and len(r["times_ms"]) == 3 and r["cv"] >= 0
        assert all("source_table" in s for s in r["shards"])
    sets, costs = compute_arrays(records)
    assert len(sets) == 14 and sets[0].shape[1] == 22 and (costs > 0).all()
    assert record_shards(records[0])[0].extra["source_table"]
    meta = read_meta(out)
    assert meta["hardware"]["cpu_model"] and meta["hardware"]["hostname"]
    assert meta["software"]["torch"] and meta["config"]["batch_size"] == 256
    assert meta["config"]["kernel"] == records[0]["kernel"] and meta["config"]["max_rows"] == 20000
    # a rerun with another configuration into the same folder is refused, with a one-line message
    other = [a if a != "256" else "512" for a in cmd]
    refused = subprocess.run(other, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert "measured differently" in refused.stderr and "batch_size" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


@pytest.mark.gloo
def test_other_hardware_refused(tmp_path):
    out = tmp_path / "c"
    collect_comm(2, 2, out, batch_size=64, warmup=0, repeats=1, progress=False, timeout_s=30)
    meta = json.loads((out / "meta.json").read_text())
    meta["hardware"]["cpu_model"] = "Some Other CPU"
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(NeuroShardError, match="cpu_model"):
        collect_comm(2, 3, out, batch_size=64, warmup=0, repeats=1, progress=False, timeout_s=30)


@pytest.mark.gloo
def test_comm_collection_and_loader(tmp_path):
    out = tmp_path / "comm2"
    assert collect_comm(2, 3, out, batch_size=128, warmup=0, repeats=2, progress=False, timeout_s=30) == 3
    assert collect_comm(2, 4, out, batch_size=128, warmup=0, repeats=2, progress=False, timeout_s=30) == 1
    records = load_comm_data(out)
    assert [r["sample"] for r in records] == [0, 1, 2, 3]
    r = records[0]
    assert set(r) == {"sample", "num_devices", "batch_size", "widths", "skews_ms", "reduce_width", "fwd_ms",
                      "bwd_ms", "reduce_ms", "cv_fwd"}
    assert r["num_devices"] == 2 and len(r["widths"]) == len(r["fwd_ms"]) == 2 and min(r["skews_ms"]) == 0
    arrays = comm_arrays(records)
    assert arrays["widths"].shape == (4, 2) and arrays["reduce_ms"].shape == (4,)


def test_bad_input(tmp_path, varied_tables_file):
    assert main(["collect", "comm", "--devices", "1", "--samples", "3", "--out", str(tmp_path / "x")]) == 2
    assert main(["collect", "compute", "--tables", str(varied_tables_file), "--samples", "3", "--out",
                 str(tmp_path / "y"), "--kernel", "magic"]) == 2
    assert main(["collect", "compute", "--tables", str(tmp_path / "missing.json"), "--samples", "3", "--out",
                 str(tmp_path / "y")]) == 2
    with pytest.raises(NeuroShardError, match="no such cost-data folder"):
        load_compute_data(tmp_path / "nothing")
    with locked(tmp_path / "z", "compute.jsonl"):
        with pytest.raises(NeuroShardError, match="another collection"):
            with locked(tmp_path / "z", "compute.jsonl"):
                pass
    assert sorted(p.name for p in (tmp_path / "z").iterdir()) == ["compute.jsonl"]  # no stray lock file
