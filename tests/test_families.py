"""Table families: every preset generates valid, deterministic files of its shape; tasks are feasible."""
import numpy as np
import pytest

from neuroshard.cli import main
from neuroshard.constraints import check_capacity
from neuroshard.datasets import families
from neuroshard.errors import NeuroShardError
from neuroshard.tables import TableSet

NEW = ["criteo-kaggle", "criteo-terabyte", "broad", "hot-few"]


@pytest.mark.parametrize("family", sorted(families.FAMILIES))
def test_generates_valid_deterministic_files(family, tmp_path):
    num = 30 if family.startswith("dlrm") else None
    a, b, c = (families.generate(family, num, seed) for seed in (5, 5, 6))
    for name, tables in zip("abc", (a, b, c)):
        tables.write(tmp_path / f"{name}.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert (tmp_path / "a.json").read_bytes() != (tmp_path / "c.json").read_bytes()
    back = TableSet.read(tmp_path / "a.json")
    assert back.to_dict() == a.to_dict()
    assert back.extra["synthetic"]["preset"] == family and back.extra["synthetic"]["seed"] == 5
    if family not in ("dlrm-2021", "dlrm-2022"):
        assert all(set(t.access) == {"zipf_alpha", "row_order"} for t in back)


def test_criteo_kaggle_shape():
    tables = families.generate("criteo-kaggle")
    assert [t.num_embeddings for t in tables] == list(families.CRITEO_KAGGLE_ROWS)
    assert {t.embedding_dim for t in tables} == {16} and {t.pooling_factor for t in tables} == {1.0}
    assert all(1.05 <= t.access["zipf_alpha"] <= 1.2 for t in tables)


def test_criteo_terabyte_shape_and_counts():
    tables = families.generate("criteo-terabyte")
    assert len(tables) == 26 and {t.embedding_dim for t in tables} == {128}
    assert max(t.num_embeddings for t in tables) <= 40_000_000
    assert [t.pooling_factor for t in tables].count(100.0) == 1
    assert all(1.05 <= t.access["zipf_alpha"] <= 1.15 for t in tables)
    first = families.generate("criteo-terabyte", 10)
    assert [t.to_dict() for t in first] == [t.to_dict() for t in tables][:10]
    many = families.generate("criteo-terabyte", 60)
    assert len(many) == 60 and many["t27"].num_embeddings == many["t1"].num_embeddings
    assert many["t27"].extra["feature"] == "C1" and len({t.name for t in many}) == 60
    assert many["t27"].access != many["t1"].access


def test_broad_and_hot_few_shapes():
    broad = families.generate("broad", seed=1)
    rows = np.array([t.num_embeddings for t in broad])
    pooling = np.array([t.pooling_factor for t in broad])
    assert np.log10(rows.max() / rows.min()) >= 3
    assert {t.embedding_dim for t in broad} == {16, 32, 64, 128}
    assert pooling.min() < 0.2 and pooling.max() >= 50 and np.median(pooling) < 4
    for seed in range(3):
        hot_few = families.generate("hot-few", seed=seed)
        hot = [t for t in hot_few if t.num_embeddings >= 1e7]
        assert 2 <= len(hot) <= 4 and all(t.pooling_factor >= 30 and t.embedding_dim >= 64 for t in hot)
        cold = [t for t in hot_few if t.num_embeddings < 1e7]
        assert all(t.num_embeddings <= 1e5 and t.pooling_factor <= 3 for t in cold)


@pytest.mark.parametrize("family", NEW + ["dlrm-2021"])
def test_family_tasks_are_feasible(family):
    tasks = families.family_tasks(family, num_devices=4, num_tasks=3, tables_per_device=(5, 12), seed=2)
    assert len(tasks) == 3 and len({t.name for t, _ in tasks}) == 3
    for i, (tables, memory) in enumerate(tasks):
        assert tables.name == f"{family}-d4-task{i:03d}"
        assert len(tables) % 4 == 0 and 20 <= len(tables) <= 48 and len({t.name for t in tables}) == len(tables)
        assert 1.2 <= 4 * memory / tables.total_bytes() <= 1.5 + 1e-6
        check_capacity(tables, 4, memory, 4)
    again = families.family_tasks(family, num_devices=4, num_tasks=3, tables_per_device=(5, 12), seed=2)
    assert [t.to_dict() for t, _ in again] == [t.to_dict() for t, _ in tasks]


def test_terabyte_tasks_have_tables_larger_than_a_device():
    tasks = families.family_tasks("criteo-terabyte", num_devices=8, num_tasks=2, tables_per_device=(2, 3))
    for tables, memory in tasks:
        assert max(t.size_bytes() for t in tables) > memory  # the planner must split it
        check_capacity(tables, 8, memory, 4)


def test_errors_and_cli(tmp_path, capsys):
    with pytest.raises(NeuroShardError, match="unknown preset"):
        families.generate("nope")
    with pytest.raises(NeuroShardError, match="num_tables"):
        families.generate("broad", 0)
    out = tmp_path / "t.json"
    assert main(["tables", "generate", "--preset", "hot-few", "--num-tables", "12", "--seed", "3", "-o", str(out)]) == 0
    assert "12 synthetic tables (hot-few, seed 3)" in capsys.readouterr().out
    assert TableSet.read(out).to_dict() == families.generate("hot-few", 12, 3).to_dict()
    assert main(["tables", "generate", "--preset", "criteo-kaggle", "--num-tables", "0", "-o", str(out)]) == 2
