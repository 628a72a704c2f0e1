"""Search algorithms: NeuroShard against the greedy baselines, row-wise splits,
infeasible tasks, memory units, and a valid plan from every algorithm."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import algorithm_params

from neuroshard.datasets.synthetic import generate
from neuroshard.errors import InfeasibleError, NeuroShardError
from neuroshard.search import ALGORITHMS, Simulator, registry, search_placement, search_plan
from neuroshard.search.cli import ALGORITHM_CHOICES
from neuroshard.search.params import PARAMS
from neuroshard.search.placer import greedy_place
from neuroshard.search.registry import GREEDY_ALGORITHMS
from neuroshard.tables import Table, TableSet
from neuroshard.torchrec.guard import torchrec_available

SMALL = {"beam_width": 2, "depth": 4, "top_n": 2, "grid_size": 5}


def _memory_for(tables: TableSet, devices: int, fill: float) -> int:
    """Per-device memory at which the tables fill ``fill`` of all devices."""
    return int(tables.total_bytes() / (fill * devices))


@pytest.mark.parametrize("num_tables,devices,seed", [(12, 4, 0), (20, 4, 1), (16, 2, 2)])
def test_neuroshard_beats_or_ties_the_best_greedy_baseline(analytic_models, num_tables, devices, seed):
    tables = generate("dlrm-2021", num_tables, seed=seed)
    memory = _memory_for(tables, devices, 0.6)
    sim = Simulator(tables, devices, analytic_models)
    # The beam and grid search alone, without the greedy plans as seeds, already do it here.
    ours = search_placement(sim, memory, "neuroshard", baseline_seeds=False, **SMALL)
    assert ours.details["local_search_from"] in ("beam", "beam-split")
    baselines = {algo: search_placement(sim, memory, algo).cost_ms for algo in GREEDY_ALGORITHMS}
    assert ours.cost_ms <= min(baselines.values()) * (1 + 1e-9), (ours.cost_ms, baselines)
    # The reported cost is what the simulator says of the returned placement.
    assert sim.evaluate(ours.pieces, ours.devices[None, :]).max_ms[0] == pytest.approx(ours.cost_ms)
    seeded = search_placement(sim, memory, "neuroshard", **SMALL)
    assert seeded.cost_ms <= ours.cost_ms * (1 + 1e-9)


def test_greedy_seeds_keep_neuroshard_at_least_as_good_as_the_baselines(analytic_models):
    """With a search too shallow to split anything, the seeds still bring the best greedy plan."""
    tables = generate("dlrm-2021", 16, seed=3)
    memory = _memory_for(tables, 2, 0.6)
    sim = Simulator(tables, 2, analytic_models)
    shallow = {"beam_width": 1, "depth": 0, "top_n": 1, "grid_size": 1, "local_search_steps": 0}
    beam_only = search_placement(sim, memory, "neuroshard", baseline_seeds=False, **shallow)
    seeded = search_placement(sim, memory, "neuroshard", **shallow)
    best = min(GREEDY_ALGORITHMS, key=lambda a: search_placement(sim, memory, a).cost_ms)
    best_cost = search_placement(sim, memory, best).cost_ms
    assert seeded.cost_ms == pytest.approx(min(best_cost, beam_only.cost_ms))
    if best_cost < beam_only.cost_ms:
        assert seeded.details["local_search_from"] == f"greedy-{best}"


def test_table_larger_than_a_device_is_split_by_rows(analytic_models):
    # 'wide' cannot be halved along columns (12 = 2 x 6, 6 is no multiple of 4), and alone
    # it is 2.4x a device: it must be split by rows.
    tables = TableSet("big", [Table("wide", 100_000, 12, 4.0, {"zipf_alpha": 0.9}),
                              Table("a", 10_000, 32, 2.0), Table("b", 5_000, 64, 6.0)], 4096)
    memory = 2_000_000
    plan = search_plan(tables, devices=5, memory=memory, cost_models=analytic_models, **SMALL)
    plan.validate()
    wide = plan.shards_of("wide")
    assert len({(s.row_offset, s.num_rows) for s in wide}) >= 3
    assert plan.sharding_type("wide") == "row_wise"
    assert max(plan.memory_used_bytes()) <= memory
    # Row blocks send partial sums of all their columns through the all-to-all, charged there once.
    assert plan.estimate["per_device_reduce_ms"] == [0.0] * 5
    assert max(plan.estimate["per_device_bwd_comm_ms"]) > 0


def test_wide_table_is_split_by_columns_first(analytic_models):
    tables = TableSet("cols", [Table("t", 100_000, 128, 4.0), Table("u", 1000, 16, 1.0)], 4096)
    plan = search_plan(tables, devices=4, memory=16_000_000, cost_models=analytic_models, row_splits=False, **SMALL)
    assert plan.sharding_type("t") == "column_wise"
    assert all(s.num_cols % 4 == 0 for s in plan.shards)


def test_infeasible_tasks_say_by_how_much(analytic_models):
    tables = TableSet("x", [Table("t", 1_000_000, 64, 1.0), Table("u", 1_000_000, 64, 1.0)])  # 512 MB
    with pytest.raises(InfeasibleError, match=r"too much .*need at least 4 devices"):
        search_plan(tables, devices=2, memory="128MiB", cost_models=analytic_models)
    narrow = TableSet("y", [Table("t", 10_000_000, 4, 1.0)])  # 160 MB, one 4-wide column
    with pytest.raises(InfeasibleError, match=r"'t' fits on no device even fully split.*over"):
        search_plan(narrow, devices=4, memory="100MB", cost_models=analytic_models, row_splits=False)
    # With row-wise splits allowed the same task is feasible.
    plan = search_plan(narrow, devices=4, memory="100MB", cost_models=analytic_models, **SMALL)
    assert plan.sharding_type("t") == "row_wise"


def test_memory_units_and_bytes_per_element(analytic_models):
    tables = TableSet("u", [Table("t", 1_000_000, 64, 1.0), Table("u", 10_000, 16, 1.0)])  # 256 MB in fp32
    plan = search_plan(tables, devices=2, memory="1GiB", algorithm="size", cost_models=analytic_models)
    assert plan.device_memory_bytes == 2**30
    decimal = search_plan(tables, devices=2, memory="1GB", algorithm="size", cost_models=analytic_models)
    assert decimal.device_memory_bytes == 10**9
    with pytest.raises(NeuroShardError, match="cannot read a memory size"):
        search_plan(tables, devices=2, memory="lots", cost_models=analytic_models)
    # 100 MiB per device: infeasible in fp32 (2 x 100 MiB < 256 MB), feasible in fp16.
    with pytest.raises(InfeasibleError):
        search_plan(tables, devices=2, memory="100MiB", algorithm="size", cost_models=analytic_models)
    half = search_plan(tables, devices=2, memory="100MiB", algorithm="size", cost_models=analytic_models,
                       bytes_per_element=2)
    assert half.bytes_per_element == 2 and max(half.memory_used_bytes()) <= 100 * 2**20


@pytest.mark.parametrize("algorithm", algorithm_params())
def test_every_algorithm_returns_a_valid_plan(analytic_models, algorithm):
    if algorithm == "torchrec" and not torchrec_available():
        pytest.skip("torchrec is not importable")
    tables = generate("dlrm-2021", 10, seed=3)
    params = {"neuroshard": SMALL, "bayes": {"n_trials": 8, "batch": 4}}.get(algorithm, {})
    # TorchRec also counts optimizer state and buffers (about 3x the weights).
    memory = _memory_for(tables, 4, 0.1 if algorithm == "torchrec" else 0.5)
    plan = search_plan(tables, devices=4, memory=memory, algorithm=algorithm, cost_models=analytic_models, seed=1,
                       **params)
    assert plan.problems() == []
    assert plan.provenance["algorithm"] == algorithm
    assert plan.provenance["cost_model"] == analytic_models.name
    assert plan.estimate["max_device_cost_ms"] == pytest.approx(max(plan.estimate["per_device_cost_ms"]), rel=1e-6)
    assert plan.estimate["balanced_bound_ms"] > 0
    assert len(plan.estimate["per_device_compute_ms"]) == 4


def test_searches_are_deterministic_and_check_their_parameters(analytic_models):
    tables = generate("dlrm-2021", 10, seed=4)
    memory = _memory_for(tables, 4, 0.5)
    for algorithm, params in (("random", {}), ("bayes", {"n_trials": 6, "batch": 3})):
        a = search_plan(tables, devices=4, memory=memory, algorithm=algorithm, cost_models=analytic_models, seed=7,
                        **params)
        b = search_plan(tables, devices=4, memory=memory, algorithm=algorithm, cost_models=analytic_models, seed=7,
                        **params)
        assert a.shards == b.shards
    with pytest.raises(NeuroShardError, match="unknown parameter.*beam_wdth"):
        search_plan(tables, devices=4, memory=memory, cost_models=analytic_models, beam_wdth=3)
    with pytest.raises(NeuroShardError, match="unknown algorithm"):
        search_plan(tables, devices=4, memory=memory, algorithm="magic", cost_models=analytic_models)


def test_greedy_baselines_share_one_loop(analytic_models):
    """The classic heuristics differ only by their key: on tables that differ in one
    property, each key's ordering puts its own largest tables on different devices."""
    tables = TableSet("k", [Table("big", 400_000, 16, 1.0), Table("wide", 1000, 128, 1.0),
                            Table("hot", 1000, 16, 50.0), Table("small", 1000, 16, 1.0)], 4096)
    sim = Simulator(tables, 2, analytic_models)
    memory = 10**9
    for key, first in (("size", "big"), ("dim", "wide"), ("lookup", "hot")):
        placed = search_placement(sim, memory, key)
        names = [tables[p.table].name for p in placed.pieces]
        device_of = dict(zip(names, placed.devices.tolist()))
        assert device_of[first] == 0  # the largest key goes first, on the first empty device
        assert np.bincount(placed.devices, minlength=2).min() >= 1


