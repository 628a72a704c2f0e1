"""``neuroshard collect compute|comm|merge``: measure cost data (registered by ``neuroshard.cli``)."""
from __future__ import annotations

import argparse

from ...cli_options import add_input, add_output, add_weights_precision
from ...constants import (
    CLOCKS,
    COLLECT_SET_SOURCES,
    DEFAULT_MAX_ROWS,
    KERNEL_MAX_REPEATS,
    KERNEL_REPEATS,
    MEASURED_BATCH_SIZE,
)
from ...errors import NeuroShardError
from ...execution.kernels import TIMED_OPTIMIZERS, kernel_names
from ...validate import (
    MAX_DEVICES,
    batch_size_int,
    float_in,
    int_in,
    memory_size,
    nonneg_float,
    positive_float,
    positive_int,
    probability,
    seed_int,
)


def _flush_bytes(text: str) -> int | None:
    if text == "auto":
        return None
    return 0 if text.strip() in ("0", "none") else memory_size(text)


def _compute(args: argparse.Namespace) -> int:
    from ...execution.launch import local_rank, torchrun_env
    from ...measured.collect import collect_compute, parse_dims
    if args.max_repeats < args.repeats:
        raise NeuroShardError(f"--max-repeats {args.max_repeats} is below --repeats {args.repeats}")
    rank, world_size = torchrun_env() or (0, 1)
    measured = collect_compute(
        args.tables, args.samples, args.out, max_tables=args.max_tables_per_device,
        memory_bytes=args.memory, batch_size=args.batch_size, dims=parse_dims(args.dims),
        seed=args.seed, row_split_prob=args.row_split_prob, backend=args.device, kernel=args.kernel,
        max_rows=args.row_cap, warmup=args.warmup, repeats=args.repeats, max_repeats=args.max_repeats,
        target_cv=args.target_cv, optimizer=args.optimizer, clock=args.clock,
        progress=not args.no_progress and local_rank() == 0, flush_bytes=args.flush_bytes,
        max_minutes=args.max_minutes, weights_precision=args.weights_precision, sets=args.sets,
        rank=rank, world_size=world_size, local_rank=local_rank())
    if world_size > 1:
        share = len(range(rank, args.samples, world_size))
        print(f"{args.out}: rank {rank} of {world_size} measured {measured} shard sets now ({share} of the "
              f"{args.samples} are its share)")
    else:
        print(f"{args.out}: measured {measured} shard sets now ({args.samples} asked for in all)")
    return 0


def _merge(args: argparse.Namespace) -> int:
    from . import store
    records, parts = store.merge_parts(args.folder, store.COMPUTE_FILE)
    comm_records, comm_parts = store.merge_parts(args.folder, store.COMM_FILE) if store.part_files(
        args.folder, store.COMM_FILE) else (0, 0)
    if not parts + comm_parts:
        print(f"{args.folder}: no part files to merge")
    if parts:
        print(f"{args.folder}: merged {parts} part files into {store.COMPUTE_FILE} ({records} shard sets)")
    if comm_parts:
        print(f"{args.folder}: merged {comm_parts} part files into {store.COMM_FILE} ({comm_records} samples)")
    return 0


def _comm(args: argparse.Namespace) -> int:
    from ...execution.launch import torchrun_env
    from ...measured.collect import collect_comm
    rank, world_size = torchrun_env() or (0, 1)
    if world_size > 1:
        raise NeuroShardError(f"collect comm starts its own --devices processes: run it once, without torchrun "
                              f"(this is rank {rank} of {world_size})")
    measured = collect_comm(
        args.devices, args.samples, args.out, batch_size=args.batch_size, max_width=args.max_width,
        max_skew_ms=args.max_skew_ms, max_reduce_width=args.max_reduce_width, seed=args.seed,
        backend=args.device, warmup=args.warmup, repeats=args.repeats, timeout_s=args.timeout,
        progress=not args.no_progress, max_minutes=args.max_minutes)
    print(f"{args.out}: measured {measured} samples now ({args.samples} asked for in all)")
    return 0


def _dense(args: argparse.Namespace) -> int:
    from .dense import collect_dense
    models = collect_dense(args.out, args.size, progress=lambda part: print(f"measuring {part} ...", flush=True))
    print(models.format_metrics())
    print(f"wrote {args.out}")
    return 0


