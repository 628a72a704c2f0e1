"""Loading dlrm_datasets tensor files: small files written in exactly that format."""
import gzip
import io
import json

import numpy as np
import pytest
import torch

from neuroshard.cli import main
from neuroshard.datasets.dlrm import load_dlrm, recorded_batch, tables_from_dlrm
from neuroshard.datasets.sampler import reuse_histograms, sample_lookups
from neuroshard.errors import FormatError
from neuroshard.tables import TableSet

NUM_TABLES, BATCH = 3, 64
ROW_LIMITS = (500, 40, 3000)  # table 1 stays below 100 rows


def _make_lookups(seed=0):
    """Per-table lists of per-sample row ids (skewed), as numpy arrays."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 6, size=(NUM_TABLES, BATCH))
    lengths[2, :10] = 0
    per_table = [np.minimum(rng.zipf(1.3, size=int(lengths[t].sum())) - 1, ROW_LIMITS[t] - 1)
                 for t in range(NUM_TABLES)]
    return per_table, lengths


def _save(path, per_table, lengths, gz=False):
    indices = torch.from_numpy(np.concatenate(per_table).astype(np.int64))
    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths.reshape(-1))]).astype(np.int64))
    buf = io.BytesIO()
    torch.save((indices, offsets, torch.from_numpy(lengths.astype(np.int64))), buf)
    path.write_bytes(gzip.compress(buf.getvalue()) if gz else buf.getvalue())
    return path


def _numpy_histograms(rows):
    _, counts = np.unique(rows, return_counts=True)
    bins = np.minimum(np.ceil(np.log2(counts)).astype(int), 16)
    distinct = np.bincount(bins, minlength=17) / counts.size
    lookups = np.bincount(bins, weights=counts, minlength=17) / counts.sum()
    return distinct, lookups, counts.mean()


@pytest.mark.parametrize("suffix,gz", [(".pt", False), (".pt.gz", True)])
def test_load_splits_tables(tmp_path, suffix, gz):
    per_table, lengths = _make_lookups()
    path = _save(tmp_path / f"fbgemm_t3_bs64{suffix}", per_table, lengths, gz)
    tables, got_lengths = load_dlrm(path)
    assert len(tables) == NUM_TABLES
    np.testing.assert_array_equal(got_lengths, lengths)
    for t in range(NUM_TABLES):
        np.testing.assert_array_equal(tables[t], per_table[t])


@pytest.mark.parametrize("gz", [False, True])
def test_tables_match_numpy_and_round_trip(tmp_path, gz):
    per_table, lengths = _make_lookups(1)
    (tmp_path / "data").mkdir()
    data = _save(tmp_path / "data" / ("f.pt.gz" if gz else "f.pt"), per_table, lengths, gz)
    out = tmp_path / "out" / "tables.json"
    tables = tables_from_dlrm(data, relative_to=out.parent)
    assert tables.batch_size == BATCH and len(tables) == NUM_TABLES
    for t, table in enumerate(tables):
        rows = per_table[t]
        assert table.num_embeddings == max(int(rows.max()) + 1, 100)
        assert table.pooling_factor == pytest.approx(rows.size / BATCH, rel=1e-5)
        distinct, lookups, mean = _numpy_histograms(rows)
        np.testing.assert_allclose(table.access["reuse_histogram"], distinct, atol=1e-5)
        assert table.access["mean_reuse"] == pytest.approx(mean, rel=1e-5)
        np.testing.assert_allclose(reuse_histograms(table, BATCH)[0], distinct, atol=1e-5)
        assert table.access["table_index"] == t
    assert tables[1].num_embeddings == 100  # max row id < 99: at least 100 rows

    tables.write(out)
    again = TableSet.read(out)
    assert again.to_dict() == json.loads(out.read_text())
    assert again[0].access["indices"] == ("../data/" + data.name)
    for t, table in enumerate(again):
        rows, lens = sample_lookups(table, BATCH)
        np.testing.assert_array_equal(rows, per_table[t])
        np.testing.assert_array_equal(lens, lengths[t])


def test_recorded_batch_resamples_samples(tmp_path):
    per_table, lengths = _make_lookups(2)
    path = _save(tmp_path / "f.pt", per_table, lengths)
    tables = tables_from_dlrm(path)  # absolute path in access.indices
    table = tables[0]
    recorded = {tuple(seg) for seg in np.split(per_table[0], np.cumsum(lengths[0])[:-1])}
    for batch in (17, 200):
        rows, lens = recorded_batch(table, batch, np.random.default_rng(0))
        assert lens.shape == (batch,) and lens.sum() == rows.size
        for seg in np.split(rows, np.cumsum(lens)[:-1]):
            assert tuple(seg) in recorded
    a = recorded_batch(table, 200, np.random.default_rng(5))
    b = recorded_batch(table, 200, np.random.default_rng(5))
    np.testing.assert_array_equal(a[0], b[0])
    assert tables_from_dlrm(path, batch_size=200).batch_size == 200


def test_errors_name_the_file(tmp_path):
    with pytest.raises(FormatError, match="missing.pt: dlrm_datasets file not found"):
        load_dlrm(tmp_path / "missing.pt")
    wrong = tmp_path / "two.pt"
    torch.save((torch.zeros(3, dtype=torch.long), torch.zeros(4, dtype=torch.long)), wrong)
    with pytest.raises(FormatError, match="two.pt: expected a tuple"):
        load_dlrm(wrong)
    bad_offsets = tmp_path / "offsets.pt"
    torch.save((torch.zeros(4, dtype=torch.long), torch.tensor([0, 2, 4]), torch.ones(2, 2, dtype=torch.long)),
               bad_offsets)
    with pytest.raises(FormatError, match="offsets.pt: field 'offsets' has 3 entries"):
        load_dlrm(bad_offsets)
    disagree = tmp_path / "disagree.pt"
    torch.save((torch.zeros(4, dtype=torch.long), torch.tensor([0, 1, 2, 3, 4]),
                torch.tensor([[2, 0], [1, 1]])), disagree)
    with pytest.raises(FormatError, match="disagree"):
        load_dlrm(disagree)
    text = tmp_path / "text.pt.gz"
    text.write_bytes(gzip.compress(b"hello"))
    with pytest.raises(FormatError, match="text.pt.gz: not a torch-saved"):
        load_dlrm(text)


def test_cli_from_dlrm(tmp_path, capsys):
    per_table, lengths = _make_lookups(3)
    path = _save(tmp_path / "f.pt.gz", per_table, lengths, gz=True)
    out = tmp_path / "tables.json"
    assert main(["tables", "from-dlrm", str(path), "-o", str(out), "--name", "recorded"]) == 0
    tables = TableSet.read(out)
    assert tables.name == "recorded" and tables[0].access["indices"] == "f.pt.gz"
    assert main(["tables", "describe", str(out)]) == 0
    assert main(["tables", "from-dlrm", str(tmp_path / "nope.pt"), "-o", str(out)]) == 2
    assert "nope.pt: dlrm_datasets file not found" in capsys.readouterr().err
