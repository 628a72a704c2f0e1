"""Why a table was split: the plan's ``provenance.splits`` names a reason for each split table
(memory, constraints, balance, the model's cost) and ``plan show`` prints it."""
from __future__ import annotations

import pytest

from neuroshard.cli import main
from neuroshard.plan import SPLIT_REASONS, Plan
from neuroshard.search.api import search_plan
from neuroshard.search.neuroshard import HALF_HEAVY_SHARE
from neuroshard.search.simulator import Simulator
from neuroshard.tables import Table, TableSet
from neuroshard.types import whole_pieces

HOT = TableSet("hot", [Table("hot", 50_000, 64, 20.0), *(Table(f"t{i}", 5000 * (i + 1), 32, 2.0) for i in range(10))],
               4096)


def _split(plan: Plan) -> set[str]:
    return {t.name for t in plan.tables if len(plan.shards_of(t.name)) > 1}


def test_a_table_larger_than_a_device_is_split_for_memory(analytic_models, tmp_path, capsys):
    tables = TableSet("big", [Table("big", 400_000, 64, 1.0), Table("small", 1000, 16, 1.0)], 4096)
    plan = search_plan(tables, 4, "40MiB", algorithm="size", cost_models=analytic_models)
    assert _split(plan) == {"big"} and plan.provenance["splits"] == {"big": "memory"}
    assert main(["plan", "show", str(plan.write(tmp_path / "plan.json"))]) == 0
    out = capsys.readouterr().out
    assert f"why tables are split:\n  memory ({SPLIT_REASONS['memory']}): big" in out


def test_the_searchs_splits_say_balance_or_the_models_cost(shipped_models):
    plan = search_plan(HOT, 4, "1GiB", cost_models=shipped_models)
    reasons = plan.provenance["splits"]
    assert set(reasons) == _split(plan) and "hot" in reasons
    assert reasons["hot"] == "balance"  # it alone costs more than half a device's even share
    sim = Simulator(HOT, 4, shipped_models)
    alone = dict(zip([t.name for t in HOT], sim.single_costs_ms(whole_pieces(HOT))))
    for name, reason in reasons.items():  # none is larger than a device: the search chose every split
        assert reason == ("balance" if alone[name] > HALF_HEAVY_SHARE * sim.balanced_bound_ms() else "cost")


def test_greedy_baselines_split_only_for_memory(analytic_models):
    plan = search_plan(HOT, 4, "1GiB", algorithm="size-lookup", cost_models=analytic_models)
    assert not _split(plan) and "splits" not in plan.provenance  # no split: no field, as before
    tight = search_plan(HOT, 4, "12MiB", algorithm="size-lookup", cost_models=analytic_models)
    assert _split(tight) and set(tight.provenance["splits"].values()) == {"memory"}


def test_a_plan_without_reasons_says_so(analytic_models):
    plan = search_plan(HOT, 4, "12MiB", algorithm="size", cost_models=analytic_models)
    del plan.provenance["splits"]  # as a plan written before reasons were recorded
    text = plan.format_splits()
    assert text.startswith("why tables are split:\n  not recorded: ")


@pytest.mark.parametrize("algorithm", ["size", "neuroshard"])
def test_every_split_table_has_a_known_reason(analytic_models, algorithm):
    plan = search_plan(HOT, 8, "8MiB", algorithm=algorithm, cost_models=analytic_models)
    assert set(plan.provenance.get("splits", {})) == _split(plan)
    assert set(plan.provenance.get("splits", {}).values()) <= set(SPLIT_REASONS)
