"""Subcommands of this stage (registered by ``neuroshard.cli``): ``pretrain``, ``costmodel show``."""
from __future__ import annotations

import argparse
import json
import sys

from ..cli_options import add_input, add_output, add_quiet, add_weights_precision
from ..validate import float_in, int_in, seed_int

#: maximum epochs of ``pretrain --data`` (early stopping on validation)
DATA_EPOCHS = 400


def _pretrain(args: argparse.Namespace) -> int:
    if args.here:
        return _pretrain_here(args)
    from ..errors import NeuroShardError
    from ..validate import check_output
    from .pretrain import format_table, pretrain
    for flag, given in (("--data", args.data), ("-o/--output", args.out)):
        if not given:
            raise NeuroShardError(f"pretrain needs {flag} (or --here: collect on this machine first)")
    for flag, given in (("--minutes", args.minutes), ("--size", args.size), ("--compute-sets", args.compute_sets),
                        ("--comm-sets", args.comm_sets), ("--device", args.device)):
        if given is not None:
            raise NeuroShardError(f"{flag} is an option of pretrain --here (it collects on this machine)")
    if args.quiet:
        raise NeuroShardError("-q/--quiet is an option of pretrain --here (it collects on this machine)")
    check_output(args.out, [], "checkpoint")
    check_output(args.out.with_suffix(".parity.png"), [], "parity plot")
    result = pretrain(args.data, args.comm_data or (), args.out, tune=args.tune, epochs=args.epochs or DATA_EPOCHS,
                      test_tables=args.test_tables, seed=args.seed, refit=not args.no_refit,
                      ensemble=args.ensemble or 0)
    summary = result.models.data_summary["compute"]
    print(f"compute: {summary['shard_sets']} measured shard sets over {summary['source_tables']} tables; "
          f"trained on {summary['train_sets']} (+{summary['val_sets']} validation), held out {summary['test_sets']} "
          f"sets of unseen tables, {summary['mixed_sets_set_aside']} mixed sets set aside")
    print(format_table(result.table))
    print(f"wrote {args.out} and {args.out.with_suffix('.parity.png')}")
    return 0


