"""Benchmark of the fused pool-and-pack kernels (vr_kernels) against the ways it is done today.

    python -m bench.scripts.bench_pool_pack [--quick] [--out FILE] [--no-compile] [--no-sweep]
    python -m bench.scripts.bench_pool_pack --processes 3      # the same in 3 fresh processes
    python -m bench.scripts.bench_pool_pack --cpu-vs-compile   # CPU path vs torch.compile

Methods, all producing the same rows of the LLM's ``inputs_embeds``:

* ``kernel``     ``pool_pack(frames, scales, out=embeds2d, dest=...)``: Triton, one launch.
* ``llava``      (a) per-frame eager loop (``avg_pool2d`` per frame, ``torch.cat``) then
                 ``inputs_embeds.masked_scatter(placeholder_mask, packed)``, as HF LLaVA-style
                 models do.
* ``torch``      (b) the PyTorch path of vr_kernels (``backend="torch"``: one weighted ``embedding_bag``;
                 results written before 2026-12-02 call it ``grouped``).
* ``compiled``   (c) ``torch.compile`` of the reference with a fixed schedule (steady state;
                 compile time reported apart) and ``compiled_changing`` with a schedule that
                 changes every call (each call's wall time, recompiles counted).
* ``copy``       (d) a device-to-device copy moving the same number of bytes (read + write).

Bandwidth is computed from an explicit *minimal* byte count for every method: forward reads
every token of the kept frames once and writes every output row once; backward reads every
output-row gradient once and writes every frame-token gradient once (zeros for dropped frames).
The copy of S bytes moves 2S (read + write); S is chosen so 2S equals the method's byte count.

Timing, fresh processes, targets and the alternating A/B of ``--cpu-vs-compile`` are the
harness's (bench.harness: timing, processes, targets, compare); this script states the shapes,
the byte counts, the methods and the goals. ``--append`` adds the run to ``--out``'s runs.

On a machine without a GPU only the PyTorch paths run, at small sizes, and the results say that
kernel figures need a GPU (the Triton interpreter is a correctness tool, not a timing one).
"""
from __future__ import annotations

import argparse
import os
import random
import re
import time
from typing import Dict, List, Optional

import torch

from bench.harness.compare import BLOCK, alternate, first_call_s
from bench.harness.env import environment, has_cuda
from bench.harness.processes import merge_rows, run_processes
from bench.harness.results import RESULTS, add_append_flag, report
from bench.harness.tables import markdown_table
from bench.harness.timing import Timing, gbps, measure, rotation_count
from bench.models.pool_pack_inputs import (GRID, MIXES, PAPER, Case, copy_fns, llava_forward,
                                           llava_packed, reference_into, reference_packed)
from bench.report import pool_pack_report
from vr_kernels import pool_pack, pooled_counts

