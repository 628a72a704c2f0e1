"""Subcommands of this stage (registered by ``neuroshard.cli``): ``train`` and ``evaluate``.

Both start one process per device themselves, or run under ``torchrun`` (one
process per device started by it: ``RANK``/``WORLD_SIZE`` in the environment).
"""
from __future__ import annotations

import argparse
import logging
import os

from ..cli_options import add_input, add_output, help_table
from ..constants import (
    DEFAULT_MAX_ROWS,
    EVALUATE_COLUMNS,
    HUGE_PAGES_ENV,
    ITERATION_TERMS,
    TIMING_PASSES,
    TIMING_REPEATS,
    TIMING_WARMUP_PASSES,
)
from ..execution.kernels import kernel_names
from ..validate import batch_size_int, device_count, float_in, nonneg_int, positive_float, positive_int, seed_int

log = logging.getLogger(__name__)

#: a global batch above this, trained on CPU processes, makes every step take seconds (the tables
#: files' usual 65,536 took 6.6 s a step on 2 cores): ``train`` and ``evaluate`` say so once
CPU_QUICK_BATCH = 16_384


def _common(p: argparse.ArgumentParser) -> None:
    add_input(p, "plan", "plan file (neuroshard.plan/v1)", metavar="PLAN.json")
    p.add_argument("--tables", required=True, help="tables file (neuroshard.tables/v1)")
    p.add_argument("--devices", type=device_count, default=None,
                   help="processes to run (default: the plan's num_devices; under torchrun: its world size)")
    p.add_argument("--batch-size", type=batch_size_int, default=None,
                   help="global batch size (default: the tables file's)")
    p.add_argument("--lr", type=positive_float, default=0.1,
                   help="SGD learning rate, dense and embeddings (default: 0.1)")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of weights and synthetic batches (default: 0)")
    p.add_argument("--row-cap", type=positive_int, default=None,
                   help="most rows a shard allocates; lookups beyond fold onto them "
                        f"(default: {DEFAULT_MAX_ROWS:,}, the kernel benchmark's max rows)")
    p.add_argument("--kernel", default="auto", choices=("auto",) + kernel_names(),
                   help="fused embedding kernel of each device (default: auto, as the kernel benchmark picks: "
                        "fbgemm_tbe when fbgemm is importable, else embedding_bag)")
    p.add_argument("--dist-backend", default="auto", choices=("auto", "gloo", "nccl"),
                   help="torch.distributed backend (default: nccl with GPUs, else gloo)")
    p.add_argument("--timeout", type=float_in(1.0, 86400.0, what="seconds"), default=120.0,
                   help="seconds without progress after which the run is stopped (default: 120)")
    p.add_argument("--model", default=None, metavar="MODEL.json",
                   help="the dense part to train (neuroshard.model/v1: dense features, bottom and top MLP widths, "
                        "dot or cat interaction; default: 13 dense features, MLPs of 64, dot)")


def _load(args: argparse.Namespace):
    from ..execution.launch import torchrun_env
    from ..plan import Plan
    from ..tables import TableSet
    tables = TableSet.read(args.tables)
    plan = Plan.read_checked(args.plan, tables)
    env = torchrun_env()
    devices = args.devices if args.devices is not None else (env[1] if env else plan.num_devices)
    options = {"lr": args.lr, "seed": args.seed, "backend": args.dist_backend, "kernel": args.kernel,
               "timeout_s": args.timeout}
    if args.model is not None:
        from ..model_spec import ModelSpec
        options["model"] = ModelSpec.read(args.model)
    if args.row_cap is not None:
        options["row_cap"] = args.row_cap
    return plan, tables, devices, options


def _warn_slow_cpu_batch(args: argparse.Namespace, batch_size: int) -> None:
    """One warning (rank 0 under torchrun) when the tables file's batch, not one asked for with
    ``--batch-size``, runs on CPU processes and is above ``CPU_QUICK_BATCH``."""
    from ..execution.launch import torchrun_env
    from .trainer import _device_kind
    env = torchrun_env()
    if args.batch_size is None and batch_size > CPU_QUICK_BATCH and _device_kind(args.dist_backend) == "cpu" \
            and (env is None or env[0] == 0):
        log.warning("batch %s on CPU: a step takes seconds; --batch-size %s for a quicker run", f"{batch_size:,}",
                    f"{CPU_QUICK_BATCH // 4:,}")