def _overheads(args: argparse.Namespace) -> int:
    from ...runtime.overheads import CALIBRATION_CONFIGS, calibrate_overheads
    from ...validate import check_output
    from .. import resolve_cost_models
    from ..dense import load_operator_models
    check_output(args.out, [args.cost_model], "operator-costs file")  # the --operator-costs file may be rewritten
    operators = load_operator_models(args.operator_costs)
    fitted = calibrate_overheads(
        resolve_cost_models(args.cost_model), operators, CALIBRATION_CONFIGS, iterations=args.iterations,
        progress=lambda c: print(f"training {c[0]} x{c[1]}, {c[3].name}, batch {c[4]} on {c[5]} processes ...",
                                 flush=True))
    for term, per in fitted.overheads_.items():
        print(f"  {term:20s} " + "  ".join(f"{r} ranks: +{a:.3f} ms, x{b:.2f}" for r, (a, b) in sorted(per.items())))
    fitted.save(args.out)
    print(f"wrote {args.out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``collect compute``, ``collect comm``, ``collect dense`` and ``collect merge``."""
    collect = sub.add_parser("collect", help="measure kernel and communication costs",
                             description="Measure real costs into a cost-data folder (resumable: rerun the "
                                         "same command to finish an interrupted run).")
    csub = collect.add_subparsers(dest="collect_command", required=True, metavar="WHAT")

    p = csub.add_parser("compute", help="time fused forward+backward of random shard sets",
                        description="Time random augmented shard sets (1..K tables of a tables file, widths "
                                    "halved down to the smallest of --dims, under --memory) as one fused kernel.")
    add_input(p, "tables", "tables file (neuroshard.tables/v1)", metavar="TABLES.json")
    p.add_argument("--samples", type=positive_int, required=True,
                   help="shard sets in the dataset (in all, across reruns)")
    add_output(p, "dataset folder (compute.jsonl, meta.json)", dest="out", aliases=("--out",), required=True,
               metavar="DIR")
    p.add_argument("--max-tables-per-device", type=int_in(1, 1024, "a table count"), default=8,
                   help="most shards in one set (default 8)")
    p.add_argument("--memory", type=memory_size, default="1GiB", help="per-device memory cap of a set (default 1GiB)")
    p.add_argument("--batch-size", type=batch_size_int, default=MEASURED_BATCH_SIZE, help=f"samples per batch (default {MEASURED_BATCH_SIZE} on CPU)")
    p.add_argument("--dims", default="4..128", help="width ladder: 4..128 (halving) or a list 16,32,64")
    p.add_argument("--seed", type=seed_int, default=0, help="sample i is drawn from seed+i (default 0)")
    p.add_argument("--row-split-prob", type=probability, default=0.2, help="share of shards that are row slices")
    p.add_argument("--sets", choices=COLLECT_SET_SOURCES, default="random",
                   help="random augmented sets (default), or devices of plans searched on random tasks of the "
                        "tables (4-16 devices, 5-40 tables per device): the sets the search asks about")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where kernels run: cpu or cuda (default cpu)")
    p.add_argument("--kernel", default="auto", choices=("auto", *kernel_names()), help="fused kernel (default auto)")
    p.add_argument("--row-cap", "--max-rows", dest="row_cap", type=positive_int, default=DEFAULT_MAX_ROWS,
                   help="rows allocated at most per shard; ids are folded (default 1000000; the same word as "
                        "measure, train and evaluate: --max-rows is its old name)")
    p.add_argument("--optimizer", default="exact_sgd", choices=TIMED_OPTIMIZERS, help="(default exact_sgd)")
    p.add_argument("--clock", default="auto", choices=("auto", *CLOCKS),
                   help="auto (thread CPU time on cpu, CUDA events on cuda), thread or wall (default auto)")
    add_weights_precision(p)
    p.add_argument("--warmup", type=int_in(0, 10000), default=2)
    p.add_argument("--repeats", type=int_in(1, 10000), default=KERNEL_REPEATS,
                   help=f"timed repeats at least (default {KERNEL_REPEATS})")
    p.add_argument("--max-repeats", type=int_in(1, 10000), default=KERNEL_MAX_REPEATS,
                   help=f"timed repeats at most while cv > --target-cv (default {KERNEL_MAX_REPEATS})")
    p.add_argument("--target-cv", type=nonneg_float, default=0.05)
    p.add_argument("--flush-bytes", type=_flush_bytes, default="auto", help="cache-flush buffer read before each repeat "
                                                          "(default auto: $NEUROSHARD_FLUSH_BYTES when set, else 1.25 x "
                                                          "last-level cache, at most 512MiB)")
    p.add_argument("--max-minutes", type=positive_float, default=None,
                   help="stop cleanly after this long (rerun continues)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_compute, torchrun_rank=True)

    p = csub.add_parser("comm", help="time all-to-alls between real processes",
                        description="Start --devices processes on torch.distributed (gloo on cpu, NCCL on cuda) "
                                    "and time forward/backward all-to-alls and row-wise reductions of random "
                                    "per-device widths and start skews.")
    p.add_argument("--devices", type=int_in(2, MAX_DEVICES, "a device count >= 2"), required=True,
                   help="number of devices (processes), >= 2")
    p.add_argument("--samples", type=positive_int, required=True,
                   help="samples in the dataset (in all, across reruns)")
    add_output(p, "dataset folder (comm.jsonl, meta.json)", dest="out", aliases=("--out",), required=True,
               metavar="DIR")
    p.add_argument("--batch-size", type=batch_size_int, default=MEASURED_BATCH_SIZE,
                   help="global batch split across devices (default 4096)")
    p.add_argument("--max-width", type=int_in(4, 2**20, "a width >= 4"), default=2048,
                   help="largest per-device width (default 2048)")
    p.add_argument("--max-skew-ms", type=float_in(0.0, 60000.0, what="milliseconds"), default=30.0,
                   help="largest start skew (default 30 ms)")
    p.add_argument("--max-reduce-width", type=int_in(0, 2**20, "a width"), default=256,
                   help="largest row-wise reduce width (default 256)")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the exchange runs: cpu (gloo) or cuda (NCCL) (default cpu)")
    p.add_argument("--warmup", type=int_in(0, 10000), default=2)
    p.add_argument("--repeats", type=int_in(1, 10000), default=7)
    p.add_argument("--timeout", type=float_in(1.0, 86400.0, what="seconds"), default=60.0,
                   help="seconds before a silent device ends the run")
    p.add_argument("--max-minutes", type=positive_float, default=None,
                   help="stop cleanly after this long (rerun continues)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_comm)

    p = csub.add_parser("merge", help="fold the parts of a torchrun collection into one file",
                        description="Fold the per-rank parts of a folder (compute.rank{r}-of{W}.jsonl, written "
                                    "by collect compute under torchrun) into compute.jsonl: one record per sample, "
                                    "parts measured differently refused; the parts are removed only once the "
                                    "merged file is safely written. Readers merge parts anyway: this only tidies.")
    p.add_argument("folder", metavar="DIR", help="cost-data folder")
    p.set_defaults(func=_merge)

    p = csub.add_parser("dense", help="time the dense part of a training step and its overheads",
                        description="Time the operators of a training step besides the embeddings on this "
                                    "machine (linear layers, interactions, loss, optimizer step, data loading, "
                                    "gloo all-reduce and barrier between 2-4 processes, the embedding kernel's "
                                    "forward share) and fit the operator cost models the iteration-time model "
                                    "uses (`neuroshard estimate --operator-costs`). About 5 minutes; rerunning "
                                    "an interrupted run measures only the parts the file lacks.")
    add_output(p, "operator-costs file to write (OPS.json)", dest="out", aliases=("--out",), required=True,
               metavar="OPS.json")
    p.add_argument("--size", choices=("full", "quick"), default="full",
                   help="samples per part: full (default) or quick (a smoke test, under a minute)")
    p.set_defaults(func=_dense)

    p = csub.add_parser("overheads", help="measure the runtime's overheads beyond its operators in real runs",
                        description="Train a few small configurations (their own tables, dense models and "
                                    "batches) on 2 and 3 real processes, compare each term of the iteration "
                                    "with the operator models' prediction, and fit per term and process count "
                                    "the overhead (fixed ms per step) and slowdown (scale) that real runs add. "
                                    "Writes the operator-costs file with them; `neuroshard estimate` applies "
                                    "them. About 3 minutes; run it after `collect dense`.")
    p.add_argument("--operator-costs", default=None, metavar="OPS.json",
                   help="operator cost models to add the overheads to (default: the shipped ones)")
    p.add_argument("--cost-model", default=None, metavar="MODEL.pt", help="embedding cost-model checkpoint "
                                                                          "(default: the shipped one)")
    p.add_argument("--iterations", type=int_in(4, 1000, "an iteration count"), default=12,
                   help="measured iterations per plan (default 12)")
    add_output(p, "operator-costs file to write (may be the --operator-costs file)", dest="out",
               aliases=("--out",), required=True, metavar="OPS.json")
    p.set_defaults(func=_overheads)