def test_one_registry_serves_shard_the_cli_and_the_experiments(analytic_models):
    """Every algorithm is registered once: the CLI's choices and the experiments read the
    registry, each entry has a name, a parameters dataclass (or none) and one search call."""
    import dataclasses

    assert registry.ALGORITHMS == ALGORITHMS == ALGORITHM_CHOICES
    assert registry.GREEDY_ALGORITHMS == GREEDY_ALGORITHMS == ("random", "size", "dim", "lookup", "size-lookup")
    assert "measured-greedy" not in registry.SIMULATED_ALGORITHMS
    tables = generate("dlrm-2021", 8, seed=5)
    memory = _memory_for(tables, 2, 0.5)
    sim = Simulator(tables, 2, analytic_models)
    for name in ALGORITHMS:
        algorithm = registry.get_algorithm(name)
        assert algorithm.name == name
        assert algorithm.params_type is None or dataclasses.is_dataclass(algorithm.params_type)
        assert algorithm.params_type is PARAMS.get(name), name  # what `search --help` lists
    for name in ("neuroshard", "size", "bayes"):
        algorithm = registry.get_algorithm(name)
        params = registry.make_params(algorithm, {"n_trials": 4, "batch": 2} if name == "bayes" else {})
        direct = algorithm.search(sim, memory, params, 0)
        assert (direct.devices == search_placement(sim, memory, name, 0, **({"n_trials": 4, "batch": 2}
                                                                            if name == "bayes" else {})).devices).all()
    with pytest.raises(NeuroShardError, match="takes no parameters, got x"):
        registry.make_params(registry.get_algorithm("size"), {"x": 1})
    with pytest.raises(NeuroShardError, match=r"unknown parameter\(s\) colour for algorithm 'torchrec' "
                                              r"\(known: compute_device, timeout_s\)"):
        registry.make_params(registry.get_algorithm("torchrec"), {"colour": "red"})
    with pytest.raises(NeuroShardError, match="unknown algorithm 'magic' .choose from neuroshard, random"):
        registry.get_algorithm("magic")


