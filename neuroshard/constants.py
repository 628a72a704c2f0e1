"""Named constants: one place for every fact the package uses in more than one module.

Units are in the names (``_BYTES``, ``_GBPS``). A module that needs one of these imports
it from here; none writes the literal again.
"""
from __future__ import annotations

# ------------------------------------------------------------------ element sizes
#: bytes per element of each precision a plan can name (weights or communication)
PRECISION_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}
#: bytes of one fp32 value (weights, pooled embeddings, gradients)
FP32_BYTES = PRECISION_BYTES["fp32"]
#: the precisions the all-to-all may send (``comm_precision``)
COMM_PRECISIONS = ("fp32", "fp16", "bf16")
#: bytes per element the exchange sends at each communication precision
COMM_ELEMENT_BYTES = {p: PRECISION_BYTES[p] for p in COMM_PRECISIONS}

# ------------------------------------------------------------------ batch sizes
#: the GLOBAL batch of a tables file that does not state one (samples per iteration over all devices)
TABLES_BATCH_SIZE = 65536
#: the batch the shipped cost data is measured at on a CPU: one device's share of a
#: 64k-256k global batch that one CPU thread runs in milliseconds (``measure``, ``collect``,
#: the analytic models, the device timer)
MEASURED_BATCH_SIZE = 4096

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
#: a table too large for a device and narrower than twice this is cut into row blocks (TorchRec's count
#: of them), not first into column strips (``search.rowwise.split_for_memory``; TorchRec's planner makes
#: no column strip narrower than this either: MIN_CW_DIM). Every strip does all of its table's lookups,
#: and a narrow row's lookup costs nearly a wide one's. Measured (experiments/split_work.py, dlrm-2021's
#: 110M-row, 16-wide table on two devices beside six hot tables, AMD EPYC): whole 51.3 ms of total work,
#: four column strips 96.9 ms, four row blocks 58.7 ms; a 32-wide table 39.1, 61.0 and 40.9 ms; a
#: 128-wide one 29.9, 34.0 and 31.3 ms (experiments/results/split_work_dlrm2021/output.txt)
MIN_COLUMN_SHARD_DIM = 128
#: which row splits a search may make: "torchrec", only the block counts TorchRec runs (one host's
#: ranks, or all ranks: every plan exports); "any", also 2, 4, ... blocks on any devices (NeuroShard's
#: runtime and ``measure`` run them, the TorchRec exporter refuses them; measured-greedy always makes
#: them). Measured (experiments/row_blocks.py, criteo-terabyte, 8 devices, seed 161, AMD EPYC): two
#: pooling-100 tables of 25.6M rows cost 26 and 25 ms alone, each device's slowest; placed with the rest,
#: the two cut into 8 row blocks added 30.5 ms of total work (+18%, slowest device 1.06x size-lookup's),
#: into column halves 21.1 ms (+12%, 1.06x), into row halves 7.6 ms (+4%, 0.91x); A/A 1.02x
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
#: the clocks a kernel benchmark may time with (``costmodels.measure.kernel``; ``thread``: CPU only)
CLOCKS = ("thread", "wall")
#: a kernel benchmark's timed runs per shard set, at least (``collect compute`` and Python alike) ...
KERNEL_REPEATS = 7
#: ... and at most while the runs still vary more than the target coefficient of variation
KERNEL_MAX_REPEATS = 15
#: an interleaved timing run of devices (``measure``, calibration, refine): timed passes over all
#: devices (a device's figure: ``costmodels.measure.timing.device_time``, see TIMING_REFERENCE) ...
TIMING_PASSES = 5
#: ... whole passes run first and not counted (each kernel also runs once, untimed, when it is built) ...
TIMING_WARMUP_PASSES = 0
#: ... and timed runs per device and pass (the pass's figure is their median), at least; ...
TIMING_REPEATS = 3
#: ... a device whose sizing runs (TIMING_REPEATS, before its first pass, not counted) took less than
#: this (ms) runs more in every pass, up to TIMING_MAX_REPEATS, so that a pass's runs add up to about
#: this much (experiments/timing_noise.py, criteo-kaggle's 3-5 ms devices, 4 copies of one plan in
#: one run: the max device moved 3.5-4.0% between copies at 8 devices and 1.0% at 16 with passes of
#: 30 ms, 1.5% and 0.5% with passes of 150 ms; devices of 50 ms and more run TIMING_REPEATS as before)
TIMING_MIN_PASS_MS = 150.0
TIMING_MAX_REPEATS = 60
#: an interleaved timing run of two or more devices times a reference device (one of them, of
#: median work) right before every device's turn, and a device's figure is the median over its
#: passes of its time relative to the reference beside it, times the reference's fastest turn
#: (``costmodels.measure.timing``): the machine's speed moves in phases (a neighbour on the other
#: core, frequency) that a fastest pass only partly escapes. experiments/reference_timing.py,
#: criteo-kaggle at 8 devices, mean |log A/A| of the max device 9.9% with the fastest raw pass, 2.5%
#: relative to the reference (AMD EPYC, 4 runs); 5.0% and 1.5% (Intel Xeon, 3 runs, session 17) ...
TIMING_REFERENCE = True
#: ... whose turn runs this share of the runs of its own passes (rounded up)
TIMING_REFERENCE_SHARE = 0.25
#: a NeuroShard process allocates with PyTorch's huge pages (HUGE_PAGES_ENV, set when the package is
#: imported unless the environment sets it; the training runtime's ranks inherit it), and an
#: interleaved timing run also advises its weights buffer into transparent huge pages (2 MiB,
#: ``kernels.advise_huge_pages``: for a process whose first allocation came before the import; Linux
#: with THP mode ``madvise`` or ``always``): a lookup into a table of hundreds of MiB then misses the
#: TLB far less (a GPU keeps its tables in large pages too). experiments/huge_pages.py --processes,
#: criteo-terabyte at 8 devices, 24 devices of 3 plans, a fresh process per run, 6 runs each way in
#: alternation (AMD EPYC, family 25, session 28): a device's share of its run moved 3.2% (median
#: coefficient of variation) with huge pages and 7.9% without (3.2% and 6.9% in a first such run);
#: the weights buffer's advice alone, in one process, 4.9% against 4.3% (no gain)
TIMING_HUGE_PAGES = True
#: PyTorch's CPU allocator advises huge pages for allocations of 2 MiB and more when this is "1"
#: (read once, at the process's first allocation: set before a rank starts)
HUGE_PAGES_ENV = "THP_MEM_ALLOC_ENABLE"
#: the cache flush a CPU kernel benchmark reads before every timed run (a size: bytes, 8MiB; 0: none),
#: when this environment variable sets it (``costmodels.measure.kernel.default_flush_bytes``; default:
#: 1.25x the last-level cache, at most 512 MiB). A VM may report a whole host's cache (300 MiB on an
#: Intel Xeon, session 17: a 393 MB flush, 30 ms a run); the test suite sets 8 MiB, since it checks the
#: flows, not the figures. Whether stored data was measured on this CPU is still judged by the
#: cache-sized flush
FLUSH_BYTES_ENV = "NEUROSHARD_FLUSH_BYTES"
#: the size of a transparent huge page on x86-64 and arm64 Linux
HUGE_PAGE_BYTES = 2**21

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

