"""Named constants: one place for every fact the package uses in more than one module.

Units are in the names (``_BYTES``, ``_GBPS``). A module that needs one of these imports
it from here; none writes the literal again.
"""
from __future__ import annotations

from pathlib import Path

# ------------------------------------------------------------------ files shipped with the package
#: the cost-model checkpoints shipped with the package (``cpu-default.pt``), readable by name
SHIPPED_CHECKPOINTS = Path(__file__).resolve().parent / "checkpoints"

# ------------------------------------------------------------------ element sizes
#: bytes per element of each precision a plan can name (weights or communication)
PRECISION_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}
#: bytes of one fp32 value (weights, pooled embeddings, gradients)
FP32_BYTES = PRECISION_BYTES["fp32"]
#: the precisions the all-to-all may send (``comm_precision``)
COMM_PRECISIONS = ("fp32", "fp16", "bf16")
#: bytes per element the exchange sends at each communication precision
COMM_ELEMENT_BYTES = {p: PRECISION_BYTES[p] for p in COMM_PRECISIONS}
#: weight element types a kernel trains with, by bytes per element (a plan's ``bytes_per_element``)
WEIGHTS_PRECISIONS = {p: PRECISION_BYTES[p] for p in ("fp32", "fp16")}
#: precisions a plan's ``bytes_per_element`` may name that no kernel here trains with
UNTRAINABLE_PRECISIONS = {"int8": PRECISION_BYTES["int8"]}


def precision_of(bytes_per_element: int) -> str:
    """The weights' element type a plan's ``bytes_per_element`` stands for (``fp32`` for
    sizes that name no other: 8, 3, ...)."""
    names = {b: name for name, b in {**WEIGHTS_PRECISIONS, **UNTRAINABLE_PRECISIONS}.items()}
    return names.get(int(bytes_per_element), "fp32")


def trained_precision(bytes_per_element: int) -> str:
    """The weights precision a kernel trains for ``bytes_per_element``: fp16 for 2, else fp32
    (int8 and 8-byte weights count in memory only)."""
    precision = precision_of(bytes_per_element)
    return precision if precision in WEIGHTS_PRECISIONS else "fp32"


# ------------------------------------------------------------------ batch sizes
#: the GLOBAL batch of a tables file that does not state one (samples per iteration over all devices)
TABLES_BATCH_SIZE = 65536
#: the batch the shipped cost data is measured at on a CPU: one device's share of a
#: 64k-256k global batch that one CPU thread runs in milliseconds (``measure``, ``collect``,
#: the analytic models, the device timer)
MEASURED_BATCH_SIZE = 4096


def batch_shares(batch_size: int, world_size: int) -> list[int]:
    """Samples of the global batch each rank owns after the forward all-to-all (the
    first ``batch_size % world_size`` ranks get one more)."""
    base, extra = divmod(batch_size, world_size)
    return [base + (1 if q < extra else 0) for q in range(world_size)]


# ------------------------------------------------------------------ hosts
#: devices per host of a common GPU server, and TorchRec's default LOCAL_WORLD_SIZE
RANKS_PER_HOST = 8


def default_local_world_size(world_size: int) -> int:
    """Ranks per host when none is stated, TorchRec's rule: ``RANKS_PER_HOST``, or all of
    the ranks when their number is not a multiple of it."""
    return RANKS_PER_HOST if world_size % RANKS_PER_HOST == 0 else world_size


# ------------------------------------------------------------------ hardware defaults
#: GB/s (10**9 bytes per second) within a host: TorchRec's INTRA_NODE_BANDWIDTH (NVLink)
DEFAULT_INTRA_HOST_GBPS = 600.0
#: GB/s per device across hosts: TorchRec's CROSS_NODE_BANDWIDTH (one 100 Gbit/s NIC per GPU)
DEFAULT_INTER_HOST_GBPS = 12.5

#: the measured communication models serve plans of up to this many times the largest device
#: count they were measured at; beyond, the exchange is bytes over the GPU-cluster defaults
COMM_EXTRAPOLATION = 4

# ------------------------------------------------------------------ memory tiers
#: where a shard's rows live (a plan shard's ``memory``): device memory, host memory, SSD
MEMORY_TIERS = ("device", "host", "ssd")
#: GB/s from host memory to one device: TorchRec's HBM_TO_DDR_MEM_BW (a PCIe 4.0 x16 link)
DEFAULT_HOST_LINK_GBPS = 32.0
#: GB/s of random reads from a host's SSD (one data-centre NVMe drive, PCIe 4.0), shared by its devices
DEFAULT_SSD_GBPS = 6.0
#: random reads per second of a host's SSD (the same drive), shared by its devices
DEFAULT_SSD_IOPS = 1_000_000
#: the smallest SSD read (one flash page): a missed row smaller than this still reads it
SSD_READ_BYTES = 4096
#: device bytes a cache keeps per cached row besides the row (its row id and LRU/LFU state, 2 x int64)
CACHE_ROW_OVERHEAD_BYTES = 16
#: cache fractions the search chooses from (a table cached at all keeps at least 1% of its rows)
CACHE_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75)
#: the tiering pass fills at most this share of the devices' memory, leaving room to pack shards
TIER_PACKING_HEADROOM = 0.85