def test_the_greedy_placer_is_shared(analytic_models):
    """One placer: keys largest first, least-loaded device with memory, -1 when memory runs out."""
    devices = greedy_place(np.array([3.0, 1.0, 2.0, 1.0]), np.array([10, 10, 10, 10]), 2, 20)
    assert devices.tolist() == [[0, 1, 1, 0]]
    assert (greedy_place(np.array([1.0, 1.0, 1.0]), np.array([10, 10, 10]), 1, 20) == -1).all()
    capped = greedy_place(np.array([3.0, 2.0, 1.0]), np.array([1, 1, 1]), 2, 100, widths=np.array([8, 8, 8]),
                          caps=np.array([8.0, np.inf]))
    assert capped.tolist() == [[0, 1, 1], [0, 1, 1]]


def test_a_precision_without_a_measured_ratio_is_said_to_be_costed_as_fp32(analytic_models, caplog):
    """int8 (1 byte) has no measured ratio: costed as fp32, said so. fp16 (2 bytes) is costed
    at fp16 since issue 16 (tests/test_precision.py)."""
    tables = generate("dlrm-2021", 6, seed=6)
    memory = _memory_for(tables, 2, 0.5)
    plan = search_plan(tables, devices=2, memory=memory, algorithm="size", cost_models=analytic_models)
    assert "cost_precision" not in plan.provenance
    with caplog.at_level("WARNING", logger="neuroshard.search.api"):
        int8 = search_plan(tables, devices=2, memory=memory, algorithm="size", cost_models=analytic_models,
                           bytes_per_element=1)
    assert int8.provenance["cost_precision"] == "fp32"
    assert any("bytes_per_element=1" in r.getMessage() and "fp32" in r.getMessage() for r in caplog.records)
    half = search_plan(tables, devices=2, memory=memory, algorithm="size", cost_models=analytic_models,
                       bytes_per_element=2)
    assert half.provenance["cost_precision"] == "fp16"


