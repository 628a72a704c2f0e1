"""``neuroshard tables ...``: describe, generate and import tables files."""
from __future__ import annotations

import argparse


def _describe(args: argparse.Namespace) -> int:
    from ..tables import TableSet
    from ..units import format_bytes
    tables = TableSet.read(args.tables)
    df = tables.summary()
    print(f"{tables.name}: {len(tables)} tables, {format_bytes(tables.total_bytes())} in fp32, batch size {tables.batch_size}")
    for column, label in (("dim", "width"), ("pooling_factor", "pooling factor"), ("rows", "rows"),
                          ("mean_reuse", "mean reuse"), ("hot_lookup_share", "share of lookups on rows reused >32x")):
        s = df[column]
        print(f"  {label:<38} min {s.min():>12.4g}  median {s.median():>12.4g}  mean {s.mean():>12.4g}  max {s.max():>12.4g}")
    if args.all:
        print(df.to_string(index=False))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    tables = sub.add_parser("tables", help="describe, generate and import tables files",
                            description="Work with neuroshard.tables/v1 files.")
    tsub = tables.add_subparsers(dest="tables_command", required=True, metavar="ACTION")
    p = tsub.add_parser("describe", help="summarise a tables file",
                        description="Print count, total size, widths, pooling factors and skew of a tables file.")
    p.add_argument("tables", help="tables file (JSON)")
    p.add_argument("--all", action="store_true", help="also print one row per table")
    p.set_defaults(func=_describe)
