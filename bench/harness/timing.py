"""The one timer of the suite, and what its figures are computed with.

``measure`` times a call the way its figures can be trusted, on a GPU as on a CPU:

1. the first call is timed apart on the wall clock (``first_call``: compilation, autotuning);
2. warm-up: untimed passes over the input sets until at least ``warmup`` calls (the first
   included) and ``warm_s`` seconds have passed, so the GPU leaves its idle clocks (figures
   that must hold across processes use >= 0.2 s);
3. ``rep`` eager calls (more while ``min_time_s`` is not reached, for very short calls), each
   on the next input set of ``fns`` (``rotation_count`` sets: each call reads memory the cache
   no longer holds, as a request does). The host's time to issue a call is kept (``host_ms``);
   on CUDA, events bracket the call after a ``torch.cuda._sleep`` (and an L2 flush with
   ``flush_l2``), so the launch is queued before the GPU reaches it and the events time device
   work, not the host's launch (as ``triton.testing.do_bench`` does);
4. on CUDA with ``graph``: CUDA-graph replays of one call per set, the launch gaps gone.

The figures are the median and the 20% / 80% quantiles, never the mean (the host's outliers):
the graph's where there is one, else the events' (CUDA) or the host clock's (CPU, where calls
are synchronous, so the host time is the time).
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch

from bench.harness.env import has_cuda

Fns = Union[Callable[[], object], Sequence[Callable[[], object]]]
MAX_ROTATION = 64  # input sets at most; smaller sets than 2 x cache / 64 are flushed instead


def quantile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``xs``, interpolated between the two nearest samples."""
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class Timing:
    """Times of one benchmarked call, in seconds."""
    median: float
    q20: float
    q80: float
    samples: int
    first_call: Optional[float] = None  # wall time of the very first call (compile, autotune)
    extra: Dict[str, object] = field(default_factory=dict)

    @classmethod
    def of(cls, seconds: Sequence[float], first_call: Optional[float] = None, **extra) -> "Timing":
        """The figures of samples timed by hand (``seconds``: one a call)."""
        if not seconds:
            raise ValueError("seconds: expected at least one sample")
        return cls(median=statistics.median(seconds), q20=quantile(seconds, 0.2),
                   q80=quantile(seconds, 0.8), samples=len(seconds), first_call=first_call,
                   extra=extra)

    @property
    def median_ms(self) -> float:
        return self.median * 1e3

    def as_dict(self) -> Dict[str, object]:
        d = asdict(self)
        d["median_ms"] = self.median_ms
        return d


def _device(device) -> torch.device:
    return torch.device(device if device is not None else ("cuda" if has_cuda() else "cpu"))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_L2_FLUSH: Dict[int, torch.Tensor] = {}


def _flush_l2(device: torch.device) -> None:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    buf = _L2_FLUSH.get(idx)
    if buf is None:  # 256 MiB: larger than any current GPU's L2 (H100: 50 MiB, H200: 60 MiB)
        buf = _L2_FLUSH[idx] = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    buf.zero_()


