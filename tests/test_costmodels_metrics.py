"""Metrics and the split by table on hand-made cases."""
from __future__ import annotations

import math

import numpy as np
import pytest

from neuroshard.costmodels.metrics import cost_metrics, gmae, kendall_tau, mape, pair_accuracy, pair_accuracy_of_plans
from neuroshard.costmodels.pretrain import split_by_group, split_by_table


def test_gmae_and_mape_by_hand():
    true = np.array([1.0, 1.0, 1.0])
    pred = np.array([1.1, 0.9, 2.0])  # relative errors 0.1, 0.1, 1.0
    assert gmae(pred, true) == pytest.approx((0.1 * 0.1 * 1.0) ** (1 / 3))
    assert mape(pred, true) == pytest.approx(0.4)
    assert mape(true, true) == 0.0
    assert gmae(true, true) < 1e-5  # exact hits count as a tiny error, never -inf


def test_kendall_tau_orders():
    true = np.array([1.0, 2.0, 3.0, 4.0])
    assert kendall_tau(true * 3, true) == pytest.approx(1.0)
    assert kendall_tau(-true, true) == pytest.approx(-1.0)
    assert kendall_tau(np.array([2.0, 1.0, 3.0, 4.0]), true) == pytest.approx(4 / 6)  # 5 concordant, 1 discordant


def test_pair_accuracy_of_plans():
    true = np.arange(1.0, 21.0)
    assert pair_accuracy_of_plans(np.log(true), true) == 1.0
    assert pair_accuracy_of_plans(-true, true) == 0.0
    swapped = true.copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # one of 190 distinct pairs out of order
    assert 0.97 < pair_accuracy_of_plans(swapped, true, num_pairs=50000) < 1.0
    assert math.isnan(pair_accuracy_of_plans(np.ones(5), np.ones(5)))  # no pair with different costs


def test_pair_accuracy_uses_the_max_over_a_plan():
    rng = np.random.default_rng(0)
    true = rng.uniform(1, 10, 200)
    assert pair_accuracy(true ** 2, true) == 1.0  # a monotone map keeps every plan's max in order
    noisy = true * rng.uniform(0.5, 1.5, 200)
    assert 0.5 < pair_accuracy(noisy, true) < 1.0
    metrics = cost_metrics(true, true)
    assert set(metrics) == {"gmae", "mape", "kendall_tau", "pair_accuracy", "n"} and metrics["n"] == 200


def test_split_by_table_keeps_test_tables_unseen():
    tables = [frozenset(s) for s in (["a"], ["b"], ["c"], ["a", "b"], ["c", "d"], ["d"], ["e", "a"], ["e"], ["b", "c"])]
    train, test, mixed = split_by_table(tables, 0.4, seed=3)
    assert sorted([*train, *test, *mixed]) == list(range(len(tables)))
    train_tables = set().union(*(tables[i] for i in train))
    test_tables = set().union(*(tables[i] for i in test))
    assert not train_tables & test_tables
    for i in mixed:
        assert tables[i] - test_tables and tables[i] & test_tables


def test_split_by_group_holds_out_whole_families_where_every_set_mixes_tables():
    """Sets of many shards each draw from their family's tables: a split by table holds out
    nothing, a split by group holds out whole families, and a set of another group that reuses
    a held-out table is left out of both sides."""
    rng = np.random.default_rng(0)
    families = {f: [f"{f}-t{i}" for i in range(30)] for f in ("f1", "f2", "f3", "f4")}
    tables, groups = [], []
    for f, names in families.items():
        for _ in range(20):
            tables.append(frozenset(rng.choice(names, 20, replace=False)))
            groups.append(f"{f}.json")
    tables.append(frozenset([families["f1"][0], families["f2"][0]]))  # a set of hot tables of two families
    groups.append("hot.json")
    assert len(split_by_table(tables, 0.25, seed=0)[1]) <= 1  # at most the set of two tables
    train, test, mixed = split_by_group(tables, groups, 0.25, seed=0)
    assert len(test) >= 20 and len(train) > len(test) and sorted([*train, *test, *mixed]) == list(range(len(tables)))
    assert not set().union(*(tables[i] for i in train)) & set().union(*(tables[i] for i in test))
    assert len({groups[i] for i in test}) < len(set(groups))
    assert split_by_group(tables, [""] * len(tables), 0.25, seed=0)[1].size == 0  # one group: nothing held out
