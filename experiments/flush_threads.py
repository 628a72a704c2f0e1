"""Does the cache flush give the same figures when two cores read it? (session 18, not adopted)

    python experiments/flush_threads.py [FAMILY]

The lookup plan of one task (8 devices, seed 139) timed with ``measure``'s protocol (a flush
before every timed run, the thread clock, the sized runs of ``time_devices``), each device
alternately after a flush read by one core (the default) and by two (``KernelBenchmark``
with ``torch.set_num_threads(2)`` around the flush only), six times each, on one pinned
thread. Prints each device's median under both and the geometric mean of the ratios, and
the wall time each spent. On the Intel Xeon of session 18 (L3 300 MiB, a 393 MB flush) the
two-core flush took 15-18 ms against 29-36 ms, but the kernels measured 7% faster after it:
it leaves part of the device's data cached, so the instrument keeps the one-core flush.
"""
import os
import sys
import time

import numpy as np
import torch

from neuroshard.costmodels.loading import load_cost_models
from neuroshard.costmodels.measure.kernel import KernelBenchmark
from neuroshard.costmodels.measure.timing import _device_times, _build, _sized_runs
from neuroshard.constants import TIMING_REPEATS, TIMING_MIN_PASS_MS, TIMING_MAX_REPEATS
from neuroshard.datasets.families import family_tasks
from neuroshard.kernels import DEFAULT_MAX_ROWS, resolve_kernel, weights_numel
from neuroshard.search.api import shard


def main() -> None:
    fam = sys.argv[1] if len(sys.argv) > 1 else "criteo-kaggle"
    devices = 8
    models = load_cost_models(None)
    tables, memory = family_tasks(fam, devices, 1, (8, 12), seed=139)[0]
    plan = shard(tables, devices=devices, memory=memory, algorithm="lookup", cost_models=models, seed=0)
    kernel = resolve_kernel("auto", "cpu")
    benches = {t: KernelBenchmark(backend="cpu", kernel=kernel, batch_size=models.batch_size, warmup=0,
                                  repeats=TIMING_REPEATS, max_repeats=TIMING_REPEATS) for t in (1, 2)}

    def _flush_on_two_cores(bench=benches[2]):
        """The benchmark's flush, read by two cores (the timed thread one of them)."""
        previous = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            KernelBenchmark._flush(bench)  # allocates the buffer once, then sums it (on two threads here)
        finally:
            torch.set_num_threads(previous)

    benches[2]._flush = _flush_on_two_cores
    turns = [_device_times(plan.shards_on(d), tables, models.batch_size, DEFAULT_MAX_ROWS)
             for d in range(devices) if plan.shards_on(d)]
    buffer = torch.full((max(weights_numel(dt.shapes, kernel) for dt in turns),), 0.01)
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})  # one pinned thread, as time_devices
    res = {t: [[] for _ in turns] for t in (1, 2)}
    wall = {1: 0.0, 2: 0.0}
    for dt in turns:
        _build(dt, kernel, torch.device("cpu"), "exact_sgd", buffer)
        dt.repeats = _sized_runs(benches[1], dt, TIMING_REPEATS, TIMING_MIN_PASS_MS, TIMING_MAX_REPEATS)
    for k in range(6):
        for i, dt in enumerate(turns):
            for t in ((1, 2) if k % 2 == 0 else (2, 1)):
                s = time.perf_counter()
                res[t][i].append(benches[t].time_fused(dt.fused, dt.prepared, dt.repeats).cost_ms)
                wall[t] += time.perf_counter() - s
    for i, dt in enumerate(turns):
        a, b = np.median(res[1][i]), np.median(res[2][i])
        print(f"device {i}: runs {dt.repeats}, 1-core flush {a:.3f} ms, 2-core {b:.3f} ms, ratio {b/a:.4f}")
    r = [np.median(res[2][i]) / np.median(res[1][i]) for i in range(len(turns))]
    print(f"{fam}: geomean ratio 2-core/1-core {np.exp(np.mean(np.log(r))):.4f}; "
          f"wall {wall[1]:.1f} s vs {wall[2]:.1f} s")


if __name__ == "__main__":
    main()
