"""The synthetic benchmark: parsed statistics, calibration, determinism, the file."""
import json

import numpy as np
import pytest

from neuroshard.cli import main
from neuroshard.datasets import synthetic
from neuroshard.tables import TableSet


def test_parses_published_statistics():
    stats = synthetic.parse_locality_stats(synthetic.DATA_DIR / "dlrm_datasets_2021_locality_stats.txt")
    entry = stats["fbgemm_t856_bs65536.pt"]
    assert entry.batch_size == 65536 and entry.num_indices == 887017990 and entry.mean_reuse == 6.9
    assert entry.distinct_hist[0] == 0.473 and entry.lookup_share[-1] == 0.019
    assert len(stats) == 17
    avg = synthetic.preset_stats("dlrm-2022")
    assert avg.batch_size == 131072 and avg.name.count("fbgemm_t788_bs131072_") == 16
    assert avg.lookup_share.shape == (17,) and abs(avg.lookup_share.sum() - 1) < 0.01


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["dlrm-2021", "dlrm-2022"])
def test_calibration_meets_targets(preset):
    tables = synthetic.generate(preset, seed=0)
    p = synthetic.PRESETS[preset]
    assert len(tables) == p.num_tables and tables.batch_size == p.batch_size
    # a batch touches at most num_embeddings distinct rows
    for t in tables:
        assert t.num_embeddings >= t.pooling_factor * tables.batch_size / t.access["mean_reuse"]
    report = synthetic.calibration_report(tables, seed=0, max_tables=8)
    assert report["tables_sampled"] == 8
    assert report["distinct_hist_l1"] <= 0.10
    assert report["lookup_share_l1"] <= 0.10
    assert report["lookups_per_table_rel_err"] <= 0.20
    assert report["mean_reuse_rel_err"] <= 0.20


def test_tables_differ_in_skew_and_size():
    tables = synthetic.generate("dlrm-2021", num_tables=300, seed=0)
    reuse = np.array([t.access["mean_reuse"] for t in tables])
    rows = np.array([t.num_embeddings for t in tables])
    pooling = np.array([t.pooling_factor for t in tables])
    assert reuse.max() / reuse.min() > 10
    assert np.corrcoef(np.log(reuse), np.log(rows))[0, 1] < 0  # hot tables are small
    assert pooling.mean() == pytest.approx(887017990 / 856 / 65536, rel=0.01)
    assert {t.embedding_dim for t in tables} == set(synthetic.DIMS)


def test_deterministic_by_seed(tmp_path):
    a = synthetic.generate("dlrm-2022", num_tables=50, seed=3)
    b = synthetic.generate("dlrm-2022", num_tables=50, seed=3)
    c = synthetic.generate("dlrm-2022", num_tables=50, seed=4)
    a.write(tmp_path / "a.json")
    b.write(tmp_path / "b.json")
    c.write(tmp_path / "c.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert (tmp_path / "a.json").read_bytes() != (tmp_path / "c.json").read_bytes()


def test_cli_generate_writes_valid_file(tmp_path, capsys):
    out = tmp_path / "tables.json"
    assert main(["tables", "generate", "--preset", "dlrm-2021", "--num-tables", "40", "--seed", "1",
                 "-o", str(out), "--calibration-tables", "4"]) == 0
    printed = capsys.readouterr().out
    assert "L1 distance, share of distinct rows" in printed and "relative error, lookups per distinct row" in printed
    tables = TableSet.read(out)
    assert len(tables) == 40 and tables.extra["synthetic"]["preset"] == "dlrm-2021"
    assert json.loads(out.read_text())["format"] == "neuroshard.tables/v1"
    assert main(["tables", "generate", "--preset", "dlrm-2021", "--num-tables", "0", "-o", str(out)]) == 2
