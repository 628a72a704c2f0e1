"""``neuroshard collect compute|comm``: measure cost data (registered by ``neuroshard.cli``)."""
from __future__ import annotations

import argparse

from ...kernels import DEFAULT_MAX_ROWS


def _flush_bytes(text: str) -> int | None:
    from ...units import parse_bytes
    if text == "auto":
        return None
    return 0 if text.strip() in ("0", "none") else parse_bytes(text)


def _compute(args: argparse.Namespace) -> int:
    from ...units import parse_bytes
    from .collect import collect_compute, parse_dims
    measured = collect_compute(
        args.tables, args.samples, args.out, max_tables=args.max_tables_per_device,
        memory_bytes=parse_bytes(args.memory), batch_size=args.batch_size, dims=parse_dims(args.dims),
        seed=args.seed, row_split_prob=args.row_split_prob, backend=args.backend, kernel=args.kernel,
        max_rows=args.max_rows, warmup=args.warmup, repeats=args.repeats, max_repeats=args.max_repeats,
        target_cv=args.target_cv, optimizer=args.optimizer, clock=args.clock, progress=not args.no_progress,
        flush_bytes=_flush_bytes(args.flush_bytes), max_minutes=args.max_minutes)
    print(f"{args.out}: measured {measured} shard sets now ({args.samples} asked for in all)")
    return 0


def _comm(args: argparse.Namespace) -> int:
    from .collect import collect_comm
    measured = collect_comm(
        args.devices, args.samples, args.out, batch_size=args.batch_size, max_width=args.max_width,
        max_skew_ms=args.max_skew_ms, max_reduce_width=args.max_reduce_width, seed=args.seed,
        backend=args.backend, warmup=args.warmup, repeats=args.repeats, timeout_s=args.timeout,
        progress=not args.no_progress, max_minutes=args.max_minutes)
    print(f"{args.out}: measured {measured} samples now ({args.samples} asked for in all)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``collect compute`` and ``collect comm``."""
    collect = sub.add_parser("collect", help="measure kernel and communication costs",
                             description="Measure real costs into a cost-data folder (resumable: rerun the "
                                         "same command to finish an interrupted run).")
    csub = collect.add_subparsers(dest="collect_command", required=True, metavar="WHAT")

    p = csub.add_parser("compute", help="time fused forward+backward of random shard sets",
                        description="Time random augmented shard sets (1..K tables of a tables file, widths "
                                    "halved down to the smallest of --dims, under --memory) as one fused kernel.")
    p.add_argument("--tables", required=True, help="tables file (neuroshard.tables/v1)")
    p.add_argument("--samples", type=int, required=True, help="shard sets in the dataset (in all, across reruns)")
    p.add_argument("--out", required=True, help="dataset folder (compute.jsonl, meta.json)")
    p.add_argument("--max-tables-per-device", type=int, default=8, help="most shards in one set (default 8)")
    p.add_argument("--memory", default="1GiB", help="per-device memory cap of a set (default 1GiB)")
    p.add_argument("--batch-size", type=int, default=4096, help="samples per batch (default 4096 on CPU)")
    p.add_argument("--dims", default="4..128", help="width ladder: 4..128 (halving) or a list 16,32,64")
    p.add_argument("--seed", type=int, default=0, help="sample i is drawn from seed+i (default 0)")
    p.add_argument("--row-split-prob", type=float, default=0.2, help="share of shards that are row slices")
    p.add_argument("--backend", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--kernel", default="auto", help="auto, fbgemm_tbe or embedding_bag (default auto)")
    p.add_argument("--max-rows", type=int, default=DEFAULT_MAX_ROWS, help="rows allocated at most per shard; "
                                                                      "ids are folded (default 1000000)")
    p.add_argument("--optimizer", default="exact_sgd", help="exact_sgd or exact_rowwise_adagrad")
    p.add_argument("--clock", default="auto", help="auto (thread CPU time on cpu, CUDA events on cuda), wall")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7, help="timed repeats at least (default 7)")
    p.add_argument("--max-repeats", type=int, default=15, help="timed repeats at most while cv > --target-cv")
    p.add_argument("--target-cv", type=float, default=0.05)
    p.add_argument("--flush-bytes", default="auto", help="cache-flush buffer read before each repeat "
                                                          "(default auto: 1.25 x last-level cache, at most 512MiB)")
    p.add_argument("--max-minutes", type=float, default=None, help="stop cleanly after this long (rerun continues)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_compute)

    p = csub.add_parser("comm", help="time all-to-alls between real processes",
                        description="Start --devices processes on torch.distributed (gloo on cpu, NCCL on cuda) "
                                    "and time forward/backward all-to-alls and row-wise reductions of random "
                                    "per-device widths and start skews.")
    p.add_argument("--devices", type=int, required=True, help="number of devices (processes), >= 2")
    p.add_argument("--samples", type=int, required=True, help="samples in the dataset (in all, across reruns)")
    p.add_argument("--out", required=True, help="dataset folder (comm.jsonl, meta.json)")
    p.add_argument("--batch-size", type=int, default=4096, help="global batch split across devices (default 4096)")
    p.add_argument("--max-width", type=int, default=2048, help="largest per-device width (default 2048)")
    p.add_argument("--max-skew-ms", type=float, default=30.0, help="largest start skew (default 30 ms)")
    p.add_argument("--max-reduce-width", type=int, default=256, help="largest row-wise reduce width (default 256)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="cpu", help="cpu (gloo) or cuda (NCCL)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a silent device ends the run")
    p.add_argument("--max-minutes", type=float, default=None, help="stop cleanly after this long (rerun continues)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_comm)