# ------------------------------------------------------------------ layouts
#: a table replicated on every device (not a shard layout): TorchRec's name
DATA_PARALLEL = "data_parallel"
#: TorchRec's sharding types, the layouts a table may take (``types.layout_kind`` names them)
SHARDING_TYPES = ("table_wise", "column_wise", "row_wise", "table_row_wise", "grid_shard", DATA_PARALLEL)
#: a table too large for a device and narrower than twice this is cut into TorchRec's row blocks, not
#: column strips (``search.rowwise.split_for_memory``; TorchRec's MIN_CW_DIM):
#: docs/decisions.md#narrow-tables-by-rows
MIN_COLUMN_SHARD_DIM = 128
#: which row splits a search may make: "torchrec", only the block counts TorchRec runs (every plan
#: exports); "any", also 2, 4, ... blocks on any devices (NeuroShard's runtime runs them, the TorchRec
#: exporter refuses them): docs/decisions.md#row-blocks-torchrec-default
ROW_BLOCKS = ("torchrec", "any")
DEFAULT_ROW_BLOCKS = "torchrec"


def block_counts(num_devices: int, local_world_size: int | None = None, row_blocks: str = DEFAULT_ROW_BLOCKS
                 ) -> list[int]:
    """The row block counts a search may cut a table into (``ROW_BLOCKS``):
    TorchRec's (one host's ranks, ``local_world_size`` or TorchRec's default, and all
    ranks), and with ``"any"`` also every power of two below the devices."""
    local = local_world_size or default_local_world_size(num_devices)
    counts = {local, num_devices}
    if row_blocks == "any":
        counts |= {2 ** k for k in range(1, num_devices.bit_length())}
    return sorted(c for c in counts if c > 1) or [num_devices]


# ------------------------------------------------------------------ the measured loop
#: ``search --data-parallel``: never replicate a table, or replicate where it pays (``search.replicate``)
DATA_PARALLEL_CHOICES = ("never", "auto")
DEFAULT_DATA_PARALLEL = "never"
#: the clocks a kernel benchmark may time with (``costmodels.samples.kernel``; ``thread``: CPU only)
CLOCKS = ("thread", "wall")
# Timing words, one meaning each: a timing *run* times every device of one or more plans, interleaved,
# in *passes* over all the devices; in a pass a device runs timed *repeats* (the pass's figure is
# their median). The measured loop counts in the same words (``measured.refine``: REFINE_PASSES,
# COMPARE_PASSES, COMPARE_REPEATS, FINALIST_RUNS, FINAL_CHECK_RUNS); its *rounds* are refine rounds.
#: a kernel benchmark's timed repeats per shard set, at least (``collect compute`` and Python alike) ...
KERNEL_REPEATS = 7
#: ... and at most, while they still vary more than the target coefficient of variation
KERNEL_MAX_REPEATS = 15
#: passes of a timing run (``measure``, calibration, refine; a device's figure:
#: ``costmodels.samples.timing.device_time``) ...
TIMING_PASSES = 5
#: ... whole passes run first and not counted ...
TIMING_WARMUP_PASSES = 0
#: ... and timed repeats per device and pass, at least; ...
TIMING_REPEATS = 3
#: ... more, up to TIMING_MAX_REPEATS, for a device whose sizing repeats took less than this (ms), so a
#: pass lasts about this long: docs/decisions.md#timing-passes
TIMING_MIN_PASS_MS = 150.0
TIMING_MAX_REPEATS = 60
#: a timing run of two or more devices times a reference device before every device's turn, and a
#: device's figure is the median of its passes relative to it: docs/decisions.md#reference-device ...
TIMING_REFERENCE = True
#: ... whose turn runs this share of the repeats of its own passes (rounded up)
TIMING_REFERENCE_SHARE = 0.25
#: time in transparent huge pages: HUGE_PAGES_ENV set at import unless the environment sets it, and a
#: timing run's weights advised into 2 MiB pages (``execution.kernels.advise_huge_pages``): docs/decisions.md#huge-pages
TIMING_HUGE_PAGES = True
#: PyTorch's CPU allocator advises huge pages for allocations of 2 MiB and more when this is "1"
#: (read once, at the process's first allocation: set before a rank starts)
HUGE_PAGES_ENV = "THP_MEM_ALLOC_ENABLE"
#: overrides the cache flush a CPU kernel benchmark reads before every timed repeat (a size: bytes,
#: "8MiB"; 0: none; default 1.25x the last-level cache, at most 512 MiB; the test suite sets 8 MiB):
#: docs/decisions.md#flushed-kernel-timing
FLUSH_BYTES_ENV = "NEUROSHARD_FLUSH_BYTES"
#: the size of a transparent huge page on x86-64 and arm64 Linux
HUGE_PAGE_BYTES = 2**21
#: most rows a shard allocates, in measurement and training alike; lookups beyond fold (row % cap)
DEFAULT_MAX_ROWS = 1_000_000