#: random device-sized sets a calibration times when none is asked for (``search --calibrate``)
CALIBRATION_SETS = 200
#: fewest and most random sets a calibration may time
MIN_CALIBRATION_SETS, MAX_CALIBRATION_SETS = 8, 100000
#: who makes refine's final choice (``search --refine N --judge``): ``kernel``, refine's own instrument
#: (the fused kernel, device by device, caches flushed: ``neuroshard measure``'s protocol), or
#: ``runtime``, the plans trained together on the included runtime (``runtime.judge.RuntimeJudge``)
REFINE_JUDGES = ("kernel", "runtime")
#: where ``collect compute`` draws shard sets from: random augmented sets, or devices of searched plans
COLLECT_SET_SOURCES = ("random", "plans")

#: the terms of one training iteration, per rank, in the order the included runtime runs them
#: (issue 31): ``neuroshard estimate`` predicts them, ``neuroshard evaluate -o`` measures them, so
#: prediction and measurement line up term by term; ``iteration_ms`` is the step-to-step wall period
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

#: steps each plan runs in a row when several plans train in one run (``RunConfig.turn``, formats
#: revision 32). The first step of a turn is its switch step and is not measured: its barrier waits
#: for the previous plan's slowest rank, and its caches hold the previous plan's rows. With turns of
#: one step (A B A B, before revision 32) the waiting an unbalanced plan causes (its busy rank's
#: embedding backward and next input) landed in the next plan's step: on hot-few seed 61 at 2
#: processes (2026-12-05, session 40) NeuroShard's balanced plan measured 150-156 ms alone against
#: 175-198 for dim's and size's, and 168-170 interleaved against 160-166: the interleaved run put
#: the balanced plan last, the order the iteration model's misses of issue 31 had
TURN_STEPS = 3

#: candidates whose predicted training step is within this fraction of the chosen plan's are a tie for
#: the iteration objective (``provenance.objective.ties``, formats revision 33; ``search`` says so).
#: Over 645 pairs of plans of one configuration at 2 processes, measured in turns on this project's
#: CPU (2026-12-05, session 41, ``experiments/iteration_ranking_ceiling.py``), the pair trained in the
#: predicted order 57% of the time when predicted less than 1% apart, 68% at 1-2%, 77% at 2-3%, 86% at
#: 3-5%, 91% at 5-10%, 98% beyond: under 3% the prediction does not say which of the two trains faster
#: there (at 3 processes on 2 cores, 48-62% up to 10% apart: ``estimate`` says when ranks share cores)
ITERATION_TIE_MARGIN = 0.03

#: what ``shard`` ranks plans by: the embedding cost (the slowest device's compute and exchange,
#: the default) or the predicted training iteration (``search.iteration``, dense part included)
OBJECTIVES = ("embedding", "iteration")
