"""Shared benchmark utilities: environment description, timing, byte-count bandwidth, results files.

Every script under ``bench/`` takes its environment, tables and results files from here (one
``environment()``, one ``markdown_table``, one ``finish`` that writes and prints, and
``report``, the title-environment-notes-tables page most of them end with); nothing here is
specific to one benchmark.

Timing rules:
* on CUDA, each sample is one call bracketed by CUDA events on the current stream, after
  ``warmup`` untimed calls; the L2 cache is flushed between samples when ``flush_l2`` is set
  (so memory-bound kernels are not timed out of a warm cache);
  the flush kernel (~0.1 ms) also runs while the host prepares the timed call, so launch
  overhead shorter than that is hidden and the figures are device time (as with
  ``triton.testing.do_bench``); a method that launches many kernels still pays for all of them;
* on CPU, ``time.perf_counter`` around each call;
* we report the median and the 20% / 80% quantiles, never the mean (outliers from the host);
* kernel figures that must hold across processes use ``time_kernel`` instead (clocks warmed
  >= 200 ms, rotated input sets >= 2x the cache, CUDA-graph replays for device time, host time
  apart; BENCHMARKS.md "Timing method"), and ``spread`` over fresh processes.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import torch

from vr_runtime.data.atomic import write_files_atomically

__all__ = [
    "Timing", "device_name", "environment", "time_fn", "gbps", "write_results",
    "markdown_table", "markdown_grid", "environment_line", "finish", "command_line", "has_cuda",
    "warm_clocks", "cache_bytes", "rotation_count", "time_kernel", "spread", "report",
]


def has_cuda() -> bool:
    return torch.cuda.is_available()


def device_name(device: Optional[torch.device] = None) -> str:
    """Human-readable name of the device a benchmark runs on (GPU model, or the CPU)."""
    if device is None:
        device = torch.device("cuda" if has_cuda() else "cpu")
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:  # Linux: the model name is more useful than the architecture
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"CPU: {cpu} ({os.cpu_count()} logical cores, {torch.get_num_threads()} torch threads)"


def _version(mod: str) -> Optional[str]:
    try:
        m = __import__(mod)
        return getattr(m, "__version__", "?")
    except Exception:
        return None


def command_line() -> str:
    return " ".join(["python"] + sys.argv)


def environment(device: Optional[torch.device] = None) -> Dict[str, object]:
    """Everything a results file must name: device, date, versions, command."""
    env = {
        "device": device_name(device),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command_line(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "transformers": _version("transformers"),
        "cuda": torch.version.cuda,
        "platform": platform.platform(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0"),
    }
    try:  # CPU figures on a shared machine mean little without the load they ran under
        env["load_avg_1m"] = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        pass
    if has_cuda():
        props = torch.cuda.get_device_properties(0)
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        env["gpu_sm_count"] = props.multi_processor_count
    return env


@dataclass
class Timing:
    """Times of one benchmarked callable, in seconds."""
    median: float
    q20: float
    q80: float
    samples: int
    first_call: Optional[float] = None  # wall time of the very first call (compile, autotune)
    extra: Dict[str, object] = field(default_factory=dict)

    @property
    def median_ms(self) -> float:
        return self.median * 1e3

    def as_dict(self) -> Dict[str, object]:
        d = asdict(self)
        d["median_ms"] = self.median_ms
        return d


def _quantile(xs: List[float], q: float) -> float:
    xs = sorted(xs)
    if len(xs) == 1:
        return xs[0]
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


_L2_FLUSH: Dict[int, torch.Tensor] = {}


def _flush_l2(device: torch.device) -> None:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    buf = _L2_FLUSH.get(idx)
    if buf is None:  # 256 MiB: larger than any current GPU's L2 (H100: 50 MiB, H200: 60 MiB)
        buf = _L2_FLUSH[idx] = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    buf.zero_()


def time_fn(fn: Callable[[], object], *, device: Optional[torch.device] = None, warmup: int = 3,
            rep: int = 20, min_time_s: float = 0.0, flush_l2: bool = True,
            setup: Optional[Callable[[], object]] = None) -> Timing:
    """Median / quantile time of ``fn()``.

    ``setup`` (untimed) runs before every call, e.g. to reset gradients or change the inputs.
    The first call is timed separately on the wall clock (it includes compilation/autotuning)
    and excluded from the samples. ``min_time_s`` extends ``rep`` for very fast functions.
    """
    if device is None:
        device = torch.device("cuda" if has_cuda() else "cpu")
    device = torch.device(device)
    cuda = device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    if setup is not None:
        setup()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    first = time.perf_counter() - t0
    for _ in range(max(0, warmup - 1)):
        if setup is not None:
            setup()
        fn()
    sync()

    times: List[float] = []
    start_wall = time.perf_counter()
    while len(times) < rep or (time.perf_counter() - start_wall < min_time_s and len(times) < 100 * rep):
        if setup is not None:
            setup()
        if cuda:
            if flush_l2:
                _flush_l2(device)
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return Timing(median=statistics.median(times), q20=_quantile(times, 0.2),
                  q80=_quantile(times, 0.8), samples=len(times), first_call=first)


# ------------------------------------------------------------- kernel timing across processes
# ``time_kernel`` is the method for figures that must hold across processes (BENCHMARKS.md,
# "Timing method"): clocks warmed with >= 200 ms of work, input sets rotated so every call reads
# cold memory as a real call does, CUDA-graph replays for the device time, the host's time to
# issue a call reported apart. ``time_fn`` above stays for end-to-end figures.

MAX_ROTATION = 64  # input sets at most; smaller sets than 2 x cache / 64 are flushed instead


def cache_bytes(device: Optional[torch.device] = None) -> int:
    """The last-level cache a timed call could be served from: the GPU's L2, or the CPU's
    largest cache (Linux sysfs; 32 MiB where it cannot be read)."""
    device = torch.device(device if device is not None else ("cuda" if has_cuda() else "cpu"))
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
                seconds: float = 0.2) -> Dict[str, float]:
    """Run ``fns`` in turn until ``seconds`` of synchronised wall time have passed: the GPU leaves
    its idle clocks (and module loading, compilation, autotuning and caches are done) before
    anything is timed. Returns the calls made and the seconds spent."""
    device = torch.device(device if device is not None else ("cuda" if has_cuda() else "cpu"))
    cuda = device.type == "cuda"
    t0 = time.perf_counter()
    calls = 0
    while True:
        for fn in fns:
            fn()
            calls += 1
        if cuda:
            torch.cuda.synchronize(device)
        if time.perf_counter() - t0 >= seconds:
            break
    return {"calls": calls, "seconds": time.perf_counter() - t0}


def _graph_time(fns, device, rep: int):
    """Median device time of one call from CUDA-graph replays of all ``fns`` in a row (one
    graph, so launch gaps vanish and the calls rotate through their input sets)."""
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


def _warm_with_setup(fns, setup, warm_s: float, sync) -> Dict[str, float]:
    """``warm_clocks`` for calls that each need their setup first: warmed by hand."""
    t0, calls = time.perf_counter(), 0
    while calls < len(fns) or time.perf_counter() - t0 < warm_s:
        setup(calls)
        fns[calls % len(fns)]()
        calls += 1
        if calls % len(fns) == 0:
            sync()
    sync()
    return {"calls": calls, "seconds": time.perf_counter() - t0}


def _eager_reps(fns, device: torch.device, rep: int, setup, flush_l2: bool):
    """(host s, CUDA-event s) of ``rep`` eager calls; on CPU the event list stays empty."""
    host, events = [], []
    for i in range(rep):
        if setup is not None:
            setup(i)
        fn = fns[i % len(fns)]
        if device.type == "cuda":
            if flush_l2:
                _flush_l2(device)
            torch.cuda._sleep(200_000)  # ~0.1 ms of GPU time: the launch below is queued behind it
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            t = time.perf_counter()
            fn()
            host.append(time.perf_counter() - t)
            b.record()
            b.synchronize()
            events.append(a.elapsed_time(b) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            host.append(time.perf_counter() - t)
    return host, events


def time_kernel(fns: Sequence[Callable[[], object]], *, device: Optional[torch.device] = None,
                rep: int = 30, warm_s: float = 0.2, graph: bool = True, flush_l2: bool = False,
                setup: Optional[Callable[[int], object]] = None) -> Timing:
    """Time one call of a kernel, the way its figures must be taken to be trusted.

    ``fns``: one callable per input set (``rotation_count`` says how many); call ``i`` runs
    ``fns[i % len(fns)]``, so a rep reads memory the cache no longer holds. ``flush_l2``: write
    256 MiB between eager reps as well (for a caller that cannot rotate). ``setup(i)`` (untimed)
    runs before eager call ``i`` (e.g. to rebuild an autograd graph); it disables graphs.

    1. ``warm_clocks`` for ``warm_s`` seconds (0 skips it; tests only);
    2. eager reps: host time to issue the call (``perf_counter`` around it, no sync) and, on CUDA,
       events around it after a ``torch.cuda._sleep`` so the launch is queued before the GPU
       reaches it (the event pair then brackets device work, not the host's launch);
    3. on CUDA with ``graph``: CUDA-graph replays of one call per set, device time per call.

    ``median`` / ``q20`` / ``q80``: the graph figures where they exist, else the events' (CUDA)
    or the host clock's (CPU: calls are synchronous there, so host time is the time).
    ``extra``: ``host_ms``, ``events_ms``, ``graph_ms`` (None with ``graph_note`` saying why),
    ``timed_by``, ``rotation``, ``warm``."""
    if not fns:
        raise ValueError("fns: expected at least one callable")
    device = torch.device(device if device is not None else ("cuda" if has_cuda() else "cpu"))
    cuda = device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    if setup is not None:
        setup(0)
    sync()
    t0 = time.perf_counter()
    fns[0]()
    sync()
    first = time.perf_counter() - t0
    if setup is None:
        warm = warm_clocks(fns, device=device, seconds=warm_s) if warm_s > 0 else {"calls": 0, "seconds": 0.0}
    else:
        warm = _warm_with_setup(fns, setup, warm_s, sync)
    host, events = _eager_reps(fns, device, max(1, rep), setup, flush_l2)
    graph_times, note = None, None
    if not cuda:
        note = "CPU: no CUDA graphs; the host clock times each (synchronous) call"
    elif not graph:
        note = "graph timing not asked for"
    elif setup is not None:
        note = "a per-call setup cannot be captured in a graph"
    else:
        try:
            graph_times = _graph_time(fns, device, max(1, rep))
        except Exception as e:  # e.g. a call that synchronises or allocates pageable copies
            note = f"graph capture failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
            sync()

    ms = lambda xs: statistics.median(xs) * 1e3 if xs else None  # noqa: E731
    main = graph_times or events or host
    timed_by = ("cuda-graph replay" if graph_times else "cuda events (eager)" if events
                else "host clock (CPU)")
    return Timing(median=statistics.median(main), q20=_quantile(main, 0.2), q80=_quantile(main, 0.8),
                  samples=len(main), first_call=first,
                  extra=dict(host_ms=ms(host), events_ms=ms(events), graph_ms=ms(graph_times or []),
                             graph_note=note, timed_by=timed_by, rotation=len(fns),
                             warm=dict(calls=warm["calls"], seconds=round(warm["seconds"], 4))))


def spread(values: Sequence[float]) -> float:
    """max / min - 1 of positive figures (e.g. one median per process); 0 for one value."""
    vals = [float(v) for v in values if v is not None]
    if not vals or min(vals) <= 0:
        return float("nan")
    return max(vals) / min(vals) - 1.0


def gbps(num_bytes: int, seconds: float) -> float:
    """Bandwidth in GB/s (10**9 bytes per second) from an explicit byte count."""
    return num_bytes / seconds / 1e9 if seconds > 0 else float("nan")


def markdown_grid(headers: List[str], cells: List[List[str]], numbers_right: bool = False) -> str:
    """A GitHub markdown table of already formatted ``cells``; ``numbers_right`` left-aligns the
    first column and right-aligns the others (tables of figures)."""
    rule = [(":--" if i == 0 else "--:") if numbers_right else "---" for i in range(len(headers))]
    return "\n".join(["| " + " | ".join(headers) + " |", "|" + "|".join(rule) + "|"]
                     + ["| " + " | ".join(row) + " |" for row in cells])


def markdown_table(rows: List[Dict[str, object]], columns: List[str],
                   headers: Optional[List[str]] = None) -> str:
    """A GitHub markdown table of ``rows`` (dicts) restricted to ``columns``."""
    headers = headers or columns

    def fmt(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            if v != v:
                return "-"
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
        return str(v)

    return markdown_grid(headers, [[fmt(r.get(c)) for c in columns] for r in rows])


def environment_line(env: Dict[str, object], versions: tuple = ("torch",), load: bool = True) -> str:
    """The line under a results file's title: device, versions, date, command and (for CPU
    figures on a shared machine) the load they ran under."""
    parts = [str(env["device"])] + [f"{v} {env.get(v)}" for v in versions]
    parts += [str(env["date_utc"]), f"command: `{env['command']}`"]
    if load:
        parts.append(f"1-min load average {env.get('load_avg_1m')}")
    return "; ".join(parts)


def write_results(path: str, payload: Dict[str, object], markdown: Optional[str] = None) -> str:
    """Write ``payload`` (which should contain ``environment()``) as JSON to ``path``.

    When ``markdown`` is given and ``path`` ends in ``.json``, a sibling ``.md`` with the same
    stem is written too (the human-readable table). Returns ``path``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    # A results file is either the old one or the whole new one, never half written; the JSON
    # and its markdown are replaced together.
    files = {path: json.dumps(payload, indent=2, default=str) + "\n"}
    if markdown is not None and path.endswith(".json"):
        files[path[:-5] + ".md"] = markdown.rstrip() + "\n"
    write_files_atomically(files)
    return path


def finish(path: str, payload: Dict[str, object], markdown: str, *, show: bool = True) -> str:
    """The ending every benchmark shares: write the results (JSON + markdown), then print the
    markdown (``show``) and where it went. Returns ``path``."""
    write_results(path, payload, markdown)
    if show:
        print(markdown)
    print(f"wrote {path}")
    return path


def report(out: str, title: str, env: Dict[str, object], notes: List[str], body: List[str], *,
           label: str, head: Optional[List[str]] = None, show: bool = True,
           **fields) -> Dict[str, object]:
    """The ending most benchmarks share, written once: the markdown page (``title``, ``head``
    (default: the environment line), the notes as quotes, then ``body``'s lines) and the
    payload (environment, label, notes, then ``fields``), written and printed by ``finish``.
    Returns the payload."""
    head = [environment_line(env)] if head is None else head
    md = [title, ""] + head + [""] + [f"> {n}" for n in notes] + [""] + list(body)
    payload = dict(environment=env, label=label, notes=notes, **fields)
    finish(out, payload, "\n".join(md), show=show)
    return payload