#: TorchRec's compute kernels (``EmbeddingComputeKernel`` values) a training plan's shards may run:
#: device memory (``fused``, ``dense``), host memory (``fused_uvm``), host memory behind a device
#: cache (``fused_uvm_caching``), SSD behind a device cache (``key_value``)
COMPUTE_KERNELS = ("fused", "dense", "fused_uvm", "fused_uvm_caching", "key_value")

#: a device with this much memory or more is taken for a GPU (a warning when the cost models are a CPU's)
GPU_LIKE_MEMORY_BYTES = 8 * 2**30

#: what ``evaluate``'s per-device columns mean (its --help, docs/cli.md); all are medians over the
#: measured iterations, in ms
EVALUATE_COLUMNS = {
    "compute_ms": "embedding forward + backward + update of the device's shards as one fused kernel, on the "
                  "clock the cost data uses (this thread's CPU time on CPU): what the compute model predicts",
    "fwd_comm_ms": "forward all-to-all of the pooled embeddings, wall time including waiting for the slowest rank",
    "bwd_comm_ms": "backward all-to-all of their gradients, wall time",
    "allreduce_ms": "all-reduce of replicated (data-parallel) tables' gradients (only when the plan has some)",
    "total_ms": "compute + communication per iteration (the median of the per-iteration sums): the device's "
                "cost, what the plan's estimate predicts",
    "compute_wall_ms": "compute_ms on the wall clock (it counts time the thread waited for a core)",
    "dense_ms": "the dense model's forward and backward (not part of the plan's cost)",
    "step_ms": "the whole training iteration on the wall clock, dense part included",
}

#: cache eviction policies a table's device cache may use (TorchRec's CacheAlgorithm: LRU, LFU)
CACHE_ALGORITHMS = ("lru", "lfu")

#: random device-sized sets a calibration times when none is asked for (``search --calibrate``;
#: docs/decisions.md#set-size-and-shard-corrections)
CALIBRATION_SETS = 200
#: fewest and most random sets a calibration may time
MIN_CALIBRATION_SETS, MAX_CALIBRATION_SETS = 8, 100000
#: who makes refine's final choice (``search --refine N --judge``): ``kernel``, refine's own instrument
#: (``neuroshard measure``'s protocol), or ``runtime``, the plans trained together on the included
#: runtime (``runtime.judge.RuntimeJudge``): docs/decisions.md#runtime-judge
REFINE_JUDGES = ("kernel", "runtime")
#: where ``collect compute`` draws shard sets from: random augmented sets, or devices of searched plans
COLLECT_SET_SOURCES = ("random", "plans")

#: the terms of one training iteration, per rank, in the order the included runtime runs them:
#: ``neuroshard estimate`` predicts them, ``neuroshard evaluate -o`` measures them, so prediction and
#: measurement line up term by term; ``iteration_ms`` is the step-to-step wall period
ITERATION_TERMS = {
    "input_ms": "data loading: the batch's lookups sampled and turned into the kernel's inputs (cache moves "
                "included), host-side work before the step starts",
    "sync_ms": "the barrier that starts the step together: waiting for the slowest rank's input, and the "
               "barrier's own latency",
    "emb_fwd_ms": "embedding forward of the rank's shards (one fused kernel), wall time",
    "fwd_comm_ms": "forward all-to-all of the pooled embeddings, waiting for the slowest sender included",
    "dense_fwd_ms": "the dense model's forward (bottom MLP, interaction, top MLP) and the loss",
    "dense_bwd_ms": "the dense model's backward, the all-reduce excluded",
    "dense_allreduce_ms": "all-reduce of the dense gradients (data-parallel MLPs), wall time from launch to done",
    "optimizer_ms": "the dense optimizer's step (and zeroing the gradients)",
    "bwd_comm_ms": "backward all-to-all of the embedding gradients, wall time",
    "emb_bwd_ms": "embedding backward and the fused update of the rank's shards, wall time",
    "allreduce_ms": "all-reduce of replicated (data-parallel) tables' gradients (only when the plan has some)",
    "other_ms": "the rest of the period: host-side work between the terms (Python, bookkeeping)",
}

#: steps each plan runs in a row when several plans train in one run (``RunConfig.turn``); a turn's
#: first step is not measured: docs/decisions.md#turns-of-three-steps
TURN_STEPS = 3

#: candidates whose predicted training step is within this fraction of the chosen plan's tie for the
#: iteration objective (``provenance.objective.ties``; ``search`` says so):
#: docs/decisions.md#iteration-tie-margin
ITERATION_TIE_MARGIN = 0.03

#: what ``shard`` ranks plans by: the embedding cost (the slowest device's compute and exchange, the
#: default: docs/decisions.md#iteration-tie-margin) or the predicted training iteration
#: (``search.iteration``, dense part included)
OBJECTIVES = ("embedding", "iteration")
