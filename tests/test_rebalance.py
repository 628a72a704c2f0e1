"""Rebalancing a timed plan against marginal costs fitted to timing runs (``measured.rebalance``),
on the fake hardware of ``test_measured_loop`` (whose costs the test knows) and through refine."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from test_measured_loop import TABLES, FakeTimer, _calibration, device_ms

from neuroshard.costmodels import load_cost_models
from neuroshard.measured.rebalance import (
    EVEN_SLACK,
    REBALANCE_MIN_GAIN,
    REBALANCE_SHORT,
    MarginalCosts,
    anchor_weight,
    fit_marginal_costs,
    rebalance,
    rebalance_cuts,
    repack,
    run_noise_var,
    split_hot,
)
from neuroshard.measured.refine import (HOW_KEPT, REBALANCE_ROUNDS, SPLIT_REPACK_VARIANTS, _less_work_wins,
                                        refine)
from neuroshard.search.api import search_plan
from neuroshard.search.simulator import Simulator
from neuroshard.tables import Table, TableSet
from neuroshard.topology import Topology
from neuroshard.types import Piece


def _alone(pieces):
    """A stand-in for the models' alone-costs: rows x columns, in ms."""
    return np.array([1e-6 * p.num_rows * p.num_cols for p in pieces])


def _size_plan():
    """size's plan of TABLES on 3 devices of one host, its devices timed by the fake hardware, its
    simulator and the marginal costs fitted to those devices. One host: the all-to-all over its
    links is cheap, so the rebalance moves compute; over the measured loopback model the
    all-to-all (6 ms against 0.2 ms of compute here) decided, and which move it preferred turned
    on the comm model's last digits, which differ between CPUs (CI failed on one)."""
    models = load_cost_models()
    plan = search_plan(TABLES, 3, "64MiB", algorithm="size", cost_models=models,
                       topology=Topology(3, local_world_size=3))
    measured = np.array([device_ms(plan.shards_on(d), TABLES) for d in range(3)])
    sim = Simulator.from_plan(plan, models, TABLES, 4096)
    return plan, measured, sim, fit_marginal_costs(sim.device_sets(plan), measured, _alone, len(TABLES))



def _round_choice(timed: list[dict]) -> int:
    """Which plan of one rebalance round's run the rule keeps (0: the plan kept before), from the round's
    records: each candidate's measured cost and total, the plan it was timed against and the reference's total
    (formats revision 31)."""
    others = tuple(p["reference_total_compute_ms"] for p in timed[:1] if "reference_total_compute_ms" in p)
    return _less_work_wins([(timed[0]["against_ms"], 0, timed[0]["against_total_compute_ms"])]
                           + [(p["measured_cost_ms"], k, p["measured_total_compute_ms"])
                              for k, p in enumerate(timed, start=1)], others=others)

def test_marginal_costs_recover_each_tables_factor_from_additive_devices():
    rng = np.random.default_rng(0)
    pieces = [Piece(t, 0, TABLES[t].num_embeddings, 0, TABLES[t].embedding_dim) for t in range(len(TABLES))]
    truth = 1.0 + 0.5 * rng.random(len(TABLES))  # each table's factor on its alone-cost
    sets = [[pieces[i] for i in rng.choice(len(pieces), size=rng.integers(2, 5), replace=False)] for _ in range(40)]
    times = np.array([0.3 + sum(_alone([p])[0] * truth[p.table] for p in s) for s in sets])
    costs = fit_marginal_costs(sets, times, _alone, len(TABLES), ridge=1e-8)
    assert costs.fit_error_ < 1e-4 and costs.level_ms_ == pytest.approx(0.3, rel=1e-3)
    assert np.allclose(costs.factor_, truth, rtol=1e-3)
    # a strong ridge pulls every factor to the shared one; the fit then misses the devices
    pooled = fit_marginal_costs(sets, times, _alone, len(TABLES), ridge=1e6)
    assert np.ptp(pooled.factor_) < 0.05 * pooled.shared_ and pooled.fit_error_ > costs.fit_error_


