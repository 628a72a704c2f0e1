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


def _fractions(text: str) -> list[tuple[str, float]]:
    """``0.01,0.05,0.2`` as (the text as given, its value) pairs, each in (0, 1]."""
    out = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected fractions like 0.01,0.05,0.2, got {text!r}") from None
        if not 0 < value <= 1:
            raise argparse.ArgumentTypeError(f"a cache fraction must be in (0, 1], got {part!r}")
        out.append((part.strip(), value))
    if len({v for _, v in out}) != len(out):
        raise argparse.ArgumentTypeError(f"a cache fraction is given twice in {text!r}")
    return out


def _cache(args: argparse.Namespace) -> int:
    import json

    from ..cli_options import STDOUT, write_output
    from ..tables import TableSet
    from ..validate import check_output
    from .cache_model import predict_miss_rates
    if args.output != STDOUT:
        check_output(args.output, [args.tables], "cache report")
    tables = TableSet.read(args.tables)
    values = [v for _, v in args.fractions]
    report = {"batch_size": tables.batch_size, "algorithm": args.algorithm, "tables": {},
              **({"history_batches": args.history} if args.history and args.algorithm == "lfu" else {})}
    for table in tables:
        curve = predict_miss_rates(table, tables.batch_size, values, args.algorithm, history=args.history)
        report["tables"][table.name] = {"unique_per_batch": round(curve.unique_per_batch, 3), "method": curve.method,
                                        "miss_rate": {text: round(curve.miss_rate[v], 6)
                                                      for text, v in args.fractions}}
    say = write_output(args.output, json.dumps(report, indent=1) + "\n")
    width = max(len(t.name) for t in tables)
    say(f"{args.algorithm.upper()} miss rate (share of a batch's unique rows not cached) at batch "
        f"{tables.batch_size:,}, per cache fraction of each table's rows:")
    say(f"{'table':{width}s} {'unique/batch':>13s} " + " ".join(f"{text:>8s}" for text, _ in args.fractions))
    for name, entry in report["tables"].items():
        say(f"{name:{width}s} {entry['unique_per_batch']:13,.0f} "
            + " ".join(f"{entry['miss_rate'][text]:8.3f}" for text, _ in args.fractions)
            + ("  (replayed)" if entry["method"] == "replayed" else ""))
    if args.output != STDOUT:
        say(f"wrote {args.output}")
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

    from ..constants import CACHE_ALGORITHMS
    p = tsub.add_parser("cache", help="miss rates of device caches holding a fraction of each table",
                        description="Per table, the miss rate of a device cache holding each fraction of its rows "
                                    "(the share of a batch's unique rows not in the cache before the batch, at "
                                    "steady state, at the file's batch size), predicted from the table's access "
                                    "description; recorded lookups are replayed (neuroshard/datasets/cache_model.py).")
    add_input(p, "tables", "tables file (JSON)")
    p.add_argument("--fractions", type=_fractions, default=_fractions("0.01,0.05,0.2"), metavar="F,F,...",
                   help="cache sizes as fractions of each table's rows, each in (0, 1] (default: 0.01,0.05,0.2)")
    p.add_argument("--algorithm", choices=CACHE_ALGORITHMS, default="lru",
                   help="eviction: lru (least recently used) or lfu (least frequently used) (default: lru)")
    p.add_argument("--history", type=int_in(1, 10**9, "a batch count"), default=None, metavar="BATCHES",
                   help="lfu: the batches its counts cover (default: a long run, the steady state)")
    p.add_argument("-o", "--output", required=True, help="report to write (JSON; - for standard output)")
    p.set_defaults(func=_cache)