def test_local_search_relieves_the_device_with_the_most_compute(analytic_models):
    """Every device's simulated total includes waiting for the slowest in the exchange, so
    the totals are all equal: the local search must pick its device by compute (it once
    picked device 0 and never moved anything), and swaps close gaps moves cannot."""
    from neuroshard.search.neuroshard import local_search
    from neuroshard.topology import Topology
    from neuroshard.types import Placement, whole_pieces

    # 20 narrow, busy tables crowded on device 3; one wide, idle table on each other device
    busy = [Table(f"busy{i}", 20_000, 8, 20.0, {"zipf_alpha": 1.0}) for i in range(20)]
    wide = [Table(f"wide{i}", 1_000, 256, 0.1) for i in range(3)]
    tables = TableSet("crowded", wide + busy, 65536)
    devices = 4
    sim = Simulator(tables, devices, analytic_models, topology=Topology(devices, local_world_size=devices))
    pieces = whole_pieces(tables)
    crowded = np.array([0, 1, 2] + [3] * len(busy), dtype=np.int64)
    start = sim.evaluate(pieces, crowded[None, :])
    totals, compute = start.total_ms[0], start.compute_ms[0]
    assert np.ptp(totals) < 1e-3 * totals.max()  # the waiting equalises the totals...
    assert totals.argmax() != compute.argmax() == 3  # ...and the widest device's exchange tops them
    placed = Placement(pieces, crowded, float(start.max_ms[0]))
    memory = tables.total_bytes()
    moved, changes = local_search(sim, placed, memory, steps=40, swaps=0)
    assert changes > 0 and moved.cost_ms < placed.cost_ms
    with_swaps, _ = local_search(sim, placed, memory, steps=40, swaps=32)
    assert with_swaps.cost_ms <= moved.cost_ms * (1 + 1e-9)
    after = sim.evaluate(pieces, moved.devices[None, :]).compute_ms[0]
    assert after.max() < start.compute_ms[0].max()


def test_tables_heavier_than_the_mean_device_are_split_at_once(shipped_models):
    """The beam splits one table a step; while other tables heavier than the mean device
    remain, the slowest device does not change and the beam sees no gain. The search also
    tries every such table split at once ("heavy-split"): with the beam off it is what finds
    the split plan, kept because it is simulated cheaper by more than the split margin."""
    from neuroshard.search.neuroshard import search
    from neuroshard.search.params import NeuroShardParams
    from neuroshard.topology import Topology
    hot = [Table(f"hot{i}", 4_000_000, 128, 150.0, {"zipf_alpha": 1.05}) for i in range(3)]
    small = [Table(f"s{i}", 20_000 + 1000 * i, 32, 2.0 + i % 3, {"zipf_alpha": 1.1}) for i in range(13)]
    tables = TableSet("heavy", hot + small, 4096)
    sim = Simulator(tables, 8, shipped_models, topology=Topology(8, local_world_size=8))
    params = NeuroShardParams(depth=0)
    placement = search(sim, 64 << 30, params)
    assert placement.details["local_search_from"] == "heavy-split"
    assert len(placement.pieces) > len(tables) and placement.details["split_gain"] > params.split_margin
    split_tables = {p.table for p in placement.pieces
                    if p.num_cols < tables[p.table].embedding_dim or p.num_rows < tables[p.table].num_embeddings}
    assert split_tables <= {0, 1, 2}  # only the hot tables were cut


