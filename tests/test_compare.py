"""``neuroshard compare``: our plan and TorchRec's (or a baseline's) for the same task, timed
together on this machine by ``measure``'s instrument, ours twice as an A/A control."""
from __future__ import annotations

import pytest

from neuroshard.cli import main
from neuroshard.runtime.compare import AGAIN, OURS, compare
from neuroshard.tables import Table, TableSet

TINY = TableSet("tiny", [Table(f"t{i}", 200 * (i + 1), 8, 1.0) for i in range(3)], 4096)
QUICK = dict(passes=1, repeats=1, batch_size=256, min_pass_ms=0.0, max_repeats=1, reference=False, huge_pages=False)


def _check(result, against: str) -> None:
    names = [p.name for p in result.result.plans]
    assert names == [OURS, against, AGAIN]  # one interleaved run, ours twice
    ours, theirs = result.result[OURS], result.result[against]
    assert result.ratio == pytest.approx(theirs.max_compute_ms / ours.max_compute_ms)
    assert result.control == pytest.approx(abs(result.result[AGAIN].max_compute_ms - ours.max_compute_ms)
                                           / min(ours.max_compute_ms, result.result[AGAIN].max_compute_ms))
    text = result.format()
    assert f"{against} / ours = {result.ratio:.3f}" in text and "A/A control: our plan measured twice" in text
    assert result.to_dict()["ratio"] == result.ratio


@pytest.mark.timing
@pytest.mark.torchrec
def test_ours_against_torchrecs_plan_timed_here(analytic_models):
    pytest.importorskip("torchrec.distributed.planner")
    result = compare(TINY, 2, "1GiB", "torchrec", cost_models=analytic_models, **QUICK)
    assert result.theirs.provenance["algorithm"] == "torchrec"
    _check(result, "torchrec")


@pytest.mark.timing
def test_ours_against_a_greedy_baseline(analytic_models):
    result = compare(TINY, 2, "1GiB", "size-lookup", cost_models=analytic_models, **QUICK)
    _check(result, "size-lookup")


def test_compare_refuses_in_one_line_before_any_work(tmp_path, capsys):
    tables = tmp_path / "tiny.json"
    TINY.write(tables)
    assert main(["compare", str(tables), "-d", "2", "-m", "1GiB", "--against", "neuroshard"]) == 2  # not itself
    assert "invalid choice" in capsys.readouterr().err
    (tmp_path / "out").mkdir()
    assert main(["compare", str(tables), "-d", "2", "-m", "1GiB", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "comparison file is a folder" in err[0]
