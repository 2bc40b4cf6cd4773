"""The pool_pack benchmark's results as text: the kernel's speedups over each baseline, its
goals met or not, and the page of every row (bench/scripts/bench_pool_pack.py measures)."""
from __future__ import annotations

import time
from typing import Dict, List

import torch

from bench.harness.results import finish, write_results
from bench.harness.tables import markdown_table
from bench.harness.targets import meets
from bench.models.pool_pack_inputs import GRID, PAPER

BYTE_COUNTS = ("fwd = (kept_frames*N*D + out_rows*D) * elem_size; bwd = (out_rows*D + T*N*D) * elem_size; "
               "copy moves the same total (half read, half written)")


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
        for b in ("llava", "torch", "compiled", "compiled_changing"):
            if b in ms:
                s[f"vs_{b}"] = ms[b]["median_ms"] / k["median_ms"]
        out.append(s)
    return out


def check_targets(sp: List[Dict], targets: Dict[str, float]) -> List[str]:
    """The goals at the paper shape: the fraction of a copy's bandwidth, the spread over
    processes, and the speedups over the baselines."""
    lines = []
    for s in sp:
        if (s["T"], s["D"], s["mix"]) != (PAPER["T"], PAPER["D"], PAPER["mix"]):
            continue
        d = s["dir"]
        lines.append(meets(f"{d}: {{value}} of copy bandwidth", s.get("copy_frac") or 0.0,
                           targets["copy_fraction_bwd" if d == "bwd" else "copy_fraction"]))
        if s.get("spread") is not None:
            lines.append(meets(f"{d}: kernel spread over {s['processes']} processes {{value}}",
                               s["spread"], targets["process_spread"], at_least=False))
        for b, tgt in (("llava", "vs_llava"), ("compiled", "vs_compiled_fixed"),
                       ("compiled_changing", "vs_compiled_changing")):
            if s.get(f"vs_{b}") is not None:
                lines.append(meets(f"{d}: {{value}} vs {b}", s[f"vs_{b}"], targets[tgt], fmt="{:.1f}x"))
    return lines


def markdown(env, notes, rows, sp, verdict, gpu: bool) -> str:
    """The page: every row (with the spread where processes were merged), the speedups, the goals."""
    cols = ["T", "D", "mix", "dir", "method", "median_ms", "gbps", "copy_frac", "host_ms", "timed_by"]
    heads = ["T", "D", "mix", "dir", "method", "median ms", "GB/s", "of copy BW", "host ms", "timed by"]
    if any("spread" in r for r in rows):
        cols[6:6], heads[6:6] = ["spread"], ["spread"]
    md = [f"# pool_pack benchmark ({env['device']})", "",
          f"date {env['date_utc']}, torch {env['torch']}, triton {env['triton']}, cuda {env['cuda']}",
          f"command: `{env['command']}`" + (f", 1-min load average {env['load_avg_1m']}" if not gpu else ""),
          ""] + [f"> {n}" for n in notes] + ["", markdown_table(rows, cols, heads)]
    if sp:
        md += ["", "## Kernel speedups", "",
               markdown_table(sp, ["T", "D", "mix", "dir", "kernel_ms", "copy_frac", "vs_llava", "vs_torch",
                                   "vs_compiled", "vs_compiled_changing"])]
    return "\n".join(md + ["", "## Targets", ""] + [f"- {v}" for v in verdict])


def write(out, env, notes, rows, *, gpu: bool, targets: Dict[str, float], t_start: float,
          done=None, show=False, append=False, extra=None) -> Dict:
    """Write the results (JSON + markdown); ``done`` marks a partial file written mid-run."""
    sp = speedups(rows)
    verdict = check_targets(sp, targets) if gpu else ["targets need a GPU (not evaluated)"]
    notes = list(notes) + ([f"PARTIAL results: {done} (the run was still going)"] if done else [])
    payload = dict(environment=env, notes=notes, dtype=str(torch.bfloat16), grid=list(GRID), byte_counts=BYTE_COUNTS,
                   results=rows, speedups=sp, targets=verdict, elapsed_s=time.perf_counter() - t_start, **(extra or {}))
    page = markdown(env, notes, rows, sp, verdict, gpu)
    if show:
        finish(out, payload, page, append=append)
    else:  # a partial file written mid-run: quietly
        write_results(out, payload, page)
    return payload
