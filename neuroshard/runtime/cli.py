"""Subcommands of this stage (registered by ``neuroshard.cli``): ``train`` and ``evaluate``.

Both start one process per device themselves, or run under ``torchrun`` (one
process per device started by it: ``RANK``/``WORLD_SIZE`` in the environment).
"""
from __future__ import annotations

import argparse
import logging

from ..kernels import DEFAULT_MAX_ROWS, KERNELS

log = logging.getLogger(__name__)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plan", required=True, help="plan file (neuroshard.plan/v1)")
    p.add_argument("--tables", required=True, help="tables file (neuroshard.tables/v1)")
    p.add_argument("--devices", type=int, default=None,
                   help="processes to run (default: the plan's num_devices; under torchrun: its world size)")
    p.add_argument("--batch-size", type=int, default=None, help="global batch size (default: the tables file's)")
    p.add_argument("--lr", type=float, default=0.1, help="SGD learning rate, dense and embeddings (default: 0.1)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and synthetic batches (default: 0)")
    p.add_argument("--row-cap", type=int, default=None,
                   help="most rows a shard allocates; lookups beyond fold onto them "
                        f"(default: {DEFAULT_MAX_ROWS:,}, the kernel benchmark's max rows)")
    p.add_argument("--kernel", default="auto", choices=("auto",) + KERNELS,
                   help="fused embedding kernel of each device (default: auto, as the kernel benchmark picks: "
                        "fbgemm_tbe when fbgemm is importable, else embedding_bag)")
    p.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"),
                   help="torch.distributed backend (default: nccl with GPUs, else gloo)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds without progress after which the run is stopped (default: 120)")


def _load(args: argparse.Namespace):
    from ..plan import Plan
    from ..tables import TableSet
    from .launch import torchrun_env
    plan, tables = Plan.read(args.plan), TableSet.read(args.tables)
    env = torchrun_env()
    devices = args.devices or (env[1] if env else plan.num_devices)
    options = {"lr": args.lr, "seed": args.seed, "backend": args.backend, "kernel": args.kernel,
               "timeout_s": args.timeout}
    if args.row_cap:
        options["row_cap"] = args.row_cap
    return plan, tables, devices, options


def _train(args: argparse.Namespace) -> int:
    from .trainer import RunConfig, check_run, run
    plan, tables, devices, options = _load(args)
    check_run(plan, tables, devices)
    batch_size = args.batch_size or tables.batch_size
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
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from .evaluate import evaluate
    plan, tables, devices, options = _load(args)
    measurement = evaluate(plan, tables, devices, iterations=args.iterations, warmup=args.warmup,
                           batch_size=args.batch_size, **options)
    if measurement is None:
        return 0
    print(measurement.format())
    if args.json:
        measurement.write_json(args.json)
        print(f"wrote {args.json}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this stage's subcommands."""
    p = sub.add_parser("train", help="train a DLRM whose embeddings are sharded by a plan",
                       description="Train a DLRM on synthetic batches (or the tables' recorded indices) "
                                   "with its embedding tables sharded as the plan says, one process per device.")
    _common(p)
    p.add_argument("--steps", type=int, default=20, help="training steps (default: 20)")
    p.set_defaults(func=_train)

    p = sub.add_parser("evaluate", help="measure what each device spends per iteration under a plan",
                       description="Run training iterations of a plan and report per device the measured "
                                   "embedding compute, forward and backward communication and their total "
                                   "(medians after warm-up), and the max over devices.")
    _common(p)
    p.add_argument("--iterations", type=int, default=20, help="measured iterations (default: 20)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up iterations, not measured (default: 3)")
    p.add_argument("--json", default=None, help="also write the measurement as JSON to this file")
    p.set_defaults(func=_evaluate)