def _pretrain_here(args: argparse.Namespace) -> int:
    from ..cli_options import progress_mode
    from ..errors import NeuroShardError
    from ..measured.budget import Terminated, stop_on_sigterm
    from ..measured.machine import DEFAULT_MINUTES, pretrain_here
    from ..runtime.overheads import CALIBRATION_CONFIGS, calibrate_overheads
    from ..validate import check_output
    if args.data or args.comm_data:
        raise NeuroShardError("--here collects its own data on this machine: give --data/--comm-data without --here")
    if args.no_refit:
        raise NeuroShardError("--no-refit is not an option of --here (its checkpoint is refitted on all its data)")
    if args.out is not None:
        check_output(args.out, [], "checkpoint")
    try:
        with stop_on_sigterm():  # SIGTERM ends the run as Ctrl-C does: what was measured is on disk
            result = pretrain_here(args.minutes or DEFAULT_MINUTES, size=args.size or "default",
                                   backend=args.device or "cpu", compute_sets=args.compute_sets,
                                   comm_samples=args.comm_sets, epochs=args.epochs, ensemble=args.ensemble,
                                   test_tables=args.test_tables, tune=args.tune, seed=args.seed, out=args.out,
                                   overheads=calibrate_overheads, overhead_configs=CALIBRATION_CONFIGS,
                                   progress=progress_mode(args))
    except KeyboardInterrupt as stopped:
        print("pretrain --here: stopped; what was measured is kept: rerun the same command to continue",
              file=sys.stderr)
        return 143 if isinstance(stopped, Terminated) else 130
    print(result.report, end="")
    print(f"wrote {result.folder} (model.pt, operators.json, report.txt)"
          + (f" and {args.out}" if args.out is not None else "")
          + "; search, estimate, plan score and shard() use them on this machine by themselves")
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
    p = sub.add_parser("pretrain", help="train cost models on measured data, or on this machine (--here)",
                       description="Train the neural compute and communication models on measured cost data, "
                                   "compare them with gradient-boosted trees and the analytic model on tables "
                                   "held out of training, and save a checkpoint (+ a parity plot beside it). "
                                   "With --here, first measure this machine (compute sets like the search's, the "
                                   "exchange at 2 to min(cores, 4) processes, the dense operators and the "
                                   "runtime's overheads; tables of dlrm-2021, dlrm-2022 and broad only: "
                                   "criteo-kaggle, criteo-terabyte and hot-few stay held out), then fit, hold out "
                                   "and report, all within --minutes, into this machine's folder under "
                                   "$XDG_CACHE_HOME/neuroshard/machines/ (default ~/.cache): search, estimate, plan "
                                   "score and shard() then use its models by themselves on this machine "
                                   "(--cost-model and --operator-costs still choose others). Resumable: rerun the "
                                   "same command to continue an interrupted run.")
    p.add_argument("--here", action="store_true",
                   help="measure this machine, then pre-train on it, into its folder (no --data)")
    p.add_argument("--data", nargs="+", type=Path, metavar="DIR",
                   help="folders with compute.jsonl (+ meta.json), measured on one machine (required without --here)")
    p.add_argument("--comm-data", nargs="*", type=Path, metavar="DIR",
                   help="folders with comm.jsonl, one per device count")
    add_output(p, "checkpoint to write (MODEL.pt; required without --here, where it is a copy of the machine's)",
               dest="out", aliases=("--out",), type=Path, metavar="MODEL.pt")
    p.add_argument("--tune", type=int_in(0, 10000, "a trial count"), default=0, metavar="N",
                   help="optuna trials over width/depth/lr/weight decay")
    p.add_argument("--epochs", type=int_in(1, 100000, "an epoch count"), default=None,
                   help=f"maximum epochs (early stopping on validation; default {DATA_EPOCHS}, with --here 80, "
                        f"--size tiny 5)")
    p.add_argument("--test-tables", type=float_in(0.0, 1.0, low_open=True, what="a fraction"), default=0.25,
                   help="share of source tables held out (default 0.25)")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--ensemble", type=int_in(0, 64, "a member count (0, or 2 and up)"), default=None, metavar="K",
                   help="also fit K neural compute models on bootstrap resamples and ship them as an ensemble: the "
                        "search then charges each device set its members' spread (default 0: one model; with "
                        "--here 3, --size tiny 2)")
    p.add_argument("--no-refit", action="store_true",
                   help="save the models trained on the training tables only (default: retrain the same recipe "
                        "on all data after the held-out evaluation)")
    here = p.add_argument_group("with --here")
    here.add_argument("--minutes", type=float_in(0.0, 24 * 60.0, low_open=True, what="minutes"), default=None,
                      help="wall-clock budget, split over the stages by fixed shares (default 25: the whole "
                           "command within 30 minutes on a 2-core machine)")
    here.add_argument("--size", choices=("default", "tiny"), default=None,
                      help="default, or tiny: a smoke test of the command (a minute or two, with --minutes 4 or more: "
                           "each stage's share of a smaller budget may not time the sets it needs) whose model is "
                           "not worth searching with")
    here.add_argument("--compute-sets", type=int_in(18, 10**6, "a set count >= 18"), default=None, metavar="N",
                      help="shard sets to measure in all (default: as many as the compute share of the budget "
                           "allows)")
    here.add_argument("--comm-sets", type=int_in(6, 10**6, "a sample count >= 6"), default=None, metavar="N",
                      help="exchange samples per device count (default: as many as the budget allows)")
    here.add_argument("--device", choices=("cpu", "cuda"), default=None,
                      help="where the kernels and the exchange run (default cpu; cuda: the GPU's name joins the "
                           "machine's fingerprint)")
    add_quiet(here, "no progress lines (the report is still printed)")
    p.set_defaults(func=_pretrain)

    from ..constants import CALIBRATION_SETS, MAX_CALIBRATION_SETS, MIN_CALIBRATION_SETS
    p = sub.add_parser("calibrate", help="correct the cost models for this machine and these tables",
                       description="Time the task's tables on this machine (each table alone, then random "
                                   "device-sized sets of them) and fit the pre-trained compute model's set-size "
                                   "correction (level and crowding) on the measurements; prints the held-out error "
                                   "before and after.")
    add_input(p, "tables", "tables file (neuroshard.tables/v1) of the task")
    p.add_argument("--cost-model", default=None, metavar="MODEL.pt",
                   help="pre-trained checkpoint (default: this machine's own from pretrain --here, else the "
                        "shipped one)")
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
