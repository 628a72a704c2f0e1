"""``neuroshard tables ...``: describe, generate and import tables files."""
from __future__ import annotations

import argparse

from ..cli_options import add_input
from ..validate import MAX_EMBEDDING_DIM, MAX_TABLES, batch_size_int, float_in, int_in, seed_int


def _describe(args: argparse.Namespace) -> int:
    from ..tables import TableSet
    from ..units import format_bytes
    from .sampler import summary
    tables = TableSet.read(args.tables)
    df = summary(tables)
    print(f"{tables.name}: {len(tables)} tables, {format_bytes(tables.total_bytes())} in fp32, batch size {tables.batch_size}")
    for column, label in (("dim", "width"), ("pooling_factor", "pooling factor"), ("rows", "rows"),
                          ("mean_reuse", "mean reuse"), ("hot_lookup_share", "share of lookups on rows reused >32x")):
        s = df[column]
        print(f"  {label:<38} min {s.min():>12.4g}  median {s.median():>12.4g}  mean {s.mean():>12.4g}  max {s.max():>12.4g}")
    if args.all:
        print(df.to_string(index=False))
    return 0


def _from_dlrm(args: argparse.Namespace) -> int:
    from ..validate import check_output
    from .dlrm import tables_from_dlrm
    out = check_output(args.output, [args.file], "tables file")
    tables = tables_from_dlrm(args.file, name=args.name, batch_size=args.batch_size, embedding_dim=args.dim,
                              relative_to=out.parent)
    tables.write(out)
    print(f"{out}: {len(tables)} tables from {args.file}, batch size {tables.batch_size}")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from ..validate import check_output
    from .families import generate
    from .synthetic import PRESETS, calibration_report
    check_output(args.output, [], "tables file")
    tables = generate(args.preset, num_tables=args.num_tables, seed=args.seed)
    tables.write(args.output)
    print(f"{args.output}: {len(tables)} synthetic tables ({args.preset}, seed {args.seed}), "
          f"batch size {tables.batch_size}")
    if args.calibration_tables == 0 or args.preset not in PRESETS:  # only calibrated presets have targets
        return 0
    report = calibration_report(tables, seed=args.seed, max_tables=args.calibration_tables)
    print(f"calibration against the published statistics ({report['tables_sampled']} tables sampled, one batch):")
    print(f"  L1 distance, share of distinct rows per reuse bin   {report['distinct_hist_l1']:.4f}")
    print(f"  L1 distance, share of lookups per reuse bin         {report['lookup_share_l1']:.4f}")
    print(f"  relative error, lookups per table per sample        {report['lookups_per_table_rel_err']:.2%}")
    print(f"  relative error, lookups per distinct row            {report['mean_reuse_rel_err']:.2%}")
    return 0


def _split(args: argparse.Namespace) -> int:
    from ..tables import TableSet
    from ..validate import check_output
    from .augment import split_by_table
    check_output(args.train, [args.tables], "training tables file")
    check_output(args.test, [args.tables, args.train], "held-out tables file")
    train, test = split_by_table(TableSet.read(args.tables), args.test_fraction, args.seed)
    train.write(args.train)
    test.write(args.test)
    print(f"{args.train}: {len(train)} training tables; {args.test}: {len(test)} held-out tables (seed {args.seed})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    tables = sub.add_parser("tables", help="describe, generate and import tables files",
                            description="Work with neuroshard.tables/v1 files.")
    tsub = tables.add_subparsers(dest="tables_command", required=True, metavar="ACTION")
    p = tsub.add_parser("describe", help="summarise a tables file",
                        description="Print count, total size, widths, pooling factors and skew of a tables file.")
    add_input(p, "tables", "tables file (JSON)")
    p.add_argument("--all", action="store_true", help="also print one row per table")
    p.set_defaults(func=_describe)

    p = tsub.add_parser("from-dlrm", help="tables from a dlrm_datasets tensor file",
                        description="Write a tables file from Meta's dlrm_datasets tensors "
                                    "(torch.save((indices, offsets, lengths)), .pt or .pt.gz).")
    p.add_argument("file", help="dlrm_datasets file (.pt or .pt.gz)")
    p.add_argument("-o", "--output", required=True, help="tables file to write (JSON)")
    p.add_argument("--name", help="name of the table set (default: the file's name)")
    p.add_argument("--batch-size", type=batch_size_int, help="batch size of the tables file (default: the recorded one)")
    p.add_argument("--dim", type=int_in(1, MAX_EMBEDDING_DIM, "a width"), default=128,
                   help="embedding width of every table (default: 128)")
    p.set_defaults(func=_from_dlrm)

    from .families import FAMILIES
    p = tsub.add_parser("generate", help="synthetic tables: calibrated presets and benchmark families",
                        description="Generate synthetic tables. dlrm-2021 and dlrm-2022 are calibrated to the "
                                    "dlrm_datasets locality statistics (and print how close one sampled batch "
                                    "comes to them); criteo-kaggle, criteo-terabyte, broad and hot-few are "
                                    "benchmark families of different shapes (neuroshard/datasets/families.py).")
    p.add_argument("--preset", choices=sorted(FAMILIES), default="dlrm-2021")
    p.add_argument("--num-tables", type=int_in(1, MAX_TABLES, "a table count"),
                   help="number of tables (default: the preset's)")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("-o", "--output", required=True, help="tables file to write (JSON)")
    p.add_argument("--calibration-tables", type=int_in(0, MAX_TABLES, "a table count"), default=16, metavar="N",
                   help="tables sampled for the calibration report of a calibrated preset "
                        "(default: 16; 0 skips it)")
    p.set_defaults(func=_generate)

    p = tsub.add_parser("split", help="split tables into training and held-out sets",
                        description="Split a tables file by table, so cost models can be tested on tables "
                                    "they never saw in pre-training.")
    add_input(p, "tables", "tables file (JSON)")
    from .augment import BENCHMARK_SEED, BENCHMARK_TEST_FRACTION
    p.add_argument("--test-fraction", type=float_in(0.0, 1.0, low_open=True, what="a fraction"),
                   default=BENCHMARK_TEST_FRACTION,
                   help=f"share of tables held out (default: {BENCHMARK_TEST_FRACTION})")
    p.add_argument("--seed", type=seed_int, default=BENCHMARK_SEED)
    p.add_argument("--train", required=True, help="tables file for the training tables")
    p.add_argument("--test", required=True, help="tables file for the held-out tables")
    p.set_defaults(func=_split)
