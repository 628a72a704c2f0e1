"""What the row splits TorchRec does not run are worth (issue 25): one task's plans, timed device
by device with ``neuroshard measure``'s protocol in one interleaved run.

    python experiments/row_blocks.py --family criteo-terabyte --devices 8 --seed 161

On criteo-terabyte at 8 devices a pooling-100 table costs more alone than the mean device, so
no placement of whole tables gets below it. TorchRec runs a row split only as one block per
rank of a host or of all ranks (8 here), or column strips; NeuroShard's runtime runs any row
blocks. Timed together, searched as one host of ``--devices`` (``--one-host`` in
``plan_benchmark.py``):

* ``size-lookup``, and the same plan again (the A/A control);
* ``neuroshard``: the search with TorchRec's layouts (``row_blocks="torchrec"``, the default);
* ``neuroshard --row-blocks any``: the search that may cut tables into 2, 4, ... row blocks;
* the ``--hot`` hottest tables (pooling x width) cut by hand into D row blocks (TorchRec's
  row-wise), into column halves, or into row halves, the other tables placed by the
  NeuroShard search's greedy and local search against the pre-trained models.

Each plan's slowest device and its devices' total (the work) are printed; ratios are to
size-lookup's slowest device in the same run.
"""
from __future__ import annotations

import argparse
import sys

from neuroshard.costmodels import load_cost_models
from neuroshard.costmodels.measure.store import cpu_model
from neuroshard.datasets.families import family_tasks
from neuroshard.runtime.measure_plan import measure_plans
from neuroshard.search.api import make_plan, shard
from neuroshard.search.neuroshard import local_search, place_many
from neuroshard.search.params import NeuroShardParams
from neuroshard.search.rowwise import halve_strip_cols, place_with_splits, split_table_rows
from neuroshard.search.simulator import Simulator
from neuroshard.topology import Topology


def hand_cut(tables, devices: int, memory: int, models, hot: list[str], how: str, topology: Topology):
    """The ``hot`` tables cut ``how`` ("rows D", "column halves", "row halves"), the rest placed
    by the NeuroShard search's greedy grid and local search (pre-trained models)."""
    sim = Simulator(tables, devices, models, topology=topology, row_blocks="any")
    params = NeuroShardParams()
    pieces = sim.memory_split(memory, True)
    names = [t.name for t in tables]
    for name in hot:
        i = next(j for j, p in enumerate(pieces) if names[p.table] == name)
        pieces = (halve_strip_cols(pieces, i) if how == "column halves"
                  else split_table_rows(pieces, i, parts=2 if how == "row halves" else devices))
    placed = place_with_splits(pieces, lambda p: place_many(sim, [p], memory, params)[0], sim.footprint, True,
                               counts=sim.row_block_counts, allowed=sim.allowed)
    placed, _ = local_search(sim, placed, memory, params.local_search_steps, params.local_search_swaps)
    return make_plan(sim, placed, memory, f"hand: {how}", 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", default="criteo-terabyte")
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--seed", type=int, default=161)
    ap.add_argument("--hot", type=int, default=2, help="how many of the hottest tables to cut by hand")
    args = ap.parse_args()
    models = load_cost_models(None)
    tables, memory = family_tasks(args.family, args.devices, 1, (8, 12), seed=args.seed)[0]
    one_host = Topology(args.devices, local_world_size=args.devices)
    hot = [t.name for t in sorted(tables, key=lambda t: -t.pooling_factor * t.embedding_dim)[:args.hot]]
    print(f"# python experiments/row_blocks.py {' '.join(sys.argv[1:])}   ({cpu_model()}, batch {models.batch_size}, "
          f"{len(tables)} tables; hand-cut: {', '.join(f'{h} (pooling {tables[h].pooling_factor:g})' for h in hot)})")
    base = shard(tables, args.devices, memory, "size-lookup", cost_models=models, topology=one_host)
    plans = {"size-lookup": base,
             "neuroshard": shard(tables, args.devices, memory, cost_models=models, topology=one_host),
             "neuroshard --row-blocks any": shard(tables, args.devices, memory, cost_models=models,
                                                  topology=one_host, row_blocks="any")}
    for how in (f"rows {args.devices}", "column halves", "row halves"):
        plans[f"hot tables in {how}"] = hand_cut(tables, args.devices, memory, models, hot, how, one_host)
    plans["size-lookup again"] = base
    result = measure_plans(plans, tables, cost_models=models)
    reference = next(p for p in result.plans if p.name == "size-lookup").max_compute_ms
    for p in result.plans:
        print(f"{p.name:30s} {len(p.plan.shards):4d} shards   slowest {p.max_compute_ms:6.2f} ms "
              f"({p.max_compute_ms / reference:5.3f}x)   total {sum(p.compute_ms):7.2f} ms   devices "
              + " ".join(f"{x:5.1f}" for x in p.compute_ms))


if __name__ == "__main__":
    main()