MODULE = "bench.scripts.bench_pool_pack"
METHODS = ("kernel", "copy", "llava", "torch", "compiled")
# The kernel's goals: forward >= 90% and backward >= 85% of a same-bytes copy (the bytes it must
# move anyway), <= 10% spread over 3 processes (so one figure stands for all).
TARGETS = {"copy_fraction": 0.90, "copy_fraction_bwd": 0.85, "process_spread": 0.10, "vs_llava": 20.0, "vs_compiled_fixed": 1.3, "vs_compiled_changing": 3.0}
# Fields of one process's rows that a merge over processes does not keep (per-process detail).
PER_PROCESS_ONLY = ("q20_ms", "q80_ms", "events_ms", "graph_ms", "first_call_s", "warm", "copy_frac")


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

    Kernel, copy and the PyTorch paths are timed by ``measure`` with the clocks warmed for
    ``warm_s`` and the inputs rotated over ``rotation_count`` sets (each call reads memory the
    cache no longer holds); kernel and copy by CUDA-graph replays, the host time apart. The
    backward of the kernel is its launcher (``pool_pack_bwd``, what autograd's backward calls)
    into a preallocated gradient, so it can be captured; the PyTorch paths' backward goes
    through autograd (rebuilt before every call, so eager)."""
    rows: List[Dict] = []
    dev = case.device
    tk = dict(device=dev, rep=rep, warm_s=warm_s)
    n_fwd_sets = rotation_count(case.fwd_bytes() + case.embeds.numel() * case.embeds.element_size(), dev)
    n_bwd_sets = rotation_count(case.bwd_bytes(), dev)
    sets = case.rotation(max(n_fwd_sets, n_bwd_sets))

    # (d) copy of the same bytes, forward and backward byte counts, rotated like the rest.
    copy_f = copy_b = None
    if "copy" in methods:
        t_cf = measure(copy_fns(case.fwd_bytes(), dev, n_fwd_sets), graph=True, **tk)
        copy_f = _record(rows, case, "fwd", "copy", t_cf, case.fwd_bytes())["gbps"]
        t_cb = measure(copy_fns(case.bwd_bytes(), dev, n_bwd_sets), graph=True, **tk)
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
        fwd["kernel"] = measure([lambda f=f, e=e: pool_pack(f, sc, GRID, out=e, dest=dest, backend="triton")
                                 for f, e in fwd_sets], graph=True, **tk)
    if "llava" in methods:
        # Baselines: eager (events), no graph capture: masked_scatter and the PyTorch path are
        # not written to be capturable, and a failed capture is not worth the risk mid-run.
        fwd["llava"] = measure([lambda f=f, e=e: llava_forward(f, sc, e.view(1, -1, case.D), case.mask)
                                for f, e in fwd_sets], **tk)
    if "torch" in methods:
        fwd["torch"] = measure([lambda f=f, e=e: pool_pack(f, sc, GRID, out=e, dest=dest, backend="torch")
                                  for f, e in fwd_sets], **tk)
    extra_c = {}
    f, emb2d = case.frames, case.embeds.view(-1, case.D)
    if compile_ and "compiled" in methods:
        torch._dynamo.reset()
        comp = torch.compile(reference_into, dynamic=False)
        # One input set, so the L2 is flushed before each call instead of rotated
        fwd["compiled"] = measure(lambda: comp(f, sc, emb2d, dest), device=dev, rep=rep,
                                  warmup=warmup, flush_l2=True)
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
        t = measure([lambda g=g, dx=dx: pool_pack_bwd(g, plan, tiles, n_fwd, dest_t, dx)
                     for (_, g), dx in zip(bwd_sets, dxs)], graph=True, **tk)
        _record(rows, case, "bwd", "kernel", t, case.bwd_bytes(), copy_gbps)
    bwd_fns = {}
    if "llava" in methods:
        bwd_fns["llava"] = lambda a: llava_packed(a, sc)
    if "torch" in methods:
        bwd_fns["torch"] = lambda a: pool_pack(a, sc, GRID, backend="torch")
    if compile_ and "compiled" in methods:
        torch._dynamo.reset()
        compb = torch.compile(reference_packed, dynamic=False)
        bwd_fns["compiled"] = lambda a: compb(a, sc)
    leaves = [fs.detach().clone().requires_grad_(True) for fs, _ in bwd_sets] if bwd_fns else []
    for m, fn in bwd_fns.items():
        state = {}

        def setup(i, fn=fn):
            a = leaves[i % len(leaves)]
            a.grad = None
            state["y"], state["g"] = fn(a), bwd_sets[i % len(bwd_sets)][1]

        t = measure(lambda: state["y"].backward(state["g"]), setup=setup, **tk)
        _record(rows, case, "bwd", m, t, case.bwd_bytes(), copy_gbps)


def _changing(case: Case, comp, rep: int):
    """A new schedule every call (a random permutation of the same frames' windows, so the
    byte count stays put). Wall time per call includes whatever dynamo does: recompiles (counted
    from its stats) until its recompile limit, then its eager fallback."""
    from torch._dynamo.utils import counters
    dev = case.device
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
        comp(case.frames, sc, emb2d, dest)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return Timing.of(times, first_call=times[0]), dict(
        recompiles=counters["stats"]["unique_graphs"] - before, calls=len(times),
        mean_ms=sum(times) / len(times) * 1e3)


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


CPU_COMPARE = dict(T=64, D=896, mix="paper")


def cpu_vs_compile(rep: int, out: Optional[str] = None, dtypes=("float32", "bfloat16"),
                   append: bool = False) -> Dict:
    """The CPU path (``backend="torch"``) against ``torch.compile`` of the reference at T=64,
    D=896 (the paper's mix), forward (into ``out`` at ``dest``, as the runtime calls it) and
    forward+backward (packed output, gradient w.r.t. the frames), on ONE thread, timed in
    alternating blocks (bench.harness.compare); medians, with the compile time apart."""
    torch.set_num_threads(1)
    env = environment(torch.device("cpu"))
    rows = [row for dt_name in dtypes for row in _compare_dtype(dt_name, rep)]
    notes = ["CPU figures, 1 torch thread, T=64 frames of 16x16 tokens, D=896, windows 1/2/4/8 and "
             f"dropped frames (the paper's mix); the two methods alternate in blocks of {BLOCK} calls; the machine is "
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
                  label="CPU", append=append, case=CPU_COMPARE, rep=rep, results=rows)


def _compare_dtype(dt_name: str, rep: int) -> List[Dict]:
    """The rows of one dtype of ``cpu_vs_compile``: fwd, fwd packed and fwd+bwd."""
    dtype = getattr(torch, dt_name)
    case = Case(CPU_COMPARE["T"], CPU_COMPARE["D"], CPU_COMPARE["mix"], dtype, torch.device("cpu"))
    f, sc, dest = case.frames, case.scales, case.dest
    emb2d = case.embeds.view(-1, case.D).clone()
    fr = f.detach().clone().requires_grad_(True)
    g = torch.randn(case.total, case.D, dtype=dtype)
    torch._dynamo.reset()
    comp_fwd = torch.compile(reference_into, dynamic=False)
    comp_packed = torch.compile(reference_packed, dynamic=False)
    compile_fwd = first_call_s(lambda: comp_fwd(f, sc, emb2d, dest))
    compile_bwd = first_call_s(lambda: comp_packed(fr, sc).backward(g))

    def fb(fn):
        fr.grad = None
        fn(fr, sc).backward(g)

    comp_packed(f, sc)  # same compiled function; a no-grad input gets its own graph
    pairs = {
        "fwd": (lambda: pool_pack(f, sc, GRID, out=emb2d, dest=dest, backend="torch"),
                lambda: comp_fwd(f, sc, emb2d, dest)),
        "fwd packed": (lambda: pool_pack(f, sc, GRID, backend="torch"), lambda: comp_packed(f, sc)),
        "fwd+bwd": (lambda: fb(lambda a, s: pool_pack(a, s, GRID, backend="torch")),
                    lambda: fb(comp_packed)),
    }
    rows = []
    for direction, (ours, theirs) in pairs.items():
        t_ours, t_theirs = alternate(ours, theirs, rep=rep)
        q = lambda t: [t.q20 * 1e3, t.q80 * 1e3]  # noqa: E731
        rows.append(dict(dtype=dt_name, dir=direction, torch_path_ms=t_ours.median_ms,
                         compiled_ms=t_theirs.median_ms, speedup=t_theirs.median / t_ours.median,
                         torch_path_q20_q80_ms=q(t_ours), compiled_q20_q80_ms=q(t_theirs),
                         compile_s=compile_bwd if direction == "fwd+bwd" else compile_fwd,
                         target_met=t_ours.median <= t_theirs.median))
        print(rows[-1], flush=True)
    return rows


def parse_args(argv: Optional[List[str]] = None):
    """(arguments, the methods to time); argparse's exit 2 on a bad one."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="paper shape only (GPU) / tiny sizes (CPU)")
    p.add_argument("--out", default=None, help="results file (.json; a .md table is written beside it)")
    add_append_flag(p)
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
            cases += [dict(T=T, D=D, mix=mix) for mix in MIXES for T in (16, 64, 256, 1024)
                      for D in (896, 3584, 5120) if dict(T=T, D=D, mix=mix) != PAPER]
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
    notes.append(f"Method (bench.harness.timing.measure): {args.warm_ms:g} ms of work first to warm the clocks; "
                 "inputs rotated over enough sets that the memory touched between two uses of a set "
                 "is >= 2x the last-level cache (rotation: the sets used), so every call reads cold memory; "
                 "device time from CUDA-graph replays where capture works, else CUDA events "
                 "(eager); host_ms is the host's time to issue one call, apart. The kernel's "
                 "backward is its launcher into a preallocated gradient.")
    return cases, rep, warmup, compile_paper, notes


def _out(args, env, gpu: bool) -> str:
    name = "pool_pack_" + (_slug(env["device"]) if gpu else "cpu") + ".json"
    return args.out or os.path.join(RESULTS, name)


def main(argv: Optional[List[str]] = None) -> Dict:
    args, methods = parse_args(argv)
    if args.cpu_vs_compile:
        return cpu_vs_compile(args.rep or 30, args.out, append=args.append)
    if args.processes > 1:
        return in_processes(args, methods)
    gpu = has_cuda()
    device = torch.device("cuda" if gpu else "cpu")
    cases, rep, warmup, compile_paper, notes = plan_cases(args, gpu)
    for n in notes:
        print("NOTE:", n)
    rows: List[Dict] = []
    t_start = time.perf_counter()
    env = environment(device)
    out = _out(args, env, gpu)
    for i, c in enumerate(cases):
        case = Case(c["T"], c["D"], c["mix"], torch.bfloat16, device)
        rows += bench_case(case, kernel=gpu, compile_=(compile_paper and c == PAPER), rep=rep,
                           warmup=warmup, warm_s=args.warm_ms / 1e3, methods=methods)
        if gpu:
            del case
            torch.cuda.empty_cache()
        print(f"case {i + 1}/{len(cases)} {c} done, {time.perf_counter() - t_start:.0f} s", flush=True)
        if i + 1 < len(cases) and not args.append:
            # The full GPU sweep takes minutes: keep what is measured if the run is cut short.
            pool_pack_report.write(out, env, notes, rows, gpu=gpu, targets=TARGETS, t_start=t_start,
                                     done=f"{i + 1} of {len(cases)} cases")
    return pool_pack_report.write(out, env, notes, rows, gpu=gpu, targets=TARGETS, t_start=t_start,
                                  show=True, append=args.append)


def merge_processes(payloads: List[Dict]) -> List[Dict]:
    """One row per (case, dir, method) from several processes' results: the median of their
    medians, each process's figure and the spread (bench.harness.processes.merge_rows), the
    host time's median; bandwidth and the fraction of a copy from the merged medians."""
    rows = merge_rows([r for pl in payloads for r in pl["results"]], ("T", "D", "mix", "dir", "method"),
                      medians=("host_ms",), drop=PER_PROCESS_ONLY)
    for r in rows:
        r["gbps"] = gbps(r["bytes"], r["median_ms"] / 1e3)
    copies = {(r["T"], r["D"], r["mix"], r["dir"]): r["gbps"] for r in rows if r["method"] == "copy"}
    for r in rows:
        c = copies.get((r["T"], r["D"], r["mix"], r["dir"]))
        if r["method"] != "copy" and c:
            r["copy_frac"] = r["gbps"] / c
    return rows


def _child_argv(args, methods: List[str]) -> List[str]:
    """One process's command line: the same cases, methods and timing as the parent's."""
    child = ["--processes", "1", "--warm-ms", str(args.warm_ms), "--methods", ",".join(methods)]
    child += [f for f, on in (("--quick", args.quick), ("--no-compile", args.no_compile),
                              ("--no-sweep", args.no_sweep)) if on]
    return child + (["--rep", str(args.rep)] if args.rep is not None else [])


def in_processes(args, methods: List[str]) -> Dict:
    """The same cases in ``args.processes`` fresh processes, one after another; each process's
    results are kept in the run's ``per_process`` (bench.harness.processes)."""
    gpu = has_cuda()
    env = environment(torch.device("cuda" if gpu else "cpu"))
    out = _out(args, env, gpu)
    t_start = time.perf_counter()
    n = args.processes
    payloads = run_processes(MODULE, [(f"process {i} of {n}", _child_argv(args, methods))
                                      for i in range(1, n + 1)])
    notes = list(payloads[0]["notes"]) + [
        f"Each row: the median of {n} fresh processes' medians; spread = max/min - 1 across "
        "them; each process's results: per_process."]
    return pool_pack_report.write(out, env, notes, merge_processes(payloads), gpu=gpu, targets=TARGETS,
                                  t_start=t_start, show=True, append=args.append,
                                  extra=dict(processes=n, per_process=payloads))


if __name__ == "__main__":
    main()
