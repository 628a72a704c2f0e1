"""Subcommands of this stage (registered by ``neuroshard.cli``): ``pretrain``, ``costmodel show``."""
from __future__ import annotations

import argparse
import json

from ..cli_options import add_input, add_output, add_weights_precision
from ..validate import float_in, int_in, seed_int


def _pretrain(args: argparse.Namespace) -> int:
    from ..validate import check_output
    from .pretrain import format_table, pretrain
    check_output(args.out, [], "checkpoint")
    check_output(args.out.with_suffix(".parity.png"), [], "parity plot")
    result = pretrain(args.data, args.comm_data or (), args.out, tune=args.tune, epochs=args.epochs,
                      test_tables=args.test_tables, seed=args.seed, refit=not args.no_refit,
                      ensemble=args.ensemble)
    summary = result.models.data_summary["compute"]
    print(f"compute: {summary['shard_sets']} measured shard sets over {summary['source_tables']} tables; "
          f"trained on {summary['train_sets']} (+{summary['val_sets']} validation), held out {summary['test_sets']} "
          f"sets of unseen tables, {summary['mixed_sets_set_aside']} mixed sets set aside")
    print(format_table(result.table))
    print(f"wrote {args.out} and {args.out.with_suffix('.parity.png')}")
    return 0


def _show_operators(path) -> int:
    """``costmodel show OPS.json``: an operator-costs file's hardware, each model's held-out
    error and the overheads of real runs."""
    from .dense import OperatorModels
    ops = OperatorModels.read(path)
    hw = ops.hardware_
    print(f"{path}: operator cost models ({len(ops.samples_)} timed shapes) measured on {hw.get('cpu_model', '?')}, "
          f"{hw.get('cpu_count', '?')} cores")
    print(ops.format_metrics())
    if ops.overheads_:
        runs = len({p.get("run") for p in ops.overhead_points_})
        print(f"  overheads of real runs ({runs} runs; measured = fixed + scale x predicted, per term and ranks):")
        for term, per in ops.overheads_.items():
            print(f"    {term:20s} " + "  ".join(f"{r} ranks: +{a:.3f} ms, x{b:.2f}" for r, (a, b) in sorted(per.items())))
    else:
        print("  no overheads of real runs (`neuroshard collect overheads` measures them)")
    return 0


