import json

import numpy as np
import pytest

from neuroshard import FormatError, TableSet
from neuroshard.datasets import access

from conftest import run_cli, tables_dict


def test_round_trip_preserves_everything(tmp_path, tables_file):
    tables = TableSet.read(tables_file)
    assert [t.name for t in tables] == ["t0", "t1", "t2"]
    data = tables.to_dict()
    data["custom_key"] = {"kept": True}
    data["tables"][0]["owner"] = "ads"
    again = TableSet.from_dict(data)
    out = tmp_path / "again.json"
    again.write(out)
    reread = json.loads(out.read_text())
    assert reread["custom_key"] == {"kept": True}
    assert reread["tables"][0]["owner"] == "ads"
    assert TableSet.read(out) == again


def test_minimal_file_is_accepted(tmp_path):
    path = tmp_path / "minimal.json"
    path.write_text(json.dumps({"format": "neuroshard.tables/v1", "tables": [
        {"name": "a", "num_embeddings": 10, "embedding_dim": 4, "pooling_factor": 1}]}))
    tables = TableSet.read(path)
    assert tables.name == "minimal" and tables.batch_size == 65536
    assert tables["a"].size_bytes() == 160


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(format="neuroshard.tables/v9"), "field 'format'"),
    (lambda d: d["tables"][1].pop("embedding_dim"), "table #1 't1': field 'embedding_dim' is missing"),
    (lambda d: d["tables"][0].update(num_embeddings="many"), "table #0 't0': field 'num_embeddings' must be"),
    (lambda d: d["tables"][2].update(num_embeddings=-5), "table #2 't2': field 'num_embeddings' must be an integer >= 1"),
    (lambda d: d["tables"][2].update(pooling_factor=-1.0), "field 'pooling_factor' must be a number >= 0"),
    (lambda d: d["tables"][2].update(name="t0"), "table #2 't0': duplicate name"),
    (lambda d: d["tables"][0]["access"].update(zipf_alpha=-2), "field 'access.zipf_alpha'"),
    (lambda d: d["tables"][1]["access"].update(reuse_histogram=[1, 2]), "field 'access.reuse_histogram'"),
    (lambda d: d["tables"][0]["access"].update(row_order="sorted"), "field 'access.row_order'"),
    (lambda d: d.update(batch_size=0), "field 'batch_size'"),
])
def test_bad_input_names_file_table_and_field(tmp_path, mutate, message):
    data = tables_dict()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(FormatError) as err:
        TableSet.read(path)
    assert str(path) in str(err.value) and message in str(err.value)
    result = run_cli("tables", "describe", path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr


def test_malformed_json_is_one_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"format": "neuroshard.tables/v1", "tables": [')
    result = run_cli("tables", "describe", path)
    assert result.returncode == 2
    assert "not valid JSON" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_missing_file_is_one_line(tmp_path):
    result = run_cli("tables", "describe", tmp_path / "nope.json")
    assert result.returncode == 2 and "cannot read tables file" in result.stderr


def test_describe_prints_summary(tables_file):
    result = run_cli("tables", "describe", tables_file)
    assert result.returncode == 0, result.stderr
    assert "3 tables" in result.stdout and "pooling factor" in result.stdout and "width" in result.stdout


def test_histogram_from_zipf_is_deterministic_and_skewed(tables_file):
    a, b = TableSet.read(tables_file), TableSet.read(tables_file)
    ha, hb = a["t0"].reuse_histogram(512), b["t0"].reuse_histogram(512)
    assert np.array_equal(ha, hb) and ha.shape == (17,) and abs(ha.sum() - 1) < 1e-9
    # a zipf table reuses its hot rows far more than a uniform table of the same size
    _, zipf_lookups, zipf_reuse = a["t0"].reuse_histograms(512)
    uniform = a["t0"].shard(0, 4000, 0, 32, 512)
    uniform.access = {}
    uniform._cache = {}
    _, _, uniform_reuse = uniform.reuse_histograms(512)
    assert zipf_reuse > uniform_reuse
    assert zipf_lookups[5:].sum() > 0.2


def test_histogram_access_reproduces_its_histogram():
    hist = np.array([0.473, 0.152, 0.139, 0.112, 0.072, 0.032, 0.011, 0.005, 0.002, 0.001, 0.001] + [0] * 6)
    rows = access.sample_rows({"reuse_histogram": hist.tolist()}, 10**7, 400_000, np.random.default_rng(0))
    distinct, _, _ = access.reuse_histograms(rows)
    assert np.abs(distinct - hist / hist.sum()).sum() < 0.05


def test_row_shard_features_follow_row_order():
    from neuroshard import Table
    hot = Table("hot", 10_000, 16, 4.0, {"zipf_alpha": 1.1, "row_order": "hottest_first"})
    top = hot.shard(0, 1000, 0, 16, 1024)
    bottom = hot.shard(9000, 1000, 0, 16, 1024)
    assert top.pooling_factor > 5 * bottom.pooling_factor
    scattered = Table("cold", 10_000, 16, 4.0, {"zipf_alpha": 1.1})
    halves = [scattered.shard(0, 5000, 0, 16, 1024), scattered.shard(5000, 5000, 0, 16, 1024)]
    assert abs(halves[0].pooling_factor + halves[1].pooling_factor - 4.0) < 0.05
    assert 0.5 < halves[0].pooling_factor / halves[1].pooling_factor < 2.0
