"""``neuroshard plan import`` and ``neuroshard plan score``, and ``plan show`` of a
TorchRec export (registered with the other ``plan`` actions by ``neuroshard.cli``)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .cli_options import add_input


def show_torchrec_export(path: str) -> bool:
    """Print a per-rank table of a ``neuroshard.torchrec-sharding/v1`` file, or of
    TorchRec's plan as JSON, and return True; False when ``path`` is something else."""
    from .errors import NeuroShardError
    from .torchrec.export import TORCHREC_FORMAT
    from .torchrec.import_plan import shards_from_torchrec, table_records
    from .validate import read_json
    data = read_json(path, "plan file")
    if not isinstance(data, dict):
        return False
    if data.get("format") == TORCHREC_FORMAT:
        what = (f"a TorchRec sharding export ({TORCHREC_FORMAT}) of '{data.get('tables_name', '?')}', not a plan "
                f"file")
        where = (f"{data.get('local_world_size', '?')} per host, compute device {data.get('compute_device', '?')}; ")
        qcomms = data.get("qcomms")
        if isinstance(qcomms, dict):  # TorchRec's QCommsConfig (torchrec.export.qcomms_config)
            where += (f"qcomms forward {qcomms.get('forward_precision')}, backward "
                      f"{qcomms.get('backward_precision')}; ")
    elif "format" not in data:
        try:  # TorchRec's plan as JSON ParameterSharding records?
            table_records(data, path)
        except NeuroShardError:
            return False
        what, where = "a TorchRec plan (ParameterSharding records), not a plan file", ""
    else:
        return False
    import pandas as pd
    records, _ = table_records(data, path)
    shards, world = shards_from_torchrec(data, path)
    world = world or max(s.device for s in shards) + 1
    kinds: dict[str, int] = {}
    for record in records.values():
        kinds[str(record.get("sharding_type"))] = kinds.get(str(record.get("sharding_type")), 0) + 1
    print(f"{path}: {what}: {len(records)} tables over {world} ranks ({where}"
          + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + ")")
    rows = [{"rank": r, "shards": sum(s.device == r for s in shards),
             "tables": len({s.table for s in shards if s.device == r}),
             "width": sum(s.num_cols for s in shards if s.device == r),
             "elements": sum(s.num_rows * s.num_cols for s in shards if s.device == r)} for r in range(world)]
    print(pd.DataFrame(rows).to_string(index=False))
    print(f"for memory and estimated cost: neuroshard plan import {path} --format torchrec --tables TABLES.json "
          f"-o plan.json, then neuroshard plan score plan.json --tables TABLES.json")
    return True


#: ``plan show --plot``: dots per inch, and inches per device (the width grows with the devices,
#: between the bounds) and of the two panels' height
PLOT_DPI = 100
PLOT_INCHES_PER_DEVICE = 0.6
PLOT_WIDTH_INCHES = (6.0, 30.0)
PLOT_HEIGHT_INCHES = 7.0


def check_plot(path: str, plan_path: str) -> None:
    """Refuse, in one line, a ``--plot`` name that is not a writable ``.png`` file apart from the plan."""
    from .errors import NeuroShardError
    from .validate import check_output
    if not str(path).lower().endswith(".png"):
        raise NeuroShardError(f"{path}: the plot is a PNG; give a file name ending in .png")
    check_output(path, [plan_path], "plot")


def plot_size_px(num_devices: int) -> tuple[int, int]:
    """(width, height) in pixels of ``plot_plan``'s picture of a plan on ``num_devices`` devices."""
    low, high = PLOT_WIDTH_INCHES
    width = min(max(low, 2.0 + PLOT_INCHES_PER_DEVICE * num_devices), high)
    return round(width * PLOT_DPI), round(PLOT_HEIGHT_INCHES * PLOT_DPI)


