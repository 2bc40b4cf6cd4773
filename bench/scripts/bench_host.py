"""Host time of one ``pool_pack`` call before its launch, on one CPU thread.

    python -m bench.scripts.bench_host [--out bench/results/host_cpu.json] [--before COMMIT] [--n 2000]

What is timed: ``pool_pack(frames, scales, out=embeds2d, dest=dest, backend="triton")`` (the
runtime's call) and the packed form without ``out``, with the kernel launch replaced by a no-op,
so the figure is the Python/PyTorch work on the host: argument checks, the schedule's tile table
(built or found in the cache), the ``dest`` vector, the autograd Function. No GPU is needed, and
the launch itself (Triton's launcher, ~20-40 us on a GPU host) is not included.

Scenarios, at T = 64 and 1024 frames (16x16 grids, windows drawn from 0/1/2/4/8):

* ``hit``: the same schedule and dest as the previous call (the caches hit);
* ``new_dest``: the same windows, another ``dest`` (another prompt length or batch slot);
* ``miss``: a schedule never seen before (a new router decision) with its own dest.

Each figure is the median over ``--n`` calls (per-call ``perf_counter_ns``); the machine is
shared, so the 20%/80% quantiles are given too. ``--before COMMIT`` runs the same measurement
on ``vr_kernels`` as it was at that commit (extracted with ``git archive``), in a subprocess.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

# The Triton path on CPU tensors needs the interpreter flag at import; the launch is stubbed out.
os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "bench", "results")
TARGETS_US = {("hit", 64): 15.0, ("hit", 1024): 60.0, ("miss", 64): 100.0}
WINDOWS = [0, 1, 2, 4, 8]
GRID = (16, 16)


def _schedules(T: int, n: int, seed: int) -> List[list]:
    rng = random.Random(seed)
    return [[rng.choice(WINDOWS) for _ in range(T)] for _ in range(n)]


def _dest(scales, shift: int) -> list:
    from vr_kernels import pooled_counts
    d, pos = [], 16 + shift
    for c in pooled_counts(scales, GRID):
        pos += 5 if c else 0                   # "FrameN: <img>" text rows
        d.append(pos if c else 0)
        pos += c
    return d


def measure(n: int) -> List[Dict]:
    import torch
    torch.set_num_threads(1)
    from vr_kernels import pool_pack
    # The module (the package's `pool_pack` attribute is the function of the same name).
    pp = sys.modules["vr_kernels.pool_pack"]
    pp.pool_pack_fwd = lambda *a, **k: None   # no-op launch: host time only
    D = 896
    rows = []
    for T in (64, 1024):
        frames = torch.zeros(T, GRID[0] * GRID[1], D, dtype=torch.bfloat16)
        scheds = _schedules(T, n + 1, seed=T)
        L = 16 + n + 2 + T * (5 + GRID[0] * GRID[1]) + 64   # room for any schedule and shift
        out = torch.zeros(L, D, dtype=torch.bfloat16)
        base = scheds[0]
        cases = {
            "hit": [(list(base), _dest(base, 0)) for _ in range(n)],
            "new_dest": [(list(base), _dest(base, 1 + i)) for i in range(n)],
            "miss": [(s, _dest(s, 0)) for s in scheds[1:]],
        }
        for with_out in (True, False):
            for name, calls in cases.items():
                if not with_out and name == "new_dest":
                    continue
                pool_pack(frames, calls[0][0], GRID, **({"out": out, "dest": calls[0][1]} if with_out else {}),
                          backend="triton")  # imports, first-call setup
                ts = []
                for sc, de in calls:
                    kw = {"out": out, "dest": de} if with_out else {}
                    t0 = time.perf_counter_ns()
                    pool_pack(frames, sc, GRID, **kw, backend="triton")
                    ts.append(time.perf_counter_ns() - t0)
                ts.sort()
                rows.append(dict(T=T, scenario=name, out=with_out, calls=len(ts),
                                 median_us=statistics.median(ts) / 1e3,
                                 q20_us=ts[len(ts) // 5] / 1e3, q80_us=ts[(4 * len(ts)) // 5] / 1e3))
                print(rows[-1], flush=True)
    return rows


def _before(commit: str, n: int) -> List[Dict]:
    """The same measurement on the vr_kernels of ``commit`` (in a subprocess)."""
    with tempfile.TemporaryDirectory() as d:
        arch = subprocess.run(["git", "-C", ROOT, "archive", commit, "vr_kernels"], capture_output=True,
                              check=True).stdout
        subprocess.run(["tar", "-x", "-C", d], input=arch, check=True)
        out = os.path.join(d, "rows.json")
        env = dict(os.environ, PYTHONPATH=d)
        subprocess.run([sys.executable, os.path.abspath(__file__), "--measure-only", out, "--n", str(n)],
                       env=env, check=True)
        with open(out) as f:
            return json.load(f)


def main(argv: Optional[List[str]] = None) -> Dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(RESULTS, "host_cpu.json"))
    p.add_argument("--n", type=int, default=2000, help="calls per scenario")
    p.add_argument("--before", default="21b719f", help="commit to compare with ('' to skip)")
    p.add_argument("--measure-only", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.measure_only:
        with open(args.measure_only, "w") as f:
            json.dump(measure(args.n), f)
        return {}

    from bench.harness.env import environment
    from bench.harness.results import report
    from bench.harness.tables import markdown_table
    import torch
    torch.set_num_threads(1)
    env = environment(torch.device("cpu"))
    rows = measure(args.n)
    before = _before(args.before, max(50, args.n // 10)) if args.before else []
    bmap = {(r["T"], r["scenario"], r["out"]): r["median_us"] for r in before}
    for r in rows:
        b = bmap.get((r["T"], r["scenario"], r["out"]))
        if b is None and r["scenario"] == "new_dest":  # the old cache keyed on dest: a miss
            b = bmap.get((r["T"], "miss", r["out"]))
        r["before_us"] = b
        r["speedup"] = (b / r["median_us"]) if b else None
        tgt = TARGETS_US.get((r["scenario"], r["T"])) if r["out"] else None
        r["target_us"] = tgt
        r["target_met"] = None if tgt is None else r["median_us"] <= tgt
    verdict = [f"{r['scenario']} at T={r['T']}: {r['median_us']:.1f} us (target <= {r['target_us']:.0f} us): "
               f"{'met' if r['target_met'] else 'NOT met'}" for r in rows if r["target_us"]]
    notes = ["CPU host time per pool_pack call, launch replaced by a no-op, 1 torch thread, bf16 frames "
             "[T, 256, 896]; 'out' = the runtime's call (out=embeds2d, dest=...), otherwise the packed "
             "output. The machine is shared with other jobs: medians of many calls, quantiles given.",
             f"before = vr_kernels at commit {args.before}, measured in the same run ({max(50, args.n // 10)} "
             f"calls per scenario); its tile cache keyed on dest, so its new_dest is a miss."]
    cols = ["T", "scenario", "out", "median_us", "q20_us", "q80_us", "before_us", "speedup", "target_us", "target_met"]
    body = [markdown_table(rows, cols), "", "## Targets", ""] + [f"- {v}" for v in verdict]
    return report(args.out, "# pool_pack host time before the launch (CPU, 1 thread)", env, notes,
                  body, label="CPU", results=rows, before=before, targets=verdict)


if __name__ == "__main__":
    main()