def test_rebalance_moves_work_off_the_slowest_measured_device_and_keeps_memory():
    plan, measured, sim, costs = _size_plan()
    moved, record = rebalance(plan, measured, costs, sim, _alone)
    assert moved is not None and record["changes"] >= 1 and not moved.problems()
    assert record["estimated_cost_after_ms"] < record["estimated_cost_before_ms"]
    # the anchored estimate is what the fake hardware says for a device that only lost work
    after = np.array([device_ms(moved.shards_on(d), TABLES) for d in range(3)])
    assert after.max() < measured.max()
    assert sorted((s.table, s.row_offset, s.col_offset) for s in moved.shards) == sorted(
        (s.table, s.row_offset, s.col_offset) for s in plan.shards)  # the same shards, other devices
    # cut after one change: the first step of the same greedy walk, estimated no better than the whole
    cut, short = rebalance(plan, measured, costs, sim, _alone, max_changes=1)
    assert cut is not None and short["changes"] == 1 and short["cut_after"] == 1 and "cut_after" not in record
    assert record["estimated_cost_after_ms"] <= short["estimated_cost_after_ms"] < short["estimated_cost_before_ms"]
    if record["changes"] == 1:
        assert cut.layout_key() == moved.layout_key()
    # one walk gives the full rebalance and its cuts: the same plans and records as walked apart
    walked = rebalance_cuts(plan, measured, costs, sim, _alone, cuts=(1, 99))
    assert walked[0][1] == record and walked[0][0].layout_key() == moved.layout_key()
    if record["changes"] > 1:
        assert len(walked) == 2 and walked[1][1] == short and walked[1][0].layout_key() == cut.layout_key()
    else:
        assert len(walked) == 1
    # nothing to gain: a plan measured perfectly even is left alone
    even, record = rebalance(plan, np.full(3, measured.mean()), costs, sim, _alone, min_gain=0.5)
    assert even is None and record["changes"] == 0


def test_one_runs_noise_is_pooled_from_plans_timed_again_and_shrinks_the_anchor():
    rng = np.random.default_rng(1)
    truth = rng.uniform(5.0, 40.0, size=(6, 8))  # six plans' devices, each timed in three runs, 3% noise
    repeats = [t * (1 + 0.03 * rng.standard_normal((3, 8))) for t in truth]
    assert run_noise_var(repeats) == pytest.approx(0.03 ** 2, rel=0.3)
    assert run_noise_var([t[None, :] for t in truth]) is None  # no plan timed twice: nothing to say
    costs = MarginalCosts(np.ones(3), 1.0, 0.5, 0.04, 30, residual_var_=0.05 ** 2)
    # the fit's residuals (5%) are single runs' devices: 3% of them is the run's noise, 4% the sets' own
    assert anchor_weight(costs, 0.03 ** 2) == pytest.approx(0.04 ** 2 / (0.04 ** 2 + 0.03 ** 2))
    assert anchor_weight(costs, 0.03 ** 2, runs=3) > anchor_weight(costs, 0.03 ** 2)
    assert anchor_weight(costs, None) == 1.0 and anchor_weight(costs, 0.06 ** 2) == 0.0


def test_a_noisy_anchor_is_estimated_from_the_fitted_costs():
    plan, measured, sim, costs = _size_plan()
    _, trusted = rebalance(plan, measured, costs, sim, _alone)
    assert "anchor_weight" not in trusted
    # one device 30% slow in this run: trusted whole, the estimate says so; all noise, it does not
    slow = measured * np.array([1.3, 1.0, 1.0])
    _, loud = rebalance(plan, slow, costs, sim, _alone)
    _, shrunk = rebalance(plan, slow, costs, sim, _alone, noise_var=1.0)
    _, fitted = rebalance(plan, measured, costs, sim, _alone, noise_var=1.0)
    assert shrunk["anchor_weight"] == 0.0
    assert shrunk["estimated_cost_before_ms"] == fitted["estimated_cost_before_ms"]
    assert loud["estimated_cost_before_ms"] > trusted["estimated_cost_before_ms"]