def _train(args: argparse.Namespace) -> int:
    from .trainer import RunConfig, check_run, run
    plan, tables, devices, options = _load(args)
    check_run(plan, tables, devices)
    batch_size = args.batch_size if args.batch_size is not None else tables.batch_size
    _warn_slow_cpu_batch(args, batch_size)
    result = run(RunConfig(plan, list(tables), devices, steps=args.steps, batch_size=batch_size, **options))
    if result is None:  # not rank 0 under torchrun
        return 0
    every = max(1, len(result.losses) // 10)
    for step, loss in enumerate(result.losses):
        if step % every == 0 or step == len(result.losses) - 1:
            print(f"step {step:5d}  loss {loss:.6f}")
    step_ms = sorted(max(r[step]["step_ms"] for r in result.records) for step in range(len(result.losses)))
    median = step_ms[len(step_ms) // 2]
    print(f"trained {len(result.losses)} steps on {devices} devices ({result.backend}) with kernel {result.kernel}, "
          f"batch {batch_size}: "
          f"median step {median:.2f} ms, {1e3 / median:.2f} iterations/s")
    if result.cache:
        from .cached import format_cache
        print(format_cache(result.cache))
    from .memory import format_memory
    print(format_memory(result.memory))
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from ..validate import check_output
    from .evaluate import evaluate
    if args.json:  # checked before the run: a finished measurement is never lost to a bad path
        check_output(args.json, [args.plan, args.tables], "measurement file")
    plan, tables, devices, options = _load(args)
    _warn_slow_cpu_batch(args, args.batch_size if args.batch_size is not None else tables.batch_size)
    measurement = evaluate(plan, tables, devices, iterations=args.iterations, warmup=args.warmup,
                           batch_size=args.batch_size, **options)
    if measurement is None:
        return 0
    print(measurement.format())
    if args.json:
        measurement.write_json(args.json)
        print(f"wrote {args.json}")
    return 0


def _measure(args: argparse.Namespace) -> int:
    from ..plan import Plan
    from ..tables import TableSet
    from ..validate import check_output
    from .measure_plan import measure_plans, plan_names
    if args.no_huge_pages:  # before this process's first allocation (HUGE_PAGES_ENV is read then)
        os.environ[HUGE_PAGES_ENV] = "0"
    paths = list(args.plans) + list(args.with_plans or [])
    output = check_output(args.output, [*paths, args.tables], "measurement file") if args.output else None
    tables = TableSet.read(args.tables)
    plans = dict(zip(plan_names(paths), (Plan.read_checked(p) for p in paths)))
    result = measure_plans(plans, tables, passes=args.passes, warmup_passes=args.warmup_passes,
                           repeats=args.repeats, batch_size=args.batch_size, row_cap=args.row_cap,
                           kernel=args.kernel, cost_models=args.cost_model, progress=True,
                           reference=not args.no_reference, huge_pages=not args.no_huge_pages)
    print(result.format())
    if output is not None:
        result.write_json(output)
        print(f"wrote {output}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this stage's subcommands."""
    p = sub.add_parser("train", help="train a DLRM whose embeddings are sharded by a plan",
                       description="Train a DLRM on synthetic batches (or the tables' recorded indices) "
                                   "with its embedding tables sharded as the plan says, one process per device.")
    _common(p)
    p.add_argument("--steps", type=positive_int, default=20, help="training steps (default: 20)")
    p.set_defaults(func=_train, torchrun_rank=True)

    p = sub.add_parser("evaluate", help="measure what each device spends per iteration under a plan",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Run training iterations of a plan and report per device the measured "
                                   "embedding compute, forward and backward communication and their total "
                                   "(medians after warm-up), and the max over devices.",
                       epilog=help_table("columns (medians over the measured iterations, ms):", EVALUATE_COLUMNS)
                       + "\n\n" + help_table("iteration terms (ms, per rank over its typical steps; NAME_ms in "
                                              "the last table and in the JSON's breakdown):",
                                              {name.removesuffix("_ms"): text for name, text in ITERATION_TERMS.items()}))
    _common(p)
    p.add_argument("--iterations", type=positive_int, default=20, help="measured iterations (default: 20)")
    p.add_argument("--warmup", type=nonneg_int, default=3, help="warm-up iterations, not measured (default: 3)")
    add_output(p, "also write the measurement as JSON to this file", dest="json", aliases=("--json",),
               metavar="OUT.json")
    p.set_defaults(func=_evaluate, torchrun_rank=True)

    p = sub.add_parser("measure", help="time every device of one or more plans on this machine, one at a time",
                       description="Time each device's shards as one fused kernel (forward, backward, update), "
                                   "one device at a time on one pinned thread, the devices of all plans taking "
                                   "turns round-robin; print per device the measured compute beside the cost "
                                   "model's estimate, and each plan's max device against the first plan's. "
                                   "Works for any device count; communication is modeled, not measured.")
    p.add_argument("plans", nargs="+", metavar="PLAN.json", help="plan files (neuroshard.plan/v1) of the same tables")
    p.add_argument("--with", dest="with_plans", nargs="+", metavar="PLAN.json", help="more plans to compare")
    p.add_argument("--tables", required=True, help="tables file (neuroshard.tables/v1)")
    p.add_argument("--passes", type=positive_int, default=TIMING_PASSES,
                   help=f"timed passes over all devices, round-robin; a device's figure is the median of its passes relative "
                        f"to a reference device timed before every turn (default: {TIMING_PASSES})")
    p.add_argument("--warmup-passes", type=nonneg_int, default=TIMING_WARMUP_PASSES,
                   help=f"passes run first and not counted (default: {TIMING_WARMUP_PASSES})")
    p.add_argument("--repeats", type=positive_int, default=TIMING_REPEATS,
                   help=f"timed runs per device and round (default: {TIMING_REPEATS})")
    p.add_argument("--no-reference", action="store_true",
                   help="no reference device: a device's figure is its fastest raw pass (docs/decisions.md#reference-device)")
    p.add_argument("--no-huge-pages", action="store_true",
                   help="keep the weights in the system's default pages (docs/decisions.md#huge-pages)")
    p.add_argument("--batch-size", type=batch_size_int, default=None,
                   help="batch each device looks up (default: the cost model's, 4096 for the shipped one)")
    p.add_argument("--row-cap", type=positive_int, default=DEFAULT_MAX_ROWS,
                   help=f"most rows a shard allocates; lookups beyond fold onto them (default: {DEFAULT_MAX_ROWS:,})")
    p.add_argument("--kernel", default="auto", choices=("auto",) + kernel_names(), help="fused kernel (default: auto)")
    p.add_argument("--cost-model", default=None, metavar="MODEL.pt",
                   help="cost models for the estimates (default: the shipped checkpoint)")
    add_output(p, "also write the measurement as JSON", aliases=("--json",), metavar="OUT.json")
    p.set_defaults(func=_measure)
