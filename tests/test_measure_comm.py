"""Communication benchmark: real gloo processes, real deaths (kill -9, SIGSTOP, early exit)."""
import os
import signal
import time

import pytest

from neuroshard.constants import batch_shares
from neuroshard.costmodels.samples.comm import CommBenchmark
from neuroshard.errors import NeuroShardError


def test_batch_shares():
    assert batch_shares(10, 3) == [4, 3, 3]
    assert sum(batch_shares(4096, 3)) == 4096


def _check_measures(bench, devices):
    pids = bench.pids
    assert len(set(pids)) == devices and os.getpid() not in pids
    widths = [16 * (d + 1) for d in range(devices)]
    m = bench.measure(widths, [0.0] * devices, reduce_width=8)
    assert len(m.fwd_ms) == len(m.bwd_ms) == len(m.reduce_ms) == devices
    assert all(x > 0 for x in m.fwd_ms + m.bwd_ms + m.reduce_ms)
    assert m.cv_fwd >= 0
    # the last device starts 40 ms late: the others wait for it inside their forward
    skewed = bench.measure(widths, [0.0] * (devices - 1) + [40.0], reduce_width=0)
    assert min(skewed.fwd_ms[:-1]) > 25.0, skewed.fwd_ms
    assert skewed.fwd_ms[-1] < min(skewed.fwd_ms[:-1])
    assert skewed.reduce_ms == [0.0] * devices
    # uneven widths, one device with none
    assert len(bench.measure([0] + widths[1:], None, 4).fwd_ms) == devices


@pytest.mark.gloo
def test_two_devices_then_one_hangs():
    bench = CommBenchmark(2, batch_size=512, warmup=1, repeats=3, timeout_s=30).start()
    try:
        _check_measures(bench, 2)
        os.kill(bench.pids[0], signal.SIGSTOP)  # hung, not dead
        t0 = time.monotonic()
        with pytest.raises(NeuroShardError, match="did not answer"):
            bench.measure([8, 8], timeout_s=2)
        assert time.monotonic() - t0 < 15
    finally:
        bench.close()


@pytest.mark.gloo
def test_three_devices_then_one_exits_early():
    bench = CommBenchmark(3, batch_size=512, warmup=1, repeats=3, timeout_s=30).start()
    try:
        _check_measures(bench, 3)
        t0 = time.monotonic()
        with pytest.raises(NeuroShardError, match="device 2"):
            bench.measure([8, 8, 8], _exit_early=2)
        assert time.monotonic() - t0 < 15
    finally:
        bench.close()


@pytest.mark.gloo
def test_four_devices_then_one_is_killed():
    bench = CommBenchmark(4, batch_size=256, warmup=1, repeats=2, timeout_s=30).start()
    try:
        m = bench.measure([4, 8, 12, 16], [0, 1, 2, 3], 4)
        assert len(m.fwd_ms) == 4 and all(x > 0 for x in m.bwd_ms)
        os.kill(bench.pids[1], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(NeuroShardError, match="device 1"):
            bench.measure([8, 8, 8, 8])
        assert time.monotonic() - t0 < 15
    finally:
        bench.close()
    assert bench.pids == []


def test_bad_input():
    with pytest.raises(NeuroShardError, match="at least 2 devices"):
        CommBenchmark(1)
    with pytest.raises(NeuroShardError, match="unknown backend"):
        CommBenchmark(2, backend="mpi")
    with pytest.raises(NeuroShardError, match="not running"):
        CommBenchmark(2).measure([4, 4])