def test_repack_places_whole_tables_by_the_fitted_costs_and_keeps_row_blocks():
    plan, measured, sim, costs = _size_plan()
    packed, record = repack(plan, costs, sim, _alone)
    assert record["repacked"] and "rejected" not in record
    if packed is None:  # the fit prefers no other placement
        assert record["estimated_cost_after_ms"] > record["estimated_cost_before_ms"] * (1 - REBALANCE_MIN_GAIN)
    else:
        assert not packed.problems() and record["estimated_cost_after_ms"] < record["estimated_cost_before_ms"]
        assert sorted((s.table, s.row_offset, s.col_offset) for s in packed.shards) == sorted(
            (s.table, s.row_offset, s.col_offset) for s in plan.shards)
        blocks = {(s.table, s.row_offset): s.device for s in plan.shards if s.num_rows < TABLES[s.table].num_embeddings}
        assert all(blocks[(s.table, s.row_offset)] == s.device for s in packed.shards
                   if (s.table, s.row_offset) in blocks)
    # the three biggest tables crowded onto one device: the fit places them apart again
    big = {"t7": 0, "t8": 0, "t9": 0, "t0": 1, "t1": 1}
    skewed = replace(plan, shards=[replace(s, device=big.get(s.table, 2)) for s in plan.shards])
    spread, record = repack(skewed, costs, sim, _alone)
    assert spread is not None and not spread.problems() and record["changes"] >= 0
    assert record["estimated_cost_after_ms"] < record["estimated_cost_before_ms"]
    assert len({s.device for s in spread.shards if s.table in ("t7", "t8", "t9")}) > 1