def _show(args: argparse.Namespace) -> int:
    from .base import CostModels
    from .checkpoint import read_checkpoint, shipped_checkpoint
    if args.model.suffix == ".json":  # operator cost models (`collect dense`), or a file that is neither
        from ..errors import NeuroShardError
        from ..validate import read_json
        from .dense import OPERATOR_COSTS_FORMAT
        data = read_json(args.model, "cost-model file")
        if not (isinstance(data, dict) and data.get("format") == OPERATOR_COSTS_FORMAT):
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise NeuroShardError(f"{args.model}: not a cost-model checkpoint (MODEL.pt) nor an operator-costs file "
                                  f"(format {found!r})"[:300])
        return _show_operators(args.model)
    payload = read_checkpoint(args.model)
    CostModels.load(args.model, payload)  # a checkpoint whose models do not load is refused, not shown
    print(f"{shipped_checkpoint(args.model)}: {payload['name']}, batch size {payload['batch_size']}, feature schema "
          f"v{payload['feature_schema_version']}")
    print(f"  compute: {payload['compute']['class']}   comm: {payload['comm']['class']}")
    print(f"  hardware: {json.dumps(payload.get('hardware', {}))}")
    print(f"  data: {json.dumps(payload.get('data_summary', {}).get('compute', {}))}")
    for key, metrics in payload.get("metrics", {}).items():
        print(f"  {key:24s} " + "  ".join(f"{k}={v:.4g}" for k, v in metrics.items() if isinstance(v, (int, float))))
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from ..measured.calibrate import calibrate
    from ..tables import TableSet
    from ..validate import check_output
    from . import resolve_cost_models
    check_output(args.output, [args.tables, args.cost_model], "checkpoint")
    tables = TableSet.read(args.tables)
    calibrated, report = calibrate(tables, resolve_cost_models(args.cost_model), devices=args.devices,
                                   sets=args.sets, seed=args.seed, weights_precision=args.weights_precision)
    calibrated.save(args.output)
    print(report.format())
    print(f"wrote {args.output} ({calibrated.name})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this stage's subcommands."""
    from pathlib import Path
    p = sub.add_parser("pretrain", help="train cost models on measured data",
                       description="Train the neural compute and communication models on measured cost data, "
                                   "compare them with gradient-boosted trees and the analytic model on tables "
                                   "held out of training, and save a checkpoint (+ a parity plot beside it).")
    p.add_argument("--data", required=True, nargs="+", type=Path, metavar="DIR",
                   help="folders with compute.jsonl (+ meta.json), measured on one machine")
    p.add_argument("--comm-data", nargs="*", type=Path, metavar="DIR",
                   help="folders with comm.jsonl, one per device count")
    add_output(p, "checkpoint to write (MODEL.pt)", dest="out", aliases=("--out",), required=True, type=Path,
               metavar="MODEL.pt")
    p.add_argument("--tune", type=int_in(0, 10000, "a trial count"), default=0, metavar="N",
                   help="optuna trials over width/depth/lr/weight decay")
    p.add_argument("--epochs", type=int_in(1, 100000, "an epoch count"), default=400,
                   help="maximum epochs (early stopping on validation)")
    p.add_argument("--test-tables", type=float_in(0.0, 1.0, low_open=True, what="a fraction"), default=0.25,
                   help="share of source tables held out (default 0.25)")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--ensemble", type=int_in(0, 64, "a member count (0, or 2 and up)"), default=0, metavar="K",
                   help="also fit K neural compute models on bootstrap resamples and ship them as an ensemble: the "
                        "search then charges each device set its members' spread (default 0: one model)")
    p.add_argument("--no-refit", action="store_true",
                   help="save the models trained on the training tables only (default: retrain the same recipe "
                        "on all data after the held-out evaluation)")
    p.set_defaults(func=_pretrain)

    from ..constants import CALIBRATION_SETS, MAX_CALIBRATION_SETS, MIN_CALIBRATION_SETS
    p = sub.add_parser("calibrate", help="correct the cost models for this machine and these tables",
                       description="Time the task's tables on this machine (each table alone, then random "
                                   "device-sized sets of them) and fit the pre-trained compute model's set-size "
                                   "correction (level and crowding) on the measurements; prints the held-out error "
                                   "before and after.")
    add_input(p, "tables", "tables file (neuroshard.tables/v1) of the task")
    p.add_argument("--cost-model", default=None, metavar="MODEL.pt", help="pre-trained checkpoint (default: shipped)")
    p.add_argument("-d", "--devices", type=int_in(1, 1024, "a device count"), default=8,
                   help="devices the plans will use: random sets hold about tables/devices shards (default: 8)")
    p.add_argument("--sets", type=int_in(MIN_CALIBRATION_SETS, MAX_CALIBRATION_SETS, "a set count"), default=CALIBRATION_SETS,
                   help=f"random sets measured (default: {CALIBRATION_SETS})")
    p.add_argument("--seed", type=seed_int, default=0)
    add_weights_precision(p)
    p.add_argument("-o", "--output", required=True, help="calibrated checkpoint to write (MODEL.pt)")
    p.set_defaults(func=_calibrate)

    cm = sub.add_parser("costmodel", help="inspect cost-model checkpoints", description="Inspect checkpoints.")
    cm_sub = cm.add_subparsers(dest="costmodel_command", required=True, metavar="ACTION")
    p = cm_sub.add_parser("show", help="print a checkpoint's hardware, data and metrics")
    p.add_argument("model", type=Path, help="checkpoint (MODEL.pt), or operator cost models (OPS.json, "
                                            "`collect dense`)")
    p.set_defaults(func=_show)
