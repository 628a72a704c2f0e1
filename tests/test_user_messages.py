"""What a user is told: a neuroshard file of another kind named as what it is, a misspelt
required key with its did-you-mean, the CPU batch warning of ``train``/``evaluate``, and
TorchRec's planner under its time limit (progress counted, one warning when it gives up)."""
from __future__ import annotations

import argparse
import json
import logging

import pytest

from neuroshard.errors import FormatError
from neuroshard.tables import TableSet
from neuroshard.validate import check_format

TABLES = {"format": "neuroshard.tables/v1", "name": "m", "batch_size": 4096,
          "tables": [{"name": "a", "num_embeddings": 1000, "embedding_dim": 16, "pooling_factor": 1.0}]}


def test_another_neuroshard_file_is_named_as_what_it_is(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"format": "neuroshard.plan/v1", "num_devices": 2}))
    with pytest.raises(FormatError, match=r"plan.json: this is a plan \(neuroshard.plan/v1\), not a tables file: "
                                          r"give a tables file \(neuroshard tables generate writes one"):
        TableSet.read(plan)
    with pytest.raises(FormatError, match=r"^t.json: this is a tables file \(neuroshard.tables/v1\), not a plan: "
                                          r"give a plan file \(neuroshard search writes one\)$"):
        check_format(TABLES, "neuroshard.plan/v1", "t.json")
    # another version of the same file, or something else, quotes what this version reads
    with pytest.raises(FormatError, match="field 'format' is 'neuroshard.tables/v9'; this version of neuroshard "
                                          "reads 'neuroshard.tables/v1'"):
        TableSet.from_dict({**TABLES, "format": "neuroshard.tables/v9"})
    with pytest.raises(FormatError, match="field 'format' is 'x'; this version"):
        check_format({"format": "x"}, "neuroshard.plan/v1", "p.json")
    check_format({}, "neuroshard.topology/v1", "topo.json", optional=True)  # optional: absent is fine
    with pytest.raises(FormatError, match="field 'format' is missing; this version of neuroshard reads"):
        TableSet.from_dict({k: v for k, v in TABLES.items() if k != "format"})


@pytest.mark.parametrize("edit,message", [
    (lambda d: d["tables"][0].update(num_embedding=d["tables"][0].pop("num_embeddings")),
     "table #0 'a': field 'num_embeddings' is missing (the table has 'num_embedding': did you mean "
     "'num_embeddings'?)"),
    (lambda d: d["tables"][0].update(embeding_dim=d["tables"][0].pop("embedding_dim")),
     "field 'embedding_dim' is missing (the table has 'embeding_dim': did you mean 'embedding_dim'?)"),
    (lambda d: d["tables"][0].update(nmae=d["tables"][0].pop("name")),
     "table #0: field 'name' is missing (the table has 'nmae': did you mean 'name'?)"),
    (lambda d: d.update(table=d.pop("tables")), "field 'tables' is missing (the file has 'table': did you mean "
                                                 "'tables'?)"),
    (lambda d: d.update(fromat=d.pop("format")), "field 'format' is missing (the file has 'fromat': did you mean "
                                                 "'format'?)"),
    (lambda d: d["tables"][0].pop("pooling_factor"), "table #0 'a': field 'pooling_factor' is missing$"),
])
def test_a_misspelt_required_key_gets_a_did_you_mean(edit, message):
    data = json.loads(json.dumps(TABLES))
    edit(data)
    with pytest.raises(FormatError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        TableSet.from_dict(data, source="t.json")


def test_train_warns_once_about_a_big_batch_on_cpu(caplog, monkeypatch):
    from neuroshard.runtime import cli
    monkeypatch.delenv("RANK", raising=False)
    args = argparse.Namespace(batch_size=None, dist_backend="gloo")
    with caplog.at_level(logging.WARNING, logger="neuroshard"):
        cli._warn_slow_cpu_batch(args, 65_536)
        cli._warn_slow_cpu_batch(argparse.Namespace(batch_size=65_536, dist_backend="gloo"), 65_536)  # asked for
        cli._warn_slow_cpu_batch(args, cli.CPU_QUICK_BATCH)  # quick enough
        cli._warn_slow_cpu_batch(argparse.Namespace(batch_size=None, dist_backend="nccl"), 65_536)  # GPUs
        monkeypatch.setenv("RANK", "1")
        monkeypatch.setenv("WORLD_SIZE", "2")
        cli._warn_slow_cpu_batch(args, 65_536)  # under torchrun, rank 0 says it
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["batch 65,536 on CPU: a step takes seconds; --batch-size 4,096 for a quicker run"]


class _Clock:
    """TorchRec's planner clock, one second further at every reading."""

    def __init__(self):
        self.now = 0.0

    def time(self) -> float:
        self.now += 1.0
        return self.now


@pytest.mark.torchrec
def test_torchrec_planner_gives_up_at_its_time_limit_and_says_so(monkeypatch, caplog):
    pytest.importorskip("torchrec")
    from torchrec.distributed.planner import planners

    from neuroshard.costmodels.loading import analytic_cost_models
    from neuroshard.search.simulator import Simulator
    from neuroshard.tables import Table
    from neuroshard.torchrec import baseline

    tables = TableSet("m", [Table(f"t{i}", 1000 * (i + 1), 16, 1.0 + i) for i in range(6)], 512)
    sim = Simulator(tables, 2, analytic_cost_models())
    whole = baseline.search(sim, 2**30, "cpu", timeout_s=0)  # no limit: every proposal
    assert not whole.details["torchrec_planner"]["timed_out"] and whole.details["parameters"]["timeout_s"] == 0
    monkeypatch.setattr(planners, "time", _Clock())  # every proposal takes a second
    with caplog.at_level(logging.INFO, logger="neuroshard"):
        cut = baseline.search(sim, 2**30, "cpu", timeout_s=3)
    record = cut.details["torchrec_planner"]
    assert record["timed_out"] and 1 <= record["proposals"] < whole.details["torchrec_planner"]["proposals"]
    gave_up = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(gave_up) == 1 and gave_up[0].startswith("TorchRec's planner gave up at its time limit of 3 s")
    assert any(r.getMessage().startswith("TorchRec's planner: 6 tables on 2 devices") for r in caplog.records)
    assert sorted({p.table for p in cut.pieces}) == list(range(6))  # its best plan so far, whole


@pytest.mark.torchrec
def test_torchrec_planner_time_limit_is_checked():
    pytest.importorskip("torchrec")
    from neuroshard.costmodels.loading import analytic_cost_models
    from neuroshard.errors import NeuroShardError
    from neuroshard.search.params import TorchRecParams
    from neuroshard.search.simulator import Simulator
    from neuroshard.tables import Table
    from neuroshard.torchrec import baseline

    sim = Simulator(TableSet("m", [Table("t", 100, 8, 1.0)], 64), 2, analytic_cost_models())
    params = TorchRecParams()
    params.timeout_s = -1  # as a bad --param timeout_s=-1 would arrive
    with pytest.raises(NeuroShardError, match="parameter timeout_s must be seconds, 0 or more, got -1"):
        baseline._search(sim, 2**20, params, 0)