def test_even_repack_caps_every_device_at_its_share_of_pieces_and_keeps_the_counts_when_it_swaps():
    plan, _measured, sim, costs = _size_plan()
    pieces, _ = sim.pieces_of_plan(plan)
    cap = -(-len(pieces) // 3)
    # most tables crowded onto one device: an even repack spreads them, as many on every device
    crowded = replace(plan, shards=[replace(s, device=0 if s.table not in ("t7", "t8") else
                                            (1 if s.table == "t7" else 2)) for s in plan.shards])
    assert not crowded.problems()
    packed, record = repack(crowded, costs, sim, _alone, even=True)
    assert record["repacked"] and record["even"] and "rejected" not in record
    assert packed is not None and not packed.problems()
    counts = np.bincount([s.device for s in packed.shards], minlength=3)
    assert counts.max() <= cap and counts.sum() == len(pieces)
    assert record["estimated_cost_after_ms"] <= record["estimated_cost_before_ms"] * (1 + EVEN_SLACK)
    # the plan repacked evenly again: its counts are already even, nothing to time
    again, record = repack(packed, costs, sim, _alone, even=True)
    assert again is None and record["rejected"] == "even already"
    # a rebalance by swaps only keeps every device's count
    swapped, _ = rebalance(crowded, costs.devices_ms(sim.pieces_of_plan(crowded)[1],
                                                     costs.piece_ms(pieces, _alone(pieces)), 3),
                           costs, sim, _alone, swaps_only=True)
    before = np.bincount([s.device for s in crowded.shards], minlength=3)
    if swapped is not None:
        assert (np.bincount([s.device for s in swapped.shards], minlength=3) == before).all()


@pytest.mark.parametrize("row_blocks", ["torchrec", "any"])
def test_split_hot_cuts_the_slowest_devices_dearest_table_into_row_blocks_and_keeps_the_rest(row_blocks):
    models = load_cost_models()
    # t8 (the dearest by alone-cost) alone on device 0, far dearer than the others' devices: no move of a
    # whole table lightens it
    base = search_plan(TABLES, 3, "64MiB", algorithm="size", cost_models=models,
                       topology=Topology(3, local_world_size=3),
                       row_blocks=row_blocks)
    whole = [s for s in base.shards if s.num_rows == TABLES[s.table].num_embeddings]
    assert len(whole) == len(base.shards)
    plan = replace(base, shards=[replace(s, device=0 if s.table == "t8" else 1 + int(s.table[1:]) % 2)
                                 for s in base.shards])
    assert not plan.problems()
    sim = Simulator.from_plan(plan, models, TABLES, 4096)
    costs = MarginalCosts(np.ones(len(TABLES)), 1.0, 0.0, 0.0, 3)  # each piece costs its alone-cost
    pieces, where = sim.pieces_of_plan(plan)
    measured = costs.devices_ms(where, _alone(pieces), 3)
    measured[0] = 2.0 * measured[1:].max()  # the hot table's device is the slowest by far
    out, record = split_hot(plan, measured, costs, sim, _alone)
    assert record["split"] == "t8" and "rejected" not in record, record
    assert out is not None and not out.problems()
    blocks = sorted((s.row_offset, s.device) for s in out.shards if s.table == "t8")
    assert len(blocks) == record["blocks"] == (2 if row_blocks == "any" else 3)
    assert len({d for _, d in blocks}) == len(blocks)
    assert [d for _, d in blocks] == sorted(d for _, d in blocks)  # rank order
    assert sum(s.num_rows for s in out.shards if s.table == "t8") == TABLES["t8"].num_embeddings
    assert out.row_blocks == row_blocks
    assert record["estimated_cost_after_ms"] < record["estimated_cost_before_ms"]
    # the plan's other tables stay where they were, but for the rebalance's changes after the split
    was = {s.table: s.device for s in plan.shards}
    moved = {s.table for s in out.shards if s.table != "t8" and s.device != was[s.table]}
    assert len(moved) <= 2 * record["changes"]
    if row_blocks == "torchrec":  # the search's row_blocks over the plan's own: two blocks, and the plan says so
        out, record = split_hot(plan, measured, costs, sim, _alone, row_blocks="any")
        assert record["blocks"] == 2 and out is not None and out.row_blocks == "any" and not out.problems()



def test_split_hot_repacked_cuts_the_hot_table_where_memory_only_fits_the_big_tables_paired_afresh():
    """Criteo-terabyte's shape at 4 devices (session 38): six big tables fill a device two at a
    time and the hot table is alone on the slowest device. Its row halves fit beside no device of
    the plan as it is, but do with the big tables packed afresh around them."""
    models = load_cost_models()
    tables = TableSet("tight", [Table("h", 6_600, 64, 40.0, {"zipf_alpha": 0.9})]
                      + [Table(f"b{i}", 10_000, 64, 2.0, {"zipf_alpha": 0.9}) for i in range(6)]
                      + [Table(f"s{i}", 100, 8, 1.0, {"zipf_alpha": 0.9}) for i in range(4)], 4096)
    big = int(Simulator.from_plan(search_plan(tables, 4, "1GiB", algorithm="size", cost_models=models), models, tables,
                                  4096).sizes_bytes([Piece(1, 0, 10_000, 0, 64)])[0])
    memory = int(2.1 * big)
    base = search_plan(tables, 4, memory, algorithm="size", cost_models=models,
                       topology=Topology(4, local_world_size=4),
                       row_blocks="any")
    assert all(s.num_rows == tables[s.table].num_embeddings for s in base.shards)
    device = {"h": 0, "b0": 1, "b1": 1, "b2": 2, "b3": 2, "b4": 3, "b5": 3}
    plan = replace(base, shards=[replace(s, device=device.get(s.table, 0)) for s in base.shards])
    assert not plan.problems()
    sim = Simulator.from_plan(plan, models, tables, 4096)
    costs = MarginalCosts(np.ones(len(tables)), 1.0, 0.0, 0.0, 4)
    pieces, where = sim.pieces_of_plan(plan)
    measured = costs.devices_ms(where, _alone(pieces), 4)
    measured[0] = 2.0 * measured[1:].max()  # the hot table's device the slowest by far
    out, record = split_hot(plan, measured, costs, sim, _alone)
    assert out is None and record["split"] == "h" and record["rejected"] == "memory"
    out, record = split_hot(plan, measured, costs, sim, _alone, repack=True)
    assert record["split"] == "h" and record["repacked"] and "rejected" not in record, record
    assert out is not None and not out.problems() and out.row_blocks == "any"
    blocks = sorted((s.row_offset, s.device) for s in out.shards if s.table == "h")
    assert len(blocks) == record["blocks"] == 2 and blocks[0][1] < blocks[1][1]
    assert sum(s.num_rows for s in out.shards if s.table == "h") == tables["h"].num_embeddings
    # two big tables share a device only where no block of the hot table is
    with_blocks = {d for _, d in blocks}
    bigs = np.bincount([s.device for s in out.shards if s.table.startswith("b")], minlength=4)
    assert all(bigs[d] <= 1 for d in with_blocks) and bigs.sum() == 6
    assert record["estimated_cost_after_ms"] < record["estimated_cost_before_ms"]


class HotRowsTimer(FakeTimer):
    """The fake hardware with three tables dearer than any model of the others says (rows
    that miss the cache): refine's plans put them where the models think they are cheap."""

    def __call__(self, devices, tables, passes=1, **options):
        self.calls += 1
        self.devices_timed += sum(1 for d in devices if d)
        extra = [sum(1e-5 * s.num_rows for s in d if s.table in ("t0", "t1", "t2")) for d in devices]
        return ([[device_ms(d, tables) + e] * passes if d else [] for d, e in zip(devices, extra)],
                {"hardware": "fake", "kernel": "fake", "passes": passes})


@pytest.mark.parametrize("timer, compare, force_lean, short", [(FakeTimer, ("size", "lookup"), True, REBALANCE_SHORT),
                                                               (HotRowsTimer, ("size",), False, 1)])
def test_refine_times_the_rebalanced_plans_against_the_chosen_one_and_keeps_the_cheaper(monkeypatch, timer, compare,
                                                                                        force_lean, short):
    """Refine rebalances the plan it chose and the plan of least work and times them together.
    On the plain fake hardware the least-work rule is forced onto the dearest plan timed other than
    the chosen one (the chosen may itself be the dearest when a tie went to less work, as the
    calibrated model's plans fall on some CPUs), so a rebalanced lean plan exists; on the hot-rows hardware the least-work plan is size's, rebalanced
    (2 changes: with the cut at 1 change, timed cut too) and kept."""
    import neuroshard.measured.choice as choice_module
    from neuroshard.measured.config import RefineConfig
    if force_lean:
        monkeypatch.setattr(choice_module, "lean_candidate",
                            lambda finals, best, *rules: max((f for f in finals if f[1] != best),
                                                             key=lambda f: f[0])[1])
    calibration = _calibration(timer())
    plan = refine(TABLES, 3, "64MiB", calibration, rounds=0 if timer is HotRowsTimer else 1, compare=compare,
                  polish_steps=0, config=RefineConfig(rebalance_short=short))
    record = plan.provenance["refine"]
    rebalanced = record["rebalance"]
    assert rebalanced["fit"]["sets"] >= 3 * 2
    froms = [p["from"] for p in rebalanced["plans"] if p["round"] == 1 and "cut_after" not in p
             and not p.get("repacked") and "split" not in p]
    # the chosen plan, the lean plan (when there is one) and the comparison run's plan of least work (when it
    # saves 1% of the chosen plan's; formats revision 31), each once
    assert 1 <= len(froms) <= 3 and len(set(froms)) == len(froms) and froms[0] == rebalanced["plans"][0]["from"]
    if force_lean:
        assert len(froms) >= 2
    # every start's slowest device's dearest table cut into row blocks too, in round 1 only (formats revision 29)
    # (formats revision 29), and cut so with the rest placed afresh by the fitted costs (revision 30)
    splits = [p for p in rebalanced["plans"] if "split" in p and not p.get("repacked")]
    assert [p["from"] for p in splits] == froms and all(p["round"] == 1 for p in splits)
    split_packed = [p for p in rebalanced["plans"] if "split" in p and p.get("repacked")]
    assert [p["from"] for p in split_packed] == [f for f in froms for _ in range(SPLIT_REPACK_VARIANTS)]
    assert all(p["round"] == 1 for p in split_packed)
    assert [p.get("variant", 0) for p in split_packed] == list(range(SPLIT_REPACK_VARIANTS)) * len(froms)
    # the chosen plan's whole tables placed afresh by the fitted costs too, in round 1 only
    # (as they come, and evenly: as many pieces on every device, formats revision 29)
    repacked = [p for p in rebalanced["plans"] if p.get("repacked") and "split" not in p]
    assert len(repacked) == 2 and all(p["round"] == 1 and p["from"] == froms[0] for p in repacked)
    assert [bool(p.get("even")) for p in repacked] == [False, True]
    # a rebalance of many changes is timed cut after its first ones too (formats revision 26)
    cuts = 0
    for k, p in enumerate(rebalanced["plans"]):
        if p["changes"] > short and "cut_after" not in p:
            cut = rebalanced["plans"][k + 1]
            assert cut["from"] == p["from"] and cut["cut_after"] == cut["changes"] == short
            assert cut["estimated_cost_after_ms"] >= p["estimated_cost_after_ms"] and "measured_cost_ms" in cut
            cuts += 1
    assert cuts == sum(1 for p in rebalanced["plans"] if "cut_after" in p)
    if timer is HotRowsTimer:
        assert cuts >= 1
    # (a repacked or split plan the fit does not prefer is recorded, not timed)
    assert all(p["estimated_cost_after_ms"] <= p["estimated_cost_before_ms"] for p in rebalanced["plans"]
               if not p.get("even") and ((not p.get("repacked") and "split" not in p) or "measured_cost_ms" in p))
    assert all(p["estimated_cost_after_ms"] <= p["estimated_cost_before_ms"] * (1 + EVEN_SLACK)
               for p in rebalanced["plans"] if p.get("even") and "measured_cost_ms" in p)
    # the finalists were timed in several runs: their noise shrinks every anchor (formats revision 27)
    assert rebalanced["fit"]["run_noise"] >= 0.0
    assert all(0.0 <= p["anchor_weight"] <= 1.0 for p in rebalanced["plans"] if not p.get("repacked"))
    timed = [p for p in rebalanced["plans"] if "measured_cost_ms" in p]
    assert timed and all((p["changes"] >= 1 or p.get("repacked") or p.get("split")) and p["against_ms"] > 0
                         for p in timed)
    # the comparison run's least-work plan timed beside the rounds where it is not the plan kept (revision 31)
    referenced = [p for p in timed if "reference_total_compute_ms" in p]
    assert ("reference" in rebalanced) == bool(referenced) and all(p["reference_total_compute_ms"] > 0
                                                                   for p in referenced)
    assert all(p["against_total_compute_ms"] > 0 for p in timed)
    rounds = sorted({p["round"] for p in rebalanced["plans"]})
    assert rounds == list(range(1, len(rounds) + 1)) and len(rounds) <= REBALANCE_ROUNDS
    confirm = rebalanced.get("confirm")
    if confirm is not None:  # the plan the rounds kept, timed again beside the chosen one in fresh runs
        chosen_ms, rebalanced_ms = confirm["measured_cost_ms"]
        chosen_total, rebalanced_total = confirm["measured_total_compute_ms"]
        # cheaper, or a tie on the slowest device (TIE_MARGIN) with less total work (formats revision 30), work beyond
        # WORK_ALLOWANCE over the least total of the run (the reference's too) priced (revision 31)
        others = (confirm["reference_total_compute_ms"],) if "reference_total_compute_ms" in confirm else ()
        assert confirm["runs"] >= 1 and confirm["kept"] == (_less_work_wins(
            [(chosen_ms, 0, chosen_total), (rebalanced_ms, 1, rebalanced_total)], others=others) == 1)
        assert confirm["plan"].endswith(tuple(", " + h for h in HOW_KEPT))
        assert (rebalanced["kept"] is None) == (not confirm["kept"])
    assert all(p["measured_total_compute_ms"] > 0 for p in timed) and rebalanced["chosen_measured_total_compute_ms"] > 0
    if rebalanced["kept"] is None:  # no rebalanced plan measured cheaper than the chosen one (or tied with less
        if confirm is None:         # work), or not again
            assert _round_choice([p for p in timed if p["round"] == 1]) == 0
        assert record["chosen"] == rebalanced["plans"][0]["from"]
    else:  # each round kept the cheapest rebalanced plan, when it measured below the plan kept before
        assert confirm is not None and confirm["kept"]
        assert record["chosen"] == rebalanced["kept"] and rebalanced["kept"].endswith(tuple(", " + h for h in HOW_KEPT))
        assert _round_choice([p for p in timed if p["round"] == rebalanced["rounds_kept"]]) != 0
        assert record["chosen_round"] is None
    assert not plan.problems()
    # without rebalancing, no record
    plain = refine(TABLES, 3, "64MiB", _calibration(FakeTimer()), rounds=0, compare=("size",), polish_steps=0,
                   rebalance_plans=False)
    assert "rebalance" not in plain.provenance["refine"]