def test_tables_of_more_than_half_a_device_are_split_together(shipped_models):
    """Three hot tables each 0.5-1.0x the mean device: none is heavier than a device (no
    "heavy-split"), and the beam's one split a step leaves the other two devices the slowest.
    The search also tries them split at once ("half-heavy-split"), kept by the split margin
    like every split state: here simulated a little dearer, so not by default; a negative
    ``split_margin`` (a split plan for measurement to decide) keeps it; below -1 is refused."""
    from neuroshard.search.neuroshard import search
    from neuroshard.search.params import NeuroShardParams
    from neuroshard.topology import Topology
    hot = [Table(f"hot{i}", 4_000_000, 128, 20.0, {"zipf_alpha": 1.05}) for i in range(3)]
    small = [Table(f"s{i}", 200_000 + 1000 * i, 64, 4.0 + i % 5, {"zipf_alpha": 1.1}) for i in range(40)]
    tables = TableSet("half-heavy", hot + small, 4096)
    sim = Simulator(tables, 8, shipped_models, topology=Topology(8, local_world_size=8))
    default = search(sim, 64 << 30, NeuroShardParams(depth=0))
    gains = default.details["split_gains"]
    assert set(gains) == {"half-heavy-split"} and gains["half-heavy-split"] < NeuroShardParams().split_margin
    assert len(default.pieces) == len(tables)
    forced = search(sim, 64 << 30, NeuroShardParams(depth=0, split_margin=-1.0))
    assert forced.details["local_search_from"] == "half-heavy-split" and len(forced.pieces) > len(tables)
    split_tables = {p.table for p in forced.pieces
                    if p.num_cols < tables[p.table].embedding_dim or p.num_rows < tables[p.table].num_embeddings}
    assert split_tables == {0, 1, 2}  # the three hot tables, together
    assert forced.cost_ms == pytest.approx(default.cost_ms * (1 - gains["half-heavy-split"]), rel=1e-5)  # the gain is rounded to 5 decimals
    with pytest.raises(NeuroShardError, match="split_margin"):
        NeuroShardParams(split_margin=-1.5)


def test_column_strips_on_one_device_are_joined():
    """Neighbouring column strips cut into the same row blocks, each block pair on one
    device, become one strip there (same memory, one pass of the fused kernel instead of
    two); strips on different devices, or cut differently, stay as they are."""
    from neuroshard.search.rowwise import join_column_strips
    from neuroshard.types import Piece
    halves = [(Piece(0, 0, 100, 0, 32), 1), (Piece(0, 0, 100, 32, 32), 1), (Piece(1, 0, 50, 0, 16), 0)]
    assert join_column_strips(halves) == [(Piece(0, 0, 100, 0, 64), 1), (Piece(1, 0, 50, 0, 16), 0)]
    apart = [(Piece(0, 0, 100, 0, 32), 0), (Piece(0, 0, 100, 32, 32), 1)]
    assert join_column_strips(apart) == apart
    quarters = [(Piece(0, 0, 100, 16 * i, 16), d) for i, d in enumerate((0, 0, 1, 1))]
    assert join_column_strips(quarters) == [(Piece(0, 0, 100, 0, 32), 0), (Piece(0, 0, 100, 32, 32), 1)]
    # a grid: two strips of two row blocks each; blocks pair up on devices 2 and 3
    grid = [(Piece(0, 0, 50, 0, 8), 2), (Piece(0, 50, 50, 0, 8), 3),
            (Piece(0, 0, 50, 8, 8), 2), (Piece(0, 50, 50, 8, 8), 3)]
    assert join_column_strips(grid) == [(Piece(0, 0, 50, 0, 16), 2), (Piece(0, 50, 50, 0, 16), 3)]
    crossed = [grid[0], grid[1], (grid[2][0], 3), (grid[3][0], 2)]
    assert join_column_strips(crossed) == sorted(crossed)


def test_no_plan_keeps_a_table_in_column_strips_on_one_device(shipped_models):
    """criteo-terabyte on 4 devices (seed 137, the task where it happened): the search
    halved a 40M-row table for memory and placed both halves on one device, which the
    fused kernel measured dearer than the table whole. Written plans join such strips."""
    from neuroshard.datasets.families import family_tasks
    from neuroshard.topology import Topology
    tables, memory = family_tasks("criteo-terabyte", 4, 1, (8, 12), seed=137)[0]
    plan = search_plan(tables, 4, memory, "neuroshard", cost_models=shipped_models,
                       topology=Topology(4, local_world_size=4))
    blocks = {}
    for s in plan.shards:
        blocks.setdefault((s.table, s.device, s.row_offset, s.num_rows), []).append(s.num_cols)
    assert all(len(widths) == 1 for widths in blocks.values()), blocks
    assert len({s.table for s in plan.shards}) == len(tables)


