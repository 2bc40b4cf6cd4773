"""Benchmark of the fused pool-and-pack kernels (vr_kernels) against the ways it is done today.

    python bench/scripts/bench_pool_pack.py [--quick] [--out FILE] [--no-compile] [--no-sweep]
    python bench/scripts/bench_pool_pack.py --cpu-vs-compile [--rep N]   # CPU path vs torch.compile

Methods, all producing the same rows of the LLM's ``inputs_embeds``:

* ``kernel``     ``pool_pack(frames, scales, out=embeds2d, dest=...)``: Triton, one launch.
* ``llava``      (a) per-frame eager loop (``avg_pool2d`` per frame, ``torch.cat``) then
                 ``inputs_embeds.masked_scatter(placeholder_mask, packed)``, as HF LLaVA-style
                 models do.
* ``grouped``    (b) the PyTorch path of vr_kernels (``backend="torch"``: one weighted ``embedding_bag``;
                 the name is kept from when it grouped frames by window).
* ``compiled``   (c) ``torch.compile`` of the reference with a fixed schedule (steady state;
                 compile time reported apart) and ``compiled_changing`` with a schedule that
                 changes every call (each call's wall time, recompiles counted).
* ``copy``       (d) a device-to-device copy moving the same number of bytes (read + write).

Bandwidth is computed from an explicit *minimal* byte count for every method: forward reads
every token of the kept frames once and writes every output row once; backward reads every
output-row gradient once and writes every frame-token gradient once (zeros for dropped frames).
The copy of S bytes moves 2S (read + write); S is chosen so 2S equals the method's byte count.

On a machine without a GPU only the PyTorch paths run, at small sizes, and the results say that
kernel figures need a GPU (the Triton interpreter is a correctness tool, not a timing one).
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import re
import sys
import time
from typing import Dict, List, Optional

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "bench")]   # the package and the harness, run as a file
RESULTS = os.path.join(ROOT, "bench", "results")
from common import (Timing, _quantile, environment, finish, gbps, has_cuda,  # noqa: E402
                    markdown_table, report, rotation_count, spread, time_fn, time_kernel,
                    write_results)

from vr_kernels import pool_pack, pool_pack_reference, pooled_counts  # noqa: E402
from vr_kernels.reference import pool_frame  # noqa: E402
from vr_kernels.windows import normalize_window  # noqa: E402

GRID = (16, 16)
PAPER = dict(T=64, D=3584, mix="paper")
MIXES = {
    # The paper's mix: fine (1x1) relevant frames, 2x2 global, 4x4 / 8x8 context, dropped frames.
    "paper": [1, 2, 4, 8, 0],
    "all1x1": [1],
    "one_kept": None,  # all dropped but one (built in scales_for)
    "all8x8": [8],
}
METHODS = ("kernel", "copy", "llava", "grouped", "compiled")
# The kernel's goals: forward >= 90% and backward >= 85% of a same-bytes copy (the bytes it must
# move anyway), <= 10% spread over 3 processes (so one figure stands for all).
TARGETS = {"copy_fraction": 0.90, "copy_fraction_bwd": 0.85, "process_spread": 0.10, "vs_llava": 20.0, "vs_compiled_fixed": 1.3, "vs_compiled_changing": 3.0}


def scales_for(mix: str, T: int, shift: int = 0) -> List:
    if mix == "one_kept":
        s = [0] * T
        s[(T // 2 + shift) % T] = 1
        return s
    cyc = MIXES[mix]
    return [cyc[(i + shift) % len(cyc)] for i in range(T)]


class Case:
    """Frames, a schedule and the embedding buffer with its placeholder rows."""

    def __init__(self, T: int, D: int, mix: str, dtype, device, text_per_frame: int = 4, seed: int = 0):
        # Drawn on the device in the benchmark dtype: the sweep's largest case (T=1024, D=5120) is
        # 1.3e9 values, seconds of host time and a 5 GB fp32 host copy if drawn on the CPU.
        g = torch.Generator(device=device).manual_seed(seed)
        self.T, self.D, self.mix, self.dtype, self.device = T, D, mix, dtype, device
        self.N = GRID[0] * GRID[1]
        self.frames = torch.randn(T, self.N, D, generator=g, device=device, dtype=dtype)
        self.set_schedule(scales_for(mix, T), text_per_frame)

    def set_schedule(self, scales, text_per_frame: int = 4):
        self.scales = scales
        self.counts = pooled_counts(scales, GRID)
        self.total = sum(self.counts)
        # Prompt layout: 16 text rows, then per kept frame a few text rows ("FrameN: <img>") and
        # its placeholders, then 32 text rows.
        dest, pos = [], 16
        for c in self.counts:
            if c:
                pos += text_per_frame
                dest.append(pos)
                pos += c
            else:
                dest.append(0)
        self.L = pos + 32
        self.dest = dest
        m = torch.zeros(self.L, dtype=torch.bool)
        for d, c in zip(dest, self.counts):
            if c:
                m[d: d + c] = True
        self.mask = m.to(self.device)
        self.embeds = torch.randn(1, self.L, self.D).to(device=self.device, dtype=self.dtype)

    def rotation(self, n: int):
        """``n`` input sets ``(frames, embeds [1, L, D])``: set 0 is this case's; the others are
        fresh draws of the same shape, so consecutive timed calls read different memory."""
        g = torch.Generator(device=self.device).manual_seed(1234)
        sets = [(self.frames, self.embeds)]
        for _ in range(n - 1):
            sets.append((torch.randn(self.frames.shape, generator=g, device=self.device, dtype=self.dtype),
                         torch.randn(self.embeds.shape, generator=g, device=self.device, dtype=self.dtype)))
        return sets

    @property
    def kept(self) -> int:
        return sum(1 for c in self.counts if c)

    def fwd_bytes(self) -> int:
        es = self.frames.element_size()
        return (self.kept * self.N * self.D + self.total * self.D) * es

    def bwd_bytes(self) -> int:
        es = self.frames.element_size()
        return (self.total * self.D + self.T * self.N * self.D) * es


# ------------------------------------------------------------------ methods

def llava_forward(frames, scales, embeds, mask):
    """(a) per-frame eager loop + masked_scatter (a new embeds tensor, as HF models do)."""
    pieces = [pool_frame(frames[t], normalize_window(s), GRID) for t, s in enumerate(scales) if s != 0]
    packed = torch.cat(pieces, 0)
    return embeds.masked_scatter(mask.view(1, -1, 1), packed.view(1, -1, packed.shape[-1]))


def llava_packed(frames, scales):
    return torch.cat([pool_frame(frames[t], normalize_window(s), GRID) for t, s in enumerate(scales) if s != 0], 0)


def _reference_into(frames, scales, out, dest):
    return pool_pack_reference(frames, scales, GRID, out=out, dest=dest)


def _reference_packed(frames, scales):
    return pool_pack_reference(frames, scales, GRID)


def _copy_fn(nbytes: int, device):
    n = max(1, nbytes // 2)
    # Random bytes, never zeros or uninitialised memory (zeros can run faster than data).
    src = torch.randint(0, 256, (n,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def _copy_fns(nbytes: int, device, n_sets: int):
    return [_copy_fn(nbytes, device) for _ in range(n_sets)]


def _record(rows, case, direction, method, timing, nbytes, copy_gbps=None, **extra):
    bw = gbps(nbytes, timing.median)
    row = dict(T=case.T, D=case.D, mix=case.mix, dir=direction, method=method,
               median_ms=timing.median * 1e3, q20_ms=timing.q20 * 1e3, q80_ms=timing.q80 * 1e3,
               gbps=bw, bytes=nbytes, first_call_s=timing.first_call)
    for k in ("timed_by", "host_ms", "events_ms", "graph_ms", "graph_note", "rotation", "warm"):
        if k in timing.extra:
            row[k] = timing.extra[k]
    if copy_gbps:
        row["copy_frac"] = bw / copy_gbps
    row.update(extra)
    rows.append(row)
    return row


def bench_case(case: Case, *, kernel: bool, compile_: bool, rep: int, warmup: int,
               warm_s: float = 0.2, methods=METHODS) -> List[Dict]:
    """Every method of ``methods`` on ``case``, forward and backward.

    Kernel, copy and the PyTorch paths are timed by ``common.time_kernel``: clocks warmed for
    ``warm_s``, inputs rotated over ``rotation_count`` sets (each call reads memory the cache no
    longer holds), CUDA-graph replays for the device time, host time apart. The backward of the
    kernel is its launcher (``pool_pack_bwd``, what autograd's backward calls) into a
    preallocated gradient, so it can be captured; the PyTorch paths' backward goes through
    autograd (rebuilt before every call, so eager). ``compiled`` keeps ``time_fn``."""
    rows: List[Dict] = []
    dev = case.device
    tk = dict(device=dev, rep=rep, warm_s=warm_s)
    n_fwd_sets = rotation_count(case.fwd_bytes() + case.embeds.numel() * case.embeds.element_size(), dev)
    n_bwd_sets = rotation_count(case.bwd_bytes(), dev)
    sets = case.rotation(max(n_fwd_sets, n_bwd_sets))

    # (d) copy of the same bytes, forward and backward byte counts, rotated like the rest.
    copy_f = copy_b = None
    if "copy" in methods:
        t_cf = time_kernel(_copy_fns(case.fwd_bytes(), dev, n_fwd_sets), **tk)
        copy_f = _record(rows, case, "fwd", "copy", t_cf, case.fwd_bytes())["gbps"]
        t_cb = time_kernel(_copy_fns(case.bwd_bytes(), dev, n_bwd_sets), **tk)
        copy_b = _record(rows, case, "bwd", "copy", t_cb, case.bwd_bytes())["gbps"]

    _forward(rows, case, sets[:n_fwd_sets], methods, kernel=kernel, compile_=compile_, rep=rep,
             warmup=warmup, tk=tk, copy_gbps=copy_f)
    _backward(rows, case, sets[:n_bwd_sets], methods, kernel=kernel, compile_=compile_, tk=tk,
              copy_gbps=copy_b)
    return rows


def _forward(rows, case: Case, sets, methods, *, kernel, compile_, rep, warmup, tk, copy_gbps):
    """The forward rows of ``bench_case`` (each method over the rotated input sets)."""
    sc, dest, dev = case.scales, case.dest, case.device
    fwd_sets = [(f, e.view(-1, case.D)) for f, e in sets]
    fwd = {}
    if kernel and "kernel" in methods:
        fwd["kernel"] = time_kernel([lambda f=f, e=e: pool_pack(f, sc, GRID, out=e, dest=dest, backend="triton")
                                     for f, e in fwd_sets], **tk)
    if "llava" in methods:
        # Baselines: eager (events), no graph capture: masked_scatter and the PyTorch path are
        # not written to be capturable, and a failed capture is not worth the risk mid-run.
        fwd["llava"] = time_kernel([lambda f=f, e=e: llava_forward(f, sc, e.view(1, -1, case.D), case.mask)
                                    for f, e in fwd_sets], graph=False, **tk)
    if "grouped" in methods:
        fwd["grouped"] = time_kernel([lambda f=f, e=e: pool_pack(f, sc, GRID, out=e, dest=dest, backend="torch")
                                      for f, e in fwd_sets], graph=False, **tk)
    extra_c = {}
    f, emb2d = case.frames, case.embeds.view(-1, case.D)
    if compile_ and "compiled" in methods:
        torch._dynamo.reset()
        comp = torch.compile(_reference_into, dynamic=False)
        fwd["compiled"] = time_fn(lambda: comp(f, sc, emb2d, dest), device=dev, rep=rep, warmup=warmup)
        extra_c["compiled"] = dict(compile_s=fwd["compiled"].first_call)
        fwd["compiled_changing"], extra_c["compiled_changing"] = _changing(case, comp, rep)
    for m, t in fwd.items():
        _record(rows, case, "fwd", m, t, case.fwd_bytes(), copy_gbps, **extra_c.get(m, {}))


def _backward(rows, case: Case, sets, methods, *, kernel, compile_, tk, copy_gbps):
    """The backward rows of ``bench_case``: the gradient w.r.t. the frames of the packed rows."""
    from vr_kernels.checks import KERNEL_DTYPES, check_args
    from vr_kernels.pool_pack import TOKENS_PER_TILE, pool_pack_bwd
    from vr_kernels.tiles import build_dest, build_tiles
    sc, dev, f = case.scales, case.device, case.frames
    bwd_sets = [(fs, torch.randn(case.total, case.D, device=dev, dtype=case.dtype)) for fs, _ in sets]
    if kernel and "kernel" in methods:
        plan = check_args(f, sc, GRID, None, None, dtypes=KERNEL_DTYPES)
        tiles, n_fwd = build_tiles(plan, TOKENS_PER_TILE, dev)
        dest_t = build_dest(plan, dev)
        dxs = [torch.empty_like(fs) for fs, _ in bwd_sets]
        t = time_kernel([lambda g=g, dx=dx: pool_pack_bwd(g, plan, tiles, n_fwd, dest_t, dx)
                         for (_, g), dx in zip(bwd_sets, dxs)], **tk)
        _record(rows, case, "bwd", "kernel", t, case.bwd_bytes(), copy_gbps)
    bwd_fns = {}
    if "llava" in methods:
        bwd_fns["llava"] = lambda a: llava_packed(a, sc)
    if "grouped" in methods:
        bwd_fns["grouped"] = lambda a: pool_pack(a, sc, GRID, backend="torch")
    if compile_ and "compiled" in methods:
        torch._dynamo.reset()
        compb = torch.compile(_reference_packed, dynamic=False)
        bwd_fns["compiled"] = lambda a: compb(a, sc)
    leaves = [fs.detach().clone().requires_grad_(True) for fs, _ in bwd_sets] if bwd_fns else []
    for m, fn in bwd_fns.items():
        state = {}

        def setup(i, fn=fn):
            a = leaves[i % len(leaves)]
            a.grad = None
            state["y"], state["g"] = fn(a), bwd_sets[i % len(bwd_sets)][1]

        t = time_kernel([lambda: state["y"].backward(state["g"])], setup=setup, **tk)
        _record(rows, case, "bwd", m, t, case.bwd_bytes(), copy_gbps)


def _changing(case: Case, comp, rep: int):
    """A new schedule every call (a random permutation of the same frames' windows, so the
    byte count stays put). Wall time per call includes whatever dynamo does: recompiles (counted
    from its stats) until its recompile limit, then its eager fallback."""
    from torch._dynamo.utils import counters
    dev = case.device
    f = case.frames
    n = max(rep, 12)
    scheds = []
    for i in range(n):
        sc = list(case.scales)
        random.Random(i + 1).shuffle(sc)
        dest, pos = [], 16
        for k in pooled_counts(sc, GRID):
            pos += 4 if k else 0
            dest.append(pos if k else 0)
            pos += k
        scheds.append((sc, dest))
    L = max(max((d + k for d, k in zip(dest, pooled_counts(sc, GRID))), default=0) for sc, dest in scheds) + 32
    emb2d = torch.zeros(L, case.D, device=dev, dtype=case.dtype)
    before = counters["stats"]["unique_graphs"]
    times = []
    for sc, dest in scheds:
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        comp(f, sc, emb2d, dest)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    tm = Timing(median=statistics.median(times), q20=_quantile(times, 0.2), q80=_quantile(times, 0.8),
                samples=len(times), first_call=times[0])
    return tm, dict(recompiles=counters["stats"]["unique_graphs"] - before, calls=len(times),
                    mean_ms=sum(times) / len(times) * 1e3)


def speedups(rows: List[Dict]) -> List[Dict]:
    """Per (case, dir): kernel speedup over each baseline."""
    out = []
    keyed: Dict[tuple, Dict[str, Dict]] = {}
    for r in rows:
        keyed.setdefault((r["T"], r["D"], r["mix"], r["dir"]), {})[r["method"]] = r
    for (T, D, mix, d), ms in keyed.items():
        k = ms.get("kernel")
        if not k:
            continue
        s = dict(T=T, D=D, mix=mix, dir=d, kernel_ms=k["median_ms"], copy_frac=k.get("copy_frac"))
        if "spread" in k:
            s.update(spread=k["spread"], processes=k["processes"])
        for b in ("llava", "grouped", "compiled", "compiled_changing"):
            if b in ms:
                s[f"vs_{b}"] = ms[b]["median_ms"] / k["median_ms"]
        out.append(s)
    return out


def check_targets(sp: List[Dict]) -> List[str]:
    lines = []
    for s in sp:
        if (s["T"], s["D"], s["mix"]) != (PAPER["T"], PAPER["D"], PAPER["mix"]):
            continue
        frac = s.get("copy_frac") or 0.0  # None when a copy timing was unavailable
        target = TARGETS["copy_fraction_bwd" if s["dir"] == "bwd" else "copy_fraction"]
        ok = frac >= target
        lines.append(f"{s['dir']}: {frac:.0%} of copy bandwidth (target >= {target:.0%}): "
                     f"{'met' if ok else 'NOT met'}")
        if s.get("spread") is not None:
            sp_ok = s["spread"] <= TARGETS["process_spread"]
            lines.append(f"{s['dir']}: kernel spread over {s['processes']} processes {s['spread']:.0%} "
                         f"(target <= {TARGETS['process_spread']:.0%}): {'met' if sp_ok else 'NOT met'}")
        for b, tgt in (("llava", "vs_llava"), ("compiled", "vs_compiled_fixed"),
                       ("compiled_changing", "vs_compiled_changing")):
            v = s.get(f"vs_{b}")
            if v is not None:
                lines.append(f"{s['dir']}: {v:.1f}x vs {b} (target >= {TARGETS[tgt]}x): "
                             f"{'met' if v >= TARGETS[tgt] else 'NOT met'}")
    return lines


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


CPU_COMPARE = dict(T=64, D=896, mix="paper")
BLOCK = 5


def cpu_vs_compile(rep: int, out: Optional[str] = None, dtypes=("float32", "bfloat16")) -> Dict:
    """The CPU path (``backend="torch"``) against ``torch.compile`` of the reference at T=64,
    D=896 (the paper's mix), forward (into ``out`` at ``dest``, as the runtime calls it) and
    forward+backward (packed output, gradient w.r.t. the frames), on ONE thread.

    The two methods are timed in alternating blocks of ``BLOCK`` calls (A x5, B x5, A x5, ...) so
    that load from other jobs hits both alike; single-call alternation is avoided because each
    method then pays the page faults of re-mapping the output the other just freed. Medians are
    reported, with the compile time apart."""
    torch.set_num_threads(1)
    device = torch.device("cpu")
    env = environment(device)
    rows = []
    for dt_name in dtypes:
        dtype = getattr(torch, dt_name)
        case = Case(CPU_COMPARE["T"], CPU_COMPARE["D"], CPU_COMPARE["mix"], dtype, device)
        f, sc, dest = case.frames, case.scales, case.dest
        emb2d = case.embeds.view(-1, case.D).clone()
        fr = f.detach().clone().requires_grad_(True)
        g = torch.randn(case.total, case.D, dtype=dtype)

        torch._dynamo.reset()
        comp_fwd = torch.compile(_reference_into, dynamic=False)
        comp_packed = torch.compile(_reference_packed, dynamic=False)
        t0 = time.perf_counter()
        comp_fwd(f, sc, emb2d, dest)
        compile_fwd = time.perf_counter() - t0
        t0 = time.perf_counter()
        comp_packed(fr, sc).backward(g)
        compile_bwd = time.perf_counter() - t0

        def fb(fn):
            fr.grad = None
            fn(fr, sc).backward(g)

        comp_packed_fwd = comp_packed  # same compiled function; a no-grad input gets its own graph
        comp_packed_fwd(f, sc)
        pairs = {
            "fwd": (lambda: pool_pack(f, sc, GRID, out=emb2d, dest=dest, backend="torch"),
                    lambda: comp_fwd(f, sc, emb2d, dest)),
            "fwd packed": (lambda: pool_pack(f, sc, GRID, backend="torch"), lambda: comp_packed_fwd(f, sc)),
            "fwd+bwd": (lambda: fb(lambda a, s: pool_pack(a, s, GRID, backend="torch")),
                        lambda: fb(comp_packed)),
        }
        for direction, (ours, theirs) in pairs.items():
            for _ in range(3):  # warm both
                ours(), theirs()
            t_ours, t_theirs = [], []
            for _ in range(max(1, rep // BLOCK)):
                for fn, ts in ((ours, t_ours), (theirs, t_theirs)):
                    for _ in range(BLOCK):
                        t0 = time.perf_counter()
                        fn()
                        ts.append(time.perf_counter() - t0)
            mo, mt = statistics.median(t_ours), statistics.median(t_theirs)
            rows.append(dict(dtype=dt_name, dir=direction, torch_path_ms=mo * 1e3, compiled_ms=mt * 1e3,
                             speedup=mt / mo, torch_path_q20_q80_ms=[_quantile(t_ours, .2) * 1e3, _quantile(t_ours, .8) * 1e3],
                             compiled_q20_q80_ms=[_quantile(t_theirs, .2) * 1e3, _quantile(t_theirs, .8) * 1e3],
                             compile_s=compile_bwd if direction == "fwd+bwd" else compile_fwd,
                             target_met=mo <= mt))
            print(rows[-1], flush=True)
    notes = ["CPU figures, 1 torch thread, T=64 frames of 16x16 tokens, D=896, windows 1/2/4/8 and "
             "dropped frames (the paper's mix); the two methods alternate in blocks of 5 calls; the machine is "
             "shared with other jobs, so absolute times are noisy (ratios less so).",
             "fwd: into out at dest (the runtime's call); fwd packed: the packed [rows, D] output; "
             "fwd+bwd: packed output, gradient w.r.t. frames.",
             "compiled = torch.compile(pool_pack_reference, dynamic=False) with a fixed schedule, steady "
             "state; compile_s is its first call."]
    cols = ["dtype", "dir", "torch_path_ms", "compiled_ms", "speedup", "compile_s", "target_met"]
    body = [markdown_table(rows, cols, ["dtype", "direction", "torch path ms", "torch.compile ms",
                                        "compiled / ours", "compile s", "ours <= compiled"])]
    out = out or os.path.join(RESULTS, "pool_pack_cpu_vs_compile.json")
    return report(out, "# CPU path vs torch.compile of the reference", env, notes, body,
                  label="CPU", case=CPU_COMPARE, rep=rep, results=rows)


def parse_args(argv: Optional[List[str]] = None):
    """(arguments, the methods to time); argparse's exit 2 on a bad one."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="paper shape only (GPU) / tiny sizes (CPU)")
    p.add_argument("--out", default=None, help="results file (.json; a .md table is written beside it)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    p.add_argument("--no-sweep", action="store_true", help="paper shape only")
    p.add_argument("--rep", type=int, default=None)
    p.add_argument("--cpu-vs-compile", action="store_true",
                   help="only the CPU path against torch.compile of the reference (T=64, D=896, 1 thread)")
    p.add_argument("--warm-ms", type=float, default=200.0,
                   help="milliseconds of work before each timing, to warm the clocks (default 200)")
    p.add_argument("--methods", default=",".join(METHODS),
                   help=f"comma list of the methods to time (default all: {','.join(METHODS)})")
    p.add_argument("--processes", type=int, default=1,
                   help="run the same cases in N fresh processes and report the median per row "
                        "and the spread (max/min - 1) across them (the GPU table uses 3)")
    args = p.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        p.error(f"--methods: unknown {unknown or args.methods!r}; expected a comma list of {','.join(METHODS)}")
    if args.processes < 1:
        p.error(f"--processes: expected >= 1, got {args.processes}")
    if args.warm_ms < 0:
        p.error(f"--warm-ms: expected >= 0, got {args.warm_ms}")
    if args.rep is not None and args.rep < 1:
        p.error(f"--rep: expected >= 1, got {args.rep}")
    return args, methods


def plan_cases(args, gpu: bool):
    """(cases, rep, warmup, whether the paper shape is compiled, notes) of one process."""
    notes = []
    if gpu:
        rep, warmup = args.rep or 30, 5
        cases = [dict(PAPER)]
        if not (args.quick or args.no_sweep):
            for mix in MIXES:
                for T in (16, 64, 256, 1024):
                    for D in (896, 3584, 5120):
                        c = dict(T=T, D=D, mix=mix)
                        if c != PAPER:
                            cases.append(c)
        compile_paper = not args.no_compile
        notes.append("torch.compile baselines run at the paper shape only (compiling every sweep shape "
                     "would dominate the run).")
    else:
        rep, warmup = args.rep or 3, 1
        cases = [dict(T=8, D=128, mix="paper")] if args.quick else [dict(T=16, D=512, mix=m) for m in MIXES]
        compile_paper = False
        notes.append("No CUDA device: kernel figures need a GPU. Only the PyTorch paths ran, at small "
                     "sizes on the CPU (the Triton interpreter is for correctness, not timing); "
                     "torch.compile baselines are skipped on CPU.")
        notes.append("CPU: graph replay skipped (no CUDA graphs); each call is timed by the host clock.")
    notes.append(f"Method (common.time_kernel): {args.warm_ms:g} ms of work first to warm the clocks; "
                 "inputs rotated over enough sets that the memory touched between two uses of a set "
                 "is >= 2x the last-level cache (rotation: the sets used), so every call reads cold memory; "
                 "device time from CUDA-graph replays where capture works, else CUDA events "
                 "(eager); host_ms is the host's time to issue one call, apart. The kernel's "
                 "backward is its launcher into a preallocated gradient.")
    return cases, rep, warmup, compile_paper, notes


def main(argv: Optional[List[str]] = None) -> Dict:
    args, methods = parse_args(argv)
    if args.cpu_vs_compile:
        return cpu_vs_compile(args.rep or 30, args.out)
    if args.processes > 1:
        return run_processes(args, methods)

    gpu = has_cuda()
    device = torch.device("cuda" if gpu else "cpu")
    dtype = torch.bfloat16
    cases, rep, warmup, compile_paper, notes = plan_cases(args, gpu)
    for n in notes:
        print("NOTE:", n)

    rows: List[Dict] = []
    t_start = time.perf_counter()
    env = environment(device)
    out = args.out or os.path.join(RESULTS,
                                   "pool_pack_" + ("cpu" if not gpu else _slug(env["device"])) + ".json")
    for i, c in enumerate(cases):
        case = Case(c["T"], c["D"], c["mix"], dtype, device)
        is_paper = c == PAPER
        rows += bench_case(case, kernel=gpu, compile_=(compile_paper and is_paper), rep=rep, warmup=warmup,
                           warm_s=args.warm_ms / 1e3, methods=methods)
        if gpu:
            del case
            torch.cuda.empty_cache()
        print(f"case {i + 1}/{len(cases)} {c} done, {time.perf_counter() - t_start:.0f} s", flush=True)
        if i + 1 < len(cases):
            # The full GPU sweep takes minutes: keep what is measured if the run is cut short.
            _report(out, env, notes, dtype, rows, gpu, t_start, done=f"{i + 1} of {len(cases)} cases")
    return _report(out, env, notes, dtype, rows, gpu, t_start, done=None, show=True)


def merge_processes(payloads: List[Dict]) -> List[Dict]:
    """One row per (case, dir, method) from several processes' results: the median of their
    medians, each process's figure (``per_process_ms``) and the ``spread`` (max/min - 1);
    bandwidth and the fraction of a copy are recomputed from the merged medians."""
    keyed: Dict[tuple, List[Dict]] = {}
    for pl in payloads:
        for r in pl["results"]:
            keyed.setdefault((r["T"], r["D"], r["mix"], r["dir"], r["method"]), []).append(r)
    rows = []
    for rs in keyed.values():
        per = [r["median_ms"] for r in rs]
        row = {k: v for k, v in rs[0].items()
               if k not in ("q20_ms", "q80_ms", "events_ms", "graph_ms", "first_call_s", "warm", "copy_frac")}
        host = [r["host_ms"] for r in rs if r.get("host_ms") is not None]
        row.update(median_ms=statistics.median(per), per_process_ms=per, processes=len(rs),
                   spread=spread(per), host_ms=statistics.median(host) if host else None)
        row["gbps"] = gbps(row["bytes"], row["median_ms"] / 1e3)
        rows.append(row)
    copies = {(r["T"], r["D"], r["mix"], r["dir"]): r["gbps"] for r in rows if r["method"] == "copy"}
    for r in rows:
        c = copies.get((r["T"], r["D"], r["mix"], r["dir"]))
        if r["method"] != "copy" and c:
            r["copy_frac"] = r["gbps"] / c
    return rows


def _run_child(cmd: List[str], env: Dict[str, str]) -> int:
    """One fresh process (its own interpreter, CUDA context, caches); its exit status."""
    import subprocess
    return subprocess.run(cmd, env=env).returncode


def run_processes(args, methods: List[str]) -> Dict:
    """The same cases in ``args.processes`` fresh processes, one after another (a process's
    caches, allocator and clocks are its own: the spread across them is the figure's real
    uncertainty). Each process's results stay beside ``--out`` as ``<stem>_process<i>.json``."""
    gpu = has_cuda()
    device = torch.device("cuda" if gpu else "cpu")
    env = environment(device)
    out = args.out or os.path.join(RESULTS,
                                   "pool_pack_" + ("cpu" if not gpu else _slug(env["device"])) + ".json")
    stem = out[:-5] if out.endswith(".json") else out
    child = ["--processes", "1", "--warm-ms", str(args.warm_ms), "--methods", ",".join(methods)]
    child += [f for f, on in (("--quick", args.quick), ("--no-compile", args.no_compile),
                              ("--no-sweep", args.no_sweep)) if on]
    if args.rep is not None:
        child += ["--rep", str(args.rep)]
    penv = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT, os.path.join(ROOT, "bench")] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    t_start = time.perf_counter()
    payloads, files = [], []
    for i in range(1, args.processes + 1):
        path = f"{stem}_process{i}.json"
        cmd = [sys.executable, os.path.abspath(__file__)] + child + ["--out", path]
        print(f"== process {i}/{args.processes}: {' '.join(cmd)}", flush=True)
        rc = _run_child(cmd, penv)
        if rc != 0:
            raise SystemExit(f"bench_pool_pack: process {i} of {args.processes} failed (exit {rc}); "
                             f"see its output above")
        with open(path) as f:
            payloads.append(__import__("json").load(f))
        files.append(os.path.basename(path))
    rows = merge_processes(payloads)
    notes = list(payloads[0]["notes"]) + [
        f"Each row: the median of {args.processes} fresh processes' medians; spread = max/min - 1 "
        f"across them; per-process files: {', '.join(files)}."]
    return _report(out, env, notes, torch.bfloat16, rows, gpu, t_start, done=None, show=True,
                   extra=dict(processes=args.processes, process_files=files,
                              process_environments=[pl["environment"] for pl in payloads]))


def _report(out, env, notes, dtype, rows, gpu, t_start, done=None, show=False, extra=None) -> Dict:
    """Write the results (JSON + markdown); ``done`` marks a partial file written mid-run."""
    sp = speedups(rows)
    verdict = check_targets(sp) if gpu else ["targets need a GPU (not evaluated)"]
    notes = list(notes) + ([f"PARTIAL results: {done} (the run was still going)"] if done else [])

    cols = ["T", "D", "mix", "dir", "method", "median_ms", "gbps", "copy_frac", "host_ms", "timed_by"]
    heads = ["T", "D", "mix", "dir", "method", "median ms", "GB/s", "of copy BW", "host ms", "timed by"]
    if any("spread" in r for r in rows):
        cols[6:6], heads[6:6] = ["spread"], ["spread"]
    md = [f"# pool_pack benchmark ({env['device']})", "",
          f"date {env['date_utc']}, torch {env['torch']}, triton {env['triton']}, cuda {env['cuda']}",
          f"command: `{env['command']}`" + (f", 1-min load average {env['load_avg_1m']}" if not gpu else ""), ""] + [f"> {n}" for n in notes] + ["",
          markdown_table(rows, cols, heads)]
    if sp:
        md += ["", "## Kernel speedups", "",
               markdown_table(sp, ["T", "D", "mix", "dir", "kernel_ms", "copy_frac", "vs_llava", "vs_grouped",
                                   "vs_compiled", "vs_compiled_changing"])]
    md += ["", "## Targets", ""] + [f"- {v}" for v in verdict]
    markdown = "\n".join(md)

    payload = dict(environment=env, notes=notes, dtype=str(dtype), grid=list(GRID), byte_counts=(
        "fwd = (kept_frames*N*D + out_rows*D) * elem_size; bwd = (out_rows*D + T*N*D) * elem_size; "
        "copy moves the same total (half read, half written)"),
        results=rows, speedups=sp, targets=verdict, elapsed_s=time.perf_counter() - t_start, **(extra or {}))
    if show:
        finish(out, payload, markdown)
    else:  # a partial file written mid-run: quietly
        write_results(out, payload, markdown)
    return payload


if __name__ == "__main__":
    main()
