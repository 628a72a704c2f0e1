"""The hottest table in row halves, the big tables packed afresh around them: total work and slowest device.

    python experiments/hot_cut_packings.py --family criteo-terabyte --devices 4 --seed 201 --plans 6

Issue 25 at 4 devices: refine's plans measured 7-18% less on the slowest device than the best
baseline's but did 5-13% more total work on criteo-terabyte, and the least-work plans (lookup's,
and refine's own least-work plan) have the hottest table alone on their slowest device. Cutting
that table in place never fit memory (session 37): the task's big tables (40M rows, each about
half a device) fill every other device two at a time. This times, in one interleaved run
(``measure``'s protocol: a cache flush before every timed run, each device relative to a
reference device), plans with the hottest table (by the shipped model's alone-cost) cut into two
row blocks on devices 0 and 1 and the big tables (over ``--big`` of a device's memory) placed in
every way memory allows (enumerated, up to symmetry of the devices that hold no block), the other
tables each on the device of least alone-cost sum with memory for it (LPT, the search's
``placer.greedy_place``): ``--plans`` of those
layouts, evenly spaced in the model's estimate, beside lookup's plan twice (the A/A control) and
size-lookup's. Prints each plan's slowest device and total compute over lookup's.
"""
from __future__ import annotations

import argparse
import itertools
from dataclasses import replace

import numpy as np

from neuroshard.costmodels import load_cost_models
from neuroshard.datasets.families import FAMILIES, family_tasks
from neuroshard.runtime.measure_plan import measure_plans
from neuroshard.search.api import shard
from neuroshard.search.placer import greedy_place
from neuroshard.search.simulator import Simulator
from neuroshard.topology import Topology
from neuroshard.types import split_rows


def packings(tables, memory, devices, models, big_share, limit=20000):
    """(model estimate, description, plan) of every packing of the big tables around the hottest
    table's row halves that fits memory, the others placed by LPT on alone-costs."""
    net = {"topology": Topology(devices, local_world_size=devices)}
    lookup = shard(tables, devices=devices, memory=memory, algorithm="lookup", cost_models=models, **net)
    sim = Simulator.from_plan(lookup, models, tables, models.batch_size)
    pieces, _ = sim.pieces_of_plan(lookup)
    if any(p.num_rows != tables[p.table].num_embeddings or p.num_cols != tables[p.table].embedding_dim
           for p in pieces):
        raise SystemExit("lookup's plan splits a table: this experiment is for tasks of whole tables")
    sizes, alone = sim.sizes_bytes(pieces), sim.single_costs_ms(pieces)
    hot = int(np.argmax(alone))
    halves = split_rows(pieces[hot], 2)
    big = [i for i in range(len(pieces)) if i != hot and sizes[i] > big_share * memory]
    small = [i for i in range(len(pieces)) if i != hot and i not in big]
    name = lambda i: tables[pieces[i].table].name  # noqa: E731
    fixed = [*halves, *(pieces[i] for i in big)]  # pinned: the halves on devices 0 and 1, the big tables as enumerated
    every = fixed + [pieces[i] for i in small]
    keys = np.concatenate([sim.single_costs_ms(halves), alone[big], alone[small]])
    every_bytes = np.concatenate([sim.sizes_bytes(halves), sizes[big], sizes[small]])
    pinned = np.arange(len(every)) < len(fixed)
    seen, out = set(), []
    for where in itertools.islice(itertools.product(range(devices), repeat=len(big)), limit):
        groups = tuple(tuple(sorted(name(i) for i, d in zip(big, where) if d == k)) for k in range(devices))
        key = groups[:2] + tuple(sorted(groups[2:]))  # devices 2.. are alike
        if key in seen:
            continue
        seen.add(key)
        allowed = np.ones((len(every), devices), dtype=bool)
        allowed[:len(fixed)] = False
        allowed[np.arange(len(fixed)), [0, 1, *where]] = True
        # the pinned pieces first, then the others by LPT on alone-costs (the search's greedy placement)
        placed = greedy_place(keys, every_bytes, devices, memory, allowed=allowed, first=pinned)[0]
        if (placed < 0).any():
            continue
        plan = replace(lookup, shards=sim.to_shards(every, placed),
                       provenance={**lookup.provenance.to_dict(), "row_blocks": "any"})
        if plan.problems():
            continue
        est = float(sim.evaluate_plan(plan).compute_ms[0].max())
        out.append((est, " | ".join("+".join(g) or "-" for g in groups), plan))
    out.sort(key=lambda c: c[0])
    return lookup, name(hot), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="criteo-terabyte", choices=sorted(FAMILIES))
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--seed", type=int, default=201)
    parser.add_argument("--tables-per-device", nargs=2, type=int, default=[8, 12])
    parser.add_argument("--plans", type=int, default=6, help="packings timed (default: 6)")
    parser.add_argument("--big", type=float, default=0.3, help="a big table's share of a device's memory at least")
    args = parser.parse_args()
    tables, memory = family_tasks(args.family, args.devices, 1, tuple(args.tables_per_device), seed=args.seed)[0]
    models = load_cost_models(None)
    net = {"topology": Topology(args.devices, local_world_size=args.devices)}
    lookup, hot, layouts = packings(tables, memory, args.devices, models, args.big)
    print(f"{args.family} seed {args.seed}, {args.devices} devices, {len(tables)} tables; hottest table {hot} in "
          f"row halves on devices 0 and 1; {len(layouts)} packings of the big tables fit memory")
    plans = {"lookup": lookup,
             "size-lookup": shard(tables, devices=args.devices, memory=memory, algorithm="size-lookup",
                                  cost_models=models, **net)}
    step = max(1, len(layouts) // max(1, args.plans))
    for k, (_, groups, plan) in enumerate(layouts[::step][:args.plans]):
        plans[f"cut{k}: {groups}"] = plan
    plans["lookup again"] = lookup
    result = measure_plans(plans, tables, cost_models=models, progress=False, reference=True)
    first = result["lookup"]
    print(result.config.get("hardware"), "| big tables per device (devices 0 and 1 hold the halves)")
    print(f"{'plan':70s} {'slowest':>8s} {'total':>7s}  devices (ms)")
    for p in result.plans:
        c = np.asarray(p.compute_ms)
        print(f"{p.name[:70]:70s} {c.max() / first.max_compute_ms:8.3f} {c.sum() / np.sum(first.compute_ms):7.3f}  "
              f"{np.round(c, 1).tolist()}")


if __name__ == "__main__":
    main()