def plot_plan(plan, path: str) -> Path:
    """A PNG of ``plan`` per device: its estimated compute and exchange (ms, stacked; the tables
    it holds named on the bar where they fit), and its memory by tier (device memory for
    weights and for caches of rows kept in host memory or on SSD, and those rows' host-memory
    and SSD bytes). Written atomically (``io.atomic_write_bytes``; a symlink written through)."""
    import io as _io

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from .io import atomic_write_bytes
    devices = np.arange(plan.num_devices)
    estimate = plan.estimate or {}
    cost = np.asarray(estimate.get("per_device_cost_ms") or np.zeros(plan.num_devices), dtype=float)
    compute = np.asarray(estimate.get("per_device_compute_ms") or cost, dtype=float)
    exchange = np.maximum(cost - compute, 0.0)
    tiers = {"device: weights": np.zeros(plan.num_devices), "device: caches": np.zeros(plan.num_devices),
             "host memory": np.zeros(plan.num_devices), "SSD": np.zeros(plan.num_devices)}  # bytes
    for s in plan.shards + plan.replicas():
        if not 0 <= s.device < plan.num_devices:
            continue
        tiers["device: weights" if s.tier.on_device else "device: caches"][s.device] += \
            s.size_bytes(plan.bytes_per_element, plan.optimizer)
        if not s.tier.on_device:
            tiers["SSD" if s.tier.memory == "ssd" else "host memory"][s.device] += \
                s.backing_bytes(plan.bytes_per_element, plan.optimizer)
    limits = np.asarray(plan.memory_limits(), dtype=float)
    largest = max(float(limits.max()), *(float(v.max()) for v in tiers.values()))
    unit, scale = next(((u, 2.0**e) for u, e in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10))
                        if largest >= 2.0**e), ("bytes", 1.0))
    width, height = plot_size_px(plan.num_devices)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(width / PLOT_DPI, height / PLOT_DPI), sharex=True)
    try:
        top.bar(devices, compute, 0.8, label="compute")
        top.bar(devices, exchange, 0.8, bottom=compute, label="exchange (all-to-all, waiting)")
        top.set_ylabel("estimated ms per iteration")
        top.set_title(f"plan for '{plan.tables_name}': {len(plan.tables)} tables on {plan.num_devices} devices"
                      + ("" if "per_device_cost_ms" in estimate else " (no estimate in the plan)"))
        top.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize="small")
        off_device = bool(tiers["host memory"].any() or tiers["SSD"].any())
        half = 0.2 if off_device else 0.4  # device memory left of each device, the rows kept off it right
        for offset, labels in ((-0.2 if off_device else 0.0, ("device: weights", "device: caches")),
                               (0.2, ("host memory", "SSD"))):
            below = np.zeros(plan.num_devices)
            for label in labels:
                if tiers[label].any() or label == "device: weights":
                    bottom.bar(devices + offset, tiers[label] / scale, 2 * half, bottom=below, label=label)
                    below += tiers[label] / scale
        bottom.hlines(limits / scale, devices - 0.4, devices - 0.4 + 2 * half, colors="k", linestyles="dashed",
                      lw=1, label="device memory")
        bottom.set(ylabel=f"memory ({unit})", xlabel="device")
        bottom.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize="small")
        bottom.set_xticks(devices if plan.num_devices <= 64 else devices[::max(plan.num_devices // 32, 1)])
        fig.tight_layout()
        _name_tables(fig, top, plan, cost)
        buffer = _io.BytesIO()
        fig.savefig(buffer, format="png", dpi=PLOT_DPI)
    finally:
        plt.close(fig)
    return atomic_write_bytes(path, buffer.getvalue())


def _name_tables(fig, ax, plan, cost) -> None:
    """Each device's tables written up its bar, where the text fits inside it (else the count
    of tables, else nothing)."""
    renderer = fig.canvas.get_renderer()
    for d in range(plan.num_devices):
        names = sorted({s.table for s in plan.shards_on(d)} | set(plan.data_parallel_tables))
        if not names or cost[d] <= 0:
            continue
        bar = ax.transData.transform([(d - 0.4, 0.0), (d + 0.4, cost[d])])
        room_w, room_h = bar[1] - bar[0]
        for label in (", ".join(names), f"{len(names)} table{'s' if len(names) > 1 else ''}"):
            text = ax.text(d, cost[d] / 2, label, rotation=90, ha="center", va="center", fontsize="small",
                           color="white", clip_on=True)
            extent = text.get_window_extent(renderer)
            if extent.width <= room_w and extent.height <= room_h * 0.95:
                break
            text.remove()


def _import(args: argparse.Namespace) -> int:
    from .tables import TableSet
    from .torchrec.import_plan import plan_from_torchrec
    from .units import format_bytes
    from .validate import check_output, read_json
    check_output(args.output, [args.source, args.tables], "plan file")
    tables = TableSet.read(args.tables)
    plan = plan_from_torchrec(read_json(args.source, "TorchRec plan"), tables, num_devices=args.devices,
                              memory_bytes=args.memory,
                              bytes_per_element=args.bytes_per_element, where=str(args.source),
                              provenance={"source": str(args.source), "format": args.format})
    plan.write(args.output)
    kinds: dict[str, int] = {}
    for t in plan.tables:
        kinds[plan.sharding_type(t.name)] = kinds.get(plan.sharding_type(t.name), 0) + 1
    print(f"wrote {args.output}: valid plan, {len(plan.tables)} tables, {len(plan.shards)} shards on "
          f"{plan.num_devices} devices of {format_bytes(plan.device_memory_bytes)} ("
          + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + ")")
    return 0


def _score(args: argparse.Namespace) -> int:
    from .search.score import plan_batch_size, score_plan
    from .tables import TableSet
    from .torchrec.import_plan import read_any_plan
    from .validate import check_output
    if args.output:
        check_output(args.output, [args.plan, args.tables, args.cost_model], "plan file")
    tables = TableSet.read(args.tables)
    plan = read_any_plan(args.plan, tables)
    scored = score_plan(plan, tables, cost_models=args.cost_model)
    print(scored.format_summary())
    from dataclasses import replace

    from .constraints import plan_problems
    for problem in plan_problems(replace(plan, tables=list(tables)))[:3]:  # the tables file's constraints
        print(f"warning: plan breaks a constraint of {args.tables}: {problem}", file=sys.stderr)
    est = scored.estimate
    bound = scored.format_bound()
    if bound:
        print(bound)
    own = (plan.estimate or {}).get("max_device_cost_ms")
    if own is not None:
        at = plan_batch_size(plan)
        print(f"the plan's own estimate: {own:.3f} ms"
              + (f" at batch size {at}" if at else " (batch size not recorded)")
              + f"; scored here at batch size {est['batch_size']} with cost model '{est.get('cost_model')}'")
    if problems := scored.problems():
        print(f"warning: plan is invalid: {problems[0]}", file=sys.stderr)
    if args.output:
        scored.write(args.output)
        print(f"wrote {args.output}")
    return 0


def register(plan_sub: argparse._SubParsersAction) -> None:
    """Add ``import`` and ``score`` to the ``plan`` subcommands."""
    from .validate import bytes_per_element_int, device_count, memory_size
    p = plan_sub.add_parser("import", help="read a TorchRec sharding plan into a plan file",
                            description="Convert a TorchRec plan (per-table ParameterSharding records as JSON: "
                                        "{table: record} or {module: {table: record}}, or the file `neuroshard "
                                        "export` writes) into a validated neuroshard.plan/v1 file.")
    p.add_argument("source", help="TorchRec plan (JSON)")
    p.add_argument("--format", choices=("torchrec",), default="torchrec", help="source format (default: torchrec)")
    p.add_argument("--tables", required=True, help="tables file the plan is for (JSON, neuroshard.tables/v1)")
    p.add_argument("--devices", type=device_count, default=None,
                   help="devices (default: the plan's world size, or its highest rank + 1)")
    p.add_argument("--memory", type=memory_size, default=None,
                   help="memory per device, e.g. 16GiB (default: what the fullest device's shards need)")
    p.add_argument("--bytes-per-element", type=bytes_per_element_int, default=4, help="bytes per weight counted in memory (default: 4)")
    p.add_argument("-o", "--output", required=True, metavar="PLAN.json", help="plan file to write")
    p.set_defaults(func=_import)

    p = plan_sub.add_parser("score", help="estimate a plan's per-device cost with the cost models",
                            description="Print the cost models' per-device estimate of any plan (a plan file, "
                                        "or a TorchRec plan as `plan import` reads it) at the tables file's "
                                        "batch size, as `search` prints its own.")
    add_input(p, "plan", "plan file (neuroshard.plan/v1 or a TorchRec plan, JSON)")
    p.add_argument("--tables", required=True, help="tables file the plan is for (JSON, neuroshard.tables/v1)")
    p.add_argument("--cost-model", default=None, metavar="MODEL.pt",
                   help="cost-model checkpoint (default: the shipped one)")
    p.add_argument("-o", "--output", default=None, metavar="PLAN.json",
                   help="also write the plan with this estimate")
    p.set_defaults(func=_score)
