"""The ``neuroshard compare`` command (``runtime.compare``: our plan against another planner's,
timed on this machine). Its module is imported only when the command runs, so ``--help``
stays free of torch."""
from __future__ import annotations

import argparse
import json

from ..cli_options import add_input, add_output
from ..constants import TIMING_PASSES
from ..io import atomic_write_text
from ..search.registry import ALGORITHMS
from ..tables import TableSet
from ..validate import check_output, device_count, memory_size, positive_int, seed_int

DEFAULT_ALGORITHM = "neuroshard"


def _compare(args: argparse.Namespace) -> int:
    from .compare import compare  # the instrument imports torch: only when a comparison runs
    output = check_output(args.output, [args.tables], "comparison file") if args.output else None
    tables = TableSet.read(args.tables)
    result = compare(tables, args.devices, args.memory, args.against, cost_models=args.cost_model, seed=args.seed,
                     passes=args.passes, progress=True)
    print(result.format())
    if output is not None:
        atomic_write_text(output, json.dumps(result.to_dict(), indent=1) + "\n")
        print(f"wrote {output}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``compare`` to the subcommands."""
    p = sub.add_parser("compare", help="our plan against TorchRec's (or a baseline's), timed on this machine",
                       description="Search our plan and another planner's for the same tables, devices and memory, "
                                   "time both in one interleaved run of `measure` (ours twice, an A/A control) and "
                                   "print their measured ratio. The exchange is modeled, not measured.")
    add_input(p, "tables", "tables file (JSON, neuroshard.tables/v1)")
    p.add_argument("-d", "--devices", type=device_count, required=True, help="number of devices")
    p.add_argument("-m", "--memory", type=memory_size, required=True, help="memory per device, e.g. 16GiB")
    p.add_argument("--against", default="torchrec", choices=[a for a in ALGORITHMS if a != DEFAULT_ALGORITHM],
                   help="the other planner (default: torchrec, TorchRec's EmbeddingShardingPlanner)")
    p.add_argument("--passes", type=positive_int, default=TIMING_PASSES,
                   help=f"timed passes over all devices, as `measure --passes` (default: {TIMING_PASSES})")
    p.add_argument("--cost-model", default=None, metavar="MODEL.pt",
                   help="cost-model checkpoint both searches and the estimates use (default: the shipped one)")
    p.add_argument("--seed", type=seed_int, default=0)
    add_output(p, "also write the comparison and the measurement as JSON", aliases=("--json",),
               metavar="OUT.json")
    p.set_defaults(func=_compare)
