import json

import numpy as np
import pytest
from conftest import run_cli, tables_dict

from neuroshard import FormatError, Table, TableSet
from neuroshard.datasets import access, sampler
from neuroshard.datasets.sampler import reuse_histograms, shard_table


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


def test_misspelt_keys_and_a_missing_batch_are_warned_about_once(tmp_path, caplog):
    """docs/formats.md: extra keys are kept; a key like a misspelt known one, any unknown key of
    ``access``, and a file without ``batch_size`` get one warning each per file, naming them."""
    entries = [{"name": f"t{i}", "num_embeddings": 10, "embedding_dim": 4, "pooling_factor": 1,
                "acess": {"zipf_alpha": 1.1}, "access": {"zipf_alpa": 1.1}, "owner": "ads"} for i in range(3)]
    path = tmp_path / "typos.json"
    path.write_text(json.dumps({"format": "neuroshard.tables/v1", "tables": entries}))
    with caplog.at_level("WARNING", logger="neuroshard.tables"):
        tables = TableSet.read(path)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3, messages
    assert "no 'batch_size'" in messages[0] and "65536" in messages[0]
    assert any("key 'acess' in 3 tables is not read (did you mean 'access'?)" in m for m in messages)
    assert any("key 'access.zipf_alpa' in 3 tables is not read (did you mean 'zipf_alpha'?)" in m for m in messages)
    assert not any("owner" in m for m in messages)  # an extra key unlike any known one: kept silently
    assert tables["t0"].extra == {"acess": {"zipf_alpha": 1.1}, "owner": "ads"}


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
    ha, hb = reuse_histograms(a["t0"], 512)[0], reuse_histograms(b["t0"], 512)[0]
    assert np.array_equal(ha, hb) and ha.shape == (17,) and abs(ha.sum() - 1) < 1e-9
    # a zipf table reuses its hot rows far more than a uniform table of the same size
    _, zipf_lookups, zipf_reuse = reuse_histograms(a["t0"], 512)
    uniform = shard_table(a["t0"], 0, 4000, 0, 32, 512)
    uniform.access = {}
    _, _, uniform_reuse = reuse_histograms(uniform, 512)
    assert zipf_reuse > uniform_reuse
    assert zipf_lookups[5:].sum() > 0.2


def test_histogram_access_reproduces_its_histogram():
    hist = np.array([0.473, 0.152, 0.139, 0.112, 0.072, 0.032, 0.011, 0.005, 0.002, 0.001, 0.001] + [0] * 6)
    rows = access.sample_rows({"reuse_histogram": hist.tolist()}, 10**7, 400_000, np.random.default_rng(0))
    distinct, _, _ = access.reuse_histograms(rows)
    assert np.abs(distinct - hist / hist.sum()).sum() < 0.05


def test_row_shard_features_follow_row_order():
    hot = Table("hot", 10_000, 16, 4.0, {"zipf_alpha": 1.1, "row_order": "hottest_first"})
    top = shard_table(hot, 0, 1000, 0, 16, 1024)
    bottom = shard_table(hot, 9000, 1000, 0, 16, 1024)
    assert top.pooling_factor > 5 * bottom.pooling_factor
    scattered = Table("cold", 10_000, 16, 4.0, {"zipf_alpha": 1.1})
    halves = [shard_table(scattered, 0, 5000, 0, 16, 1024), shard_table(scattered, 5000, 5000, 0, 16, 1024)]
    assert abs(halves[0].pooling_factor + halves[1].pooling_factor - 4.0) < 0.05
    assert 0.5 < halves[0].pooling_factor / halves[1].pooling_factor < 2.0


def test_table_is_a_record_and_tables_imports_no_pipeline_stage():
    """``neuroshard.tables`` loads no ``neuroshard.datasets`` code; sampling lives in ``datasets.sampler``."""
    import subprocess
    import sys
    code = "import sys, neuroshard.tables; print(sorted(m for m in sys.modules if m.startswith('neuroshard.datasets')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    assert not any(hasattr(Table, name) for name in ("sample_lookups", "draw_lookups", "reuse_histograms", "shard"))


def test_samples_are_those_drawn_before_sampling_left_table():
    """Digests of batches drawn by ``Table``'s own methods before they moved to ``datasets.sampler``."""
    import hashlib

    def digest(rows, lengths):
        return hashlib.sha256(np.ascontiguousarray(rows).tobytes() + np.ascontiguousarray(lengths).tobytes()
                              ).hexdigest()[:16]

    for table, default, seeded, drawn in (
            (Table("z", 5000, 16, 3.0, {"zipf_alpha": 1.1}), "d2631b4d626410ed", "3eeea506c53386da", "4c83f6e5fc02eff4"),
            (Table("zh", 5000, 16, 3.0, {"zipf_alpha": 0.8, "row_order": "hottest_first"}), "86671f8c727baee6",
             "4d7e1056866710c5", "72695228ab9f7d8d"),
            (Table("u", 700, 8, 2.0), "597446ba3a296637", "dfcbe03704f9791e", "269b78aa03156c66")):
        assert digest(*sampler.sample_lookups(table, 1024)) == default
        assert digest(*sampler.sample_lookups(table, 1024, seed=5)) == seeded
        assert digest(*sampler.draw_lookups(table, 512, seed=9)) == drawn
