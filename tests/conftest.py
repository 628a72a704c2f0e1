"""Shared fixtures: small real tables files written to a temporary folder."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HISTOGRAM = [0.473, 0.152, 0.139, 0.112, 0.072, 0.032, 0.011, 0.005, 0.002, 0.001, 0.001, 0, 0, 0, 0, 0, 0]


def tables_dict(**overrides) -> dict:
    data = {
        "format": "neuroshard.tables/v1",
        "name": "small",
        "batch_size": 512,
        "tables": [
            {"name": "t0", "num_embeddings": 4000, "embedding_dim": 32, "pooling_factor": 3.0,
             "access": {"zipf_alpha": 1.05}},
            {"name": "t1", "num_embeddings": 3000, "embedding_dim": 16, "pooling_factor": 1.0,
             "access": {"reuse_histogram": HISTOGRAM, "mean_reuse": 6.9}},
            {"name": "t2", "num_embeddings": 500, "embedding_dim": 8, "pooling_factor": 5.0},
        ],
    }
    data.update(overrides)
    return data


@pytest.fixture
def tables_file(tmp_path: Path) -> Path:
    path = tmp_path / "tables.json"
    path.write_text(json.dumps(tables_dict()))
    return path


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run the real `neuroshard` command in a subprocess."""
    return subprocess.run([sys.executable, "-m", "neuroshard.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout)


def run_ranks(target, world: int, args: tuple, timeout: float) -> dict:
    """Start ``world`` spawned processes ``target(rank, port, *args, results)`` on one free
    port; return what each put on ``results`` as ``{rank: value}`` (a string: its error)."""
    import torch.multiprocessing
    from neuroshard.launch import free_port
    ctx = torch.multiprocessing.get_context("spawn")
    results, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=target, args=(r, port, *args, results)) for r in range(world)]
    for p in procs:
        p.start()
    got = {}
    try:
        for _ in range(world):
            rank, value = results.get(timeout=timeout)
            got[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    for rank, value in got.items():
        assert not isinstance(value, str), f"rank {rank}: {value}"
    return got
