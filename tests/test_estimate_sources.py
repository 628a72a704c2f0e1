"""An estimate says what it mixes: every estimate line names the source of each term
(compute: which cost model, from where, measured on which hardware; the exchange: measured
with it, or analytic over which links) and warns once when the terms describe different
machines, or when the batch is far from the one the models were measured at."""
from __future__ import annotations

import copy
import json
import shutil

import pytest

from neuroshard.cli import main
from neuroshard.costmodels.loading import DEFAULT_CHECKPOINT, this_machine_name
from neuroshard.plan import FAR_BATCH_FACTOR, Plan
from neuroshard.search.api import search_plan
from neuroshard.tables import Table, TableSet

TABLES = TableSet("sources", [Table(f"t{i}", 2000 * (i + 1), 16, pooling_factor=2.0) for i in range(6)],
                  batch_size=4096)
MIXED = "warning: the terms describe different machines"
FAR = "its linear scaling is an extrapolation that far"


@pytest.fixture
def tables_path(tmp_path):
    path = tmp_path / "tables.json"
    TABLES.write(path)
    return path


def _search(capsys, *args: str) -> tuple[str, Plan]:
    out = args[args.index("-o") + 1]
    assert main(["search", *args]) == 0, capsys.readouterr().err
    return capsys.readouterr().out, Plan.read(out)


@pytest.mark.skipif(not DEFAULT_CHECKPOINT.exists(), reason="no shipped checkpoint in this tree")
def test_shipped_model_with_analytic_links_warns_of_mixed_hardware(tables_path, tmp_path, capsys):
    out, plan = _search(capsys, str(tables_path), "-d", "4", "-m", "1GiB", "--local-world-size", "2",
                        "-o", str(tmp_path / "plan.json"))
    hardware = plan.provenance["cost_model_hardware"]
    assert "compute by cost model 'cpu-default' (shipped with neuroshard), measured on " + hardware in out
    assert "exchange analytic: bytes over the stated links (2 devices per host" in out
    assert out.count(MIXED) == 1  # once, naming both machines
    warning = next(line for line in out.splitlines() if MIXED in line)
    assert hardware in warning and "the stated links (2 devices per host" in warning
    assert main(["plan", "show", str(tmp_path / "plan.json")]) == 0  # plan show says the same
    assert capsys.readouterr().out.count(MIXED) == 1


@pytest.mark.skipif(not DEFAULT_CHECKPOINT.exists(), reason="no shipped checkpoint in this tree")
def test_shipped_model_with_its_measured_exchange_is_one_machine(tables_path, tmp_path, capsys):
    out, plan = _search(capsys, str(tables_path), "-d", "2", "-m", "1GiB", "-o", str(tmp_path / "plan.json"))
    assert plan.provenance["comm_model"].startswith("measured")
    assert "measured with the compute on the same hardware" in out
    assert "an estimate for that hardware, not yours until calibrated or measured there" in out
    assert MIXED not in out and FAR not in out  # the tables' batch is the models' own


def test_model_pretrained_here_reads_as_this_machine(shipped_models):
    here = copy.copy(shipped_models)
    here.name, here.path = this_machine_name("0123456789abcdef"), None  # as load_cost_models names it
    lines = search_plan(TABLES, 2, "1GiB", cost_models=here).estimate_sources()
    assert lines[0].startswith("compute by cost model 'this machine (01234567)' (pre-trained on this machine)")
    assert "an estimate for this machine" in lines
    linked = search_plan(TABLES, 4, "1GiB", cost_models=here, topology={"local_world_size": 2}).format_summary()
    assert "an estimate for this machine over the links above" in linked and MIXED not in linked


@pytest.mark.skipif(not DEFAULT_CHECKPOINT.exists(), reason="no shipped checkpoint in this tree")
def test_a_users_cost_model_is_named_by_its_file(tables_path, tmp_path, capsys):
    mine = tmp_path / "my-model.pt"
    shutil.copyfile(DEFAULT_CHECKPOINT, mine)
    out, _ = _search(capsys, str(tables_path), "-d", "2", "-m", "1GiB", "--cost-model", str(mine),
                     "-o", str(tmp_path / "plan.json"))
    assert f"compute by cost model 'cpu-default' (from {mine})" in out


def test_unfitted_defaults_describe_no_machine_and_never_warn_of_mixing(analytic_models):
    plan = search_plan(TABLES, 4, "1GiB", cost_models=analytic_models, topology={"local_world_size": 2})
    lines = plan.estimate_sources()
    assert lines[0].startswith("compute by cost model 'analytic-defaults' (unfitted analytic defaults) at batch")
    assert "an estimate from unfitted defaults, for no machine in particular" in lines
    assert not any(MIXED in line for line in lines)


@pytest.mark.parametrize("factor,warned", [(FAR_BATCH_FACTOR, False), (2 * FAR_BATCH_FACTOR, True),
                                           (1 / FAR_BATCH_FACTOR, False), (1 / (2 * FAR_BATCH_FACTOR), True)])
def test_a_batch_far_from_the_models_is_warned_about(shipped_models, factor, warned):
    batch = int(shipped_models.batch_size * factor)
    text = search_plan(TABLES.at_batch(batch), 2, "1GiB", cost_models=shipped_models).format_summary()
    assert (text.count(FAR) == 1) == warned, text
    if warned:
        assert f"batch {batch:,} is {factor:.3g}x the batch the cost model was measured at" in text


def test_a_rescored_plan_names_the_scoring_model_only(shipped_models, analytic_models):
    from neuroshard.search.score import score_plan
    plan = search_plan(TABLES, 2, "1GiB", cost_models=shipped_models)
    lines = score_plan(plan, TABLES, analytic_models).estimate_sources()
    assert lines == ["by cost model 'analytic-defaults' (scored after the search: its hardware is not in the plan)"]


def test_a_plan_without_a_cost_model_says_nothing_of_sources():
    """An imported TorchRec plan has no cost model in its provenance: no source lines."""
    from neuroshard.plan import Shard
    plan = Plan([Table("t", 100, 8, 1.0)], [Shard("t", 0, 100, 0, 8, 0)], 1, 10**6)
    assert plan.estimate_sources() == []
