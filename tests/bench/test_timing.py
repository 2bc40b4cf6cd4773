"""The suite's one timer (bench.harness.timing.measure) on CPU: warm-up by calls and by time,
the first call apart, input sets rotated, a setup before every call, the stats it reports and
why there is no graph time here (graph replay is GPU-only: its use is checked by -m gpu)."""
import time

import pytest
import torch

from bench.harness import timing
from bench.harness.timing import Timing, measure, quantile, rotation_count, spread


def test_measure_warms_rotates_and_says_how_it_timed():
    calls = []
    fns = [lambda i=i: (calls.append(i), time.sleep(0.0005)) for i in range(3)]
    t0 = time.perf_counter()
    t = measure(fns, device="cpu", rep=7, warm_s=0.03)
    assert time.perf_counter() - t0 >= 0.03
    assert t.extra["warm"]["seconds"] >= 0.03 and t.extra["warm"]["calls"] >= 3
    timed = calls[-7:]  # the reps rotate through every set in turn
    assert timed == [0, 1, 2, 0, 1, 2, 0]
    assert t.samples == 7 and t.median >= 0.0005 and t.q20 <= t.median <= t.q80
    assert t.extra["rotation"] == 3 and t.extra["timed_by"] == "host clock (CPU)"
    assert t.extra["graph_ms"] is None and "CPU" in t.extra["graph_note"]
    assert t.extra["events_ms"] is None and t.extra["host_ms"] == pytest.approx(t.median * 1e3)


def test_one_callable_its_first_call_apart_and_a_warm_up_by_count():
    calls = []

    def fn():
        calls.append(len(calls))
        time.sleep(0.02 if len(calls) == 1 else 0.0001)   # the first call "compiles"

    t = measure(fn, device="cpu", rep=5, warmup=3)
    assert len(calls) == 3 + 5 and t.extra["warm"]["calls"] == 2   # the first call counts
    assert t.first_call >= 0.02 > t.median and t.samples == 5


def test_min_time_extends_the_reps_of_a_short_call():
    t = measure(lambda: None, device="cpu", rep=3, min_time_s=0.01)
    assert 3 < t.samples <= 300


def test_setup_runs_before_every_call_and_rules_out_graphs():
    seen = []
    state = {}
    t = measure(lambda: seen.append(state["i"]), device="cpu", rep=4,
                setup=lambda i: state.__setitem__("i", i))
    assert seen[-4:] == [0, 1, 2, 3] and t.samples == 4
    with pytest.raises(ValueError, match="at least one"):
        measure([], device="cpu")


def test_timing_from_samples_and_the_quantiles():
    t = Timing.of([0.003, 0.001, 0.002], first_call=0.5, note="x")
    assert (t.median, t.samples, t.first_call, t.extra) == (0.002, 3, 0.5, {"note": "x"})
    assert quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.2) == pytest.approx(1.8)
    assert t.as_dict()["median_ms"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="at least one sample"):
        Timing.of([])


def test_rotation_count_covers_twice_the_cache(monkeypatch):
    monkeypatch.setattr(timing, "cache_bytes", lambda device=None: 50 * 2**20)
    assert rotation_count(10 * 2**20) == 10        # 10 sets x 10 MiB = 2 x 50 MiB
    assert rotation_count(30 * 2**20) == 4         # ceil(100 / 30)
    assert rotation_count(500 * 2**20) == 2        # always at least two sets
    assert rotation_count(1) == timing.MAX_ROTATION
    with pytest.raises(ValueError, match="set_bytes"):
        rotation_count(0)
    monkeypatch.undo()
    assert timing.cache_bytes("cpu") > 0


def test_spread_is_max_over_min_minus_one():
    assert spread([0.057, 0.175]) == pytest.approx(0.175 / 0.057 - 1)
    assert spread([2.0]) == 0.0
    assert spread([1.0, 1.1, 1.05]) == pytest.approx(0.1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_measure_on_cuda_times_graph_replays_and_host_apart():
    n = 8 * 2**20
    pairs = [(torch.randn(n, device="cuda"), torch.empty(n, device="cuda")) for _ in range(3)]
    t = measure([lambda s=s, d=d: d.copy_(s) for s, d in pairs], device="cuda", rep=10,
                warm_s=0.2, graph=True)
    assert t.extra["timed_by"] == "cuda-graph replay" and t.extra["graph_ms"] > 0
    assert t.extra["events_ms"] > 0 and t.extra["host_ms"] > 0
    assert t.extra["warm"]["seconds"] >= 0.2
    eager = measure(lambda: pairs[0][1].copy_(pairs[0][0]), device="cuda", rep=5, flush_l2=True)
    assert eager.extra["timed_by"] == "cuda events (eager)" and eager.median > 0