def cache_bytes(device: Optional[torch.device] = None) -> int:
    """The last-level cache a timed call could be served from: the GPU's L2, or the CPU's
    largest cache (Linux sysfs; 32 MiB where it cannot be read)."""
    device = _device(device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(base):
            try:
                with open(os.path.join(base, entry, "size")) as f:
                    txt = f.read().strip().upper()
            except OSError:
                continue
            mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(txt[-1:], 1)
            best = max(best, int(txt.rstrip("KMG") or 0) * mult)
    except OSError:
        pass
    return best or 32 * 2**20


def rotation_count(set_bytes: int, device: Optional[torch.device] = None, factor: float = 2.0,
                   max_sets: int = MAX_ROTATION) -> int:
    """How many input sets of ``set_bytes`` to rotate through so that the memory touched between
    two uses of one set is >= ``factor`` x the cache (each call then reads cold memory):
    at least 2, at most ``max_sets``."""
    if set_bytes <= 0:
        raise ValueError(f"set_bytes: expected > 0, got {set_bytes}")
    need = -(-int(factor * cache_bytes(device)) // int(set_bytes))
    return int(min(max(2, need), max_sets))


def warm_clocks(fns: Sequence[Callable[[], object]], *, device: Optional[torch.device] = None,
                seconds: float = 0.2, calls: int = 0,
                setup: Optional[Callable[[int], object]] = None) -> Dict[str, float]:
    """Run ``fns`` in turn (whole passes, synchronised after each) until ``seconds`` of wall
    time and at least ``calls`` calls have passed: the GPU leaves its idle clocks (and module
    loading, compilation, autotuning and caches are done) before anything is timed.
    ``setup(i)`` runs before call ``i``. Returns the calls made and the seconds spent."""
    device = _device(device)
    t0, made = time.perf_counter(), 0
    while made < calls or (time.perf_counter() - t0 < seconds):
        for fn in fns:
            if setup is not None:
                setup(made)
            fn()
            made += 1
        _sync(device)
    return {"calls": made, "seconds": time.perf_counter() - t0}


def _eager_call(fn, device: torch.device, flush_l2: bool):
    """(host s, CUDA-event s or None) of one call."""
    if device.type != "cuda":
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t, None
    if flush_l2:
        _flush_l2(device)
    torch.cuda._sleep(200_000)  # ~0.1 ms of GPU time: the launch below is queued behind it
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    t = time.perf_counter()
    fn()
    host = time.perf_counter() - t
    b.record()
    b.synchronize()
    return host, a.elapsed_time(b) / 1e3


def _eager_reps(fns, device, rep: int, min_time_s: float, setup, flush_l2: bool):
    """(host s, CUDA-event s) of at least ``rep`` eager calls, more (up to 100 x ``rep``) while
    ``min_time_s`` has not passed; on CPU the event list stays empty."""
    host: List[float] = []
    events: List[float] = []
    t0 = time.perf_counter()
    while len(host) < rep or (time.perf_counter() - t0 < min_time_s and len(host) < 100 * rep):
        i = len(host)
        if setup is not None:
            setup(i)
        h, e = _eager_call(fns[i % len(fns)], device, flush_l2)
        host.append(h)
        if e is not None:
            events.append(e)
    return host, events


def _graph_time(fns, device, rep: int) -> List[float]:
    """Device time of one call from CUDA-graph replays of all ``fns`` in a row (one graph, so
    launch gaps vanish and the calls rotate through their input sets)."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):  # capture needs the calls warmed on a side stream first
        for fn in fns:
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    graph.replay()
    torch.cuda.synchronize(device)
    times = []
    for _ in range(rep):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / len(fns))
    return times


def _graph_or_why(fns, device, rep: int, graph: bool, setup):
    """(graph times or None, the reason there are none)."""
    if device.type != "cuda":
        return None, "CPU: no CUDA graphs; the host clock times each (synchronous) call"
    if not graph:
        return None, "graph timing not asked for"
    if setup is not None:
        return None, "a per-call setup cannot be captured in a graph"
    try:
        return _graph_time(fns, device, rep), None
    except Exception as e:  # e.g. a call that synchronises or allocates pageable copies
        _sync(device)
        return None, f"graph capture failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}"


def _first_call(fn, device, setup) -> float:
    if setup is not None:
        setup(0)
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def measure(fns: Fns, *, device: Optional[torch.device] = None, rep: int = 20,
            warmup: int = 1, warm_s: float = 0.0, min_time_s: float = 0.0, graph: bool = False,
            flush_l2: bool = False, setup: Optional[Callable[[int], object]] = None) -> Timing:
    """Time one call of ``fns`` (a callable, or one per input set: call ``i`` runs
    ``fns[i % len(fns)]``); the steps are the module's. ``setup(i)`` (untimed) runs before
    every call (e.g. to rebuild an autograd graph); it rules out graphs. ``flush_l2``: write
    256 MiB before each eager CUDA call (for a caller that cannot rotate its inputs).

    ``extra``: ``host_ms``, ``events_ms``, ``graph_ms`` (None, with ``graph_note`` saying why),
    ``timed_by``, ``rotation`` (the input sets), ``warm`` (the warm-up's calls and seconds)."""
    fns = [fns] if callable(fns) else list(fns)
    if not fns:
        raise ValueError("fns: expected at least one callable")
    device = _device(device)
    first = _first_call(fns[0], device, setup)
    warm = {"calls": 0, "seconds": 0.0}
    if warmup > 1 or warm_s > 0:
        warm = warm_clocks(fns, device=device, seconds=warm_s, calls=warmup - 1, setup=setup)
    host, events = _eager_reps(fns, device, max(1, rep), min_time_s, setup, flush_l2)
    graph_times, note = _graph_or_why(fns, device, max(1, rep), graph, setup)
    main = graph_times or events or host
    ms = lambda xs: statistics.median(xs) * 1e3 if xs else None  # noqa: E731
    timed_by = ("cuda-graph replay" if graph_times else "cuda events (eager)" if events
                else "host clock (CPU)")
    return Timing.of(main, first_call=first, host_ms=ms(host), events_ms=ms(events),
                     graph_ms=ms(graph_times or []), graph_note=note, timed_by=timed_by,
                     rotation=len(fns), warm=dict(calls=warm["calls"],
                                                  seconds=round(warm["seconds"], 4)))


def spread(values: Sequence[float]) -> float:
    """max / min - 1 of positive figures (e.g. one median per process); 0 for one value."""
    vals = [float(v) for v in values if v is not None]
    if not vals or min(vals) <= 0:
        return float("nan")
    return max(vals) / min(vals) - 1.0


def gbps(num_bytes: int, seconds: float) -> float:
    """Bandwidth in GB/s (10**9 bytes per second) from an explicit byte count."""
    return num_bytes / seconds / 1e9 if seconds > 0 else float("nan")