def test_row_blocks_counts_and_check():
    """``row_blocks``: TorchRec's block counts by default; "any" adds every power of two
    below the devices; another word is refused in one line before any work."""
    from neuroshard.constants import block_counts
    assert block_counts(8, 8) == [8]
    assert block_counts(16, 8) == [8, 16]
    assert block_counts(8, 8, "any") == [2, 4, 8]
    assert block_counts(6, 6, "any") == [2, 4, 6]
    tables = generate("dlrm-2021", 8, seed=1)
    with pytest.raises(NeuroShardError, match="row_blocks must be one of torchrec, any"):
        search_plan(tables, 2, None, row_blocks="rows")


def test_row_blocks_any_cuts_a_hot_table_in_row_halves_and_export_says_why_not(shipped_models):
    """criteo-terabyte on 8 devices (seed 161): a pooling-100 table costs more alone than the
    mean device. With TorchRec's layouts (default) every split of it is a column split or 8
    row blocks, and the written plan exports; with ``row_blocks="any"`` the search cuts hot
    tables into fewer row blocks (never column strips for balance) and says so in the
    provenance, and the TorchRec exporter refuses the plan naming the option."""
    from neuroshard.datasets.families import family_tasks
    from neuroshard.types import ceil_blocks
    from neuroshard.topology import Topology
    from neuroshard.torchrec.export import torchrec_sharding
    tables, memory = family_tasks("criteo-terabyte", 8, 1, (8, 12), seed=161)[0]
    one_host = Topology(8, local_world_size=8)
    default = search_plan(tables, 8, memory, cost_models=shipped_models, topology=one_host)
    assert "row_blocks" not in default.provenance
    torchrec_sharding(default, local_world_size=8)  # every layout is one TorchRec runs
    free = search_plan(tables, 8, memory, cost_models=shipped_models, topology=one_host, row_blocks="any")
    assert free.provenance["row_blocks"] == "any"
    blocks = {}
    for s in free.shards:
        blocks.setdefault(s.table, []).append(s)
    hot = [t.name for t in tables if t.pooling_factor >= 100]
    assert hot and all(1 < len(blocks[h]) < 8 for h in hot), {h: len(blocks[h]) for h in hot}
    for h in hot:  # row blocks of the whole width, TorchRec's ceil sizes, on distinct devices
        rows = sorted(blocks[h], key=lambda s: s.row_offset)
        assert all(s.num_cols == tables[h].embedding_dim for s in rows)
        assert [(s.row_offset, s.num_rows) for s in rows] == ceil_blocks(tables[h].num_embeddings, len(rows))
        assert len({s.device for s in rows}) == len(rows)
    with pytest.raises(NeuroShardError, match="--row-blocks torchrec"):
        torchrec_sharding(free, local_world_size=8)


@pytest.mark.parametrize("devices,index", [(4, 0), (4, 1), (8, 2)])
def test_the_written_plan_is_never_dearer_than_a_baseline_seed(shipped_models, devices, index):
    """Hot-few tasks: huge hot tables cut into row blocks for memory. The plan written (row
    blocks laid out as TorchRec runs them) costs, by the simulator the search charges, no more
    than any greedy baseline's written plan: the search compares the layouts it writes, not
    free placements of row blocks that are re-cut or joined before writing."""
    from neuroshard.datasets.families import family_tasks
    from neuroshard.topology import Topology
    tables, memory = family_tasks("hot-few", devices, 3, (8, 12), seed=301)[index]
    network = {"topology": Topology(devices, local_world_size=devices)}

    def written_cost(algorithm: str) -> float:
        plan = search_plan(tables, devices=devices, memory=memory, algorithm=algorithm, cost_models=shipped_models,
                           seed=index, **network)
        sim = Simulator.from_plan(plan, shipped_models, tables)
        pieces, where = sim.pieces_of_plan(plan)
        return float(sim.evaluate(pieces, where[None, :]).max_ms[0])

    ours = written_cost("neuroshard")
    baselines = {algorithm: written_cost(algorithm) for algorithm in GREEDY_ALGORITHMS}
    assert ours <= min(baselines.values()) * (1 + 1e-9), (ours, baselines)
