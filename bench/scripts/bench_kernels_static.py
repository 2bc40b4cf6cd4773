"""Static figures of the pool-and-pack kernels on sm_90 (H100), obtained without a GPU.

    python -m bench.scripts.bench_kernels_static [--out bench/results/kernels_sm90_static.json] [--before COMMIT]

Every shipped autotuning configuration of ``vr_kernels.pool_pack`` is compiled for sm_90 and its
SASS read back by ``vr_kernels.sass`` (what is recorded, and the bounds, are said there); this
script runs it over every configuration and writes the figures. ``--before COMMIT`` also
compiles the kernels as they were at that commit (default: the commit before the rewrite of the
window path) for the before/after comparison.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from typing import Dict, List, Optional

from bench.harness.env import environment, environment_line
from bench.harness.results import RESULTS, finish
from bench.harness.tables import markdown_table
from vr_kernels.sass import BOUNDS, run_jobs, shipped_jobs, violations

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: The commit whose kernels are the "before" of the before/after table.
BEFORE_COMMIT = "21b719f"
# The old kernels took the grid, the hidden size and the frame strides as runtime int32
# arguments (the hidden size and the token stride 16-divisible), and had no register cap.
OLD_SIGNATURE = dict(types=dict(H="i32", W="i32", D="i32", stride_xn="i32", stride_xd="i32"),
                     aligned=("D", "stride_xn"), shipped=False, version="before")


def before_jobs(source: str, dtypes=("bf16",)) -> List[Dict]:
    """The old kernels' configurations (BLOCK_T, BLOCK_D, warps) as the old _configs made them."""
    jobs = []
    cfgs = [(bt, bd, nw) for bt in (8, 16) for bd in (128, 256, 512) for nw in (2, 4, 8)
            if 8 <= bt * bd // (32 * nw) <= 64]
    for dt in dtypes:
        for bt, bd, nw in cfgs:
            meta = dict(BLOCK_T=bt, BLOCK_D=bd)
            jobs.append(dict(OLD_SIGNATURE, kernel="fwd", dtype=dt, meta=meta, num_warps=nw, source=source))
            jobs.append(dict(OLD_SIGNATURE, kernel="bwd", dtype=dt, meta=meta, num_warps=nw, write_dx=True,
                             zero_dy=False, source=source))
    return jobs


def _summary_rows(results: List[Dict]) -> List[Dict]:
    rows = []
    for r in results:
        c = r["config"]
        cfg = "x".join(str(c.get(k)) for k in ("BLOCK_R", "BLOCK_T", "BLOCK_D", "num_warps") if k in c)
        row = dict(
            version=r["version"], kernel=r["kernel"] + (
                "" if r["kernel"] == "fwd" else f" dx={int(r['write_dx'])} dy={int(r['zero_dy'])}"),
            dtype=r["dtype"], config=cfg, registers=r["registers"], occupancy=r["occupancy"],
            spills=r["spill_instructions"], shared=r["shared_bytes"], barriers=r["barriers"],
            ldg128=r["mix"].get("LDG.128bit", 0), stg128=r["mix"].get("STG.128bit", 0),
            div_full=r["ptx_div_full_f32"], int_div=r["ptx_int_div"], compile_s=r["compile_s"])
        for lp in r["hot_loops"]:
            if lp["instr_per_element"] is not None:
                k = f"ipe_{lp['path']}"
                row[k] = round(max(row.get(k, 0), lp["instr_per_element"]), 2)
        rows.append(row)
    return rows


def before_window_path(results: List[Dict]) -> List[Dict]:
    """Every data-moving or synchronising loop of the old kernels (the raw material of
    :func:`before_after`)."""
    rows = []
    for r in results:
        for lp in r["loops"]:
            if lp["ldg128"] or lp["stg128"] or lp["barriers"]:
                rows.append(dict(kernel=r["kernel"], dtype=r["dtype"], config=r["config"], start=lp["start"],
                                 innermost=lp["innermost"], instructions=lp["instructions"],
                                 ldg128=lp["ldg128"], stg128=lp["stg128"], barriers=lp["barriers"],
                                 instr_per_loaded_element=lp["instr_per_loaded_element"],
                                 instr_per_stored_element=lp["instr_per_stored_element"]))
    return rows


def _old_paths(r: Dict) -> Dict:
    """The old forward's two paths: the ROWS path (small windows) is the innermost load loop
    outside the loop that holds the barriers; the WINDOW path (large windows) is the innermost
    load loop inside it, and that loop's own body is the per-output-row cross-warp sum."""
    lps = r["loops"]
    outer = [lp for lp in lps if lp["barriers"]]
    res = {}
    if outer:
        o = outer[0]
        lo, hi = int(o["start"], 16), int(o["end"], 16)
        inner = [lp for lp in lps if lp["innermost"] and lp["ldg128"] and lo <= int(lp["start"], 16) <= hi]
        rows = [lp for lp in lps if lp["innermost"] and lp["ldg128"] and not lo <= int(lp["start"], 16) <= hi]
        res["window"] = max((lp["instr_per_loaded_element"] for lp in inner), default=None)
        res["window_row_epilogue_instructions"] = o["instructions"]
        res["window_row_barriers"] = o["barriers"]
        res["rows"] = max((lp["instr_per_loaded_element"] for lp in rows), default=None)
    return res


def before_after(results: List[Dict], before: List[Dict]) -> List[Dict]:
    """Forward, bf16: instructions per loaded element on the small-window and the large-window
    paths, old kernels (every old configuration) against the new ones (every shipped one)."""
    out = []
    for r in before:
        if r["kernel"] != "fwd" or r["dtype"] != "bf16":
            continue
        p = _old_paths(r)
        c = r["config"]
        out.append(dict(version="before", config=f"{c['BLOCK_T']}x{c['BLOCK_D']}x{c['num_warps']}",
                        registers=r["registers"], occupancy=r["occupancy"],
                        small_windows=p.get("rows"), large_windows=p.get("window"),
                        per_row_extra=p.get("window_row_epilogue_instructions"),
                        barriers=r["barriers"], shared=r["shared_bytes"], div_full=r["ptx_div_full_f32"]))
    for r in results:
        if r["kernel"] != "fwd" or r["dtype"] != "bf16":
            continue
        ipe = {lp["path"]: lp["instr_per_element"] for lp in r["hot_loops"]}
        c = r["config"]
        out.append(dict(version="after", config=f"{c['BLOCK_R']}x{c['BLOCK_D']}x{c['num_warps']}",
                        registers=r["registers"], occupancy=r["occupancy"],
                        small_windows=max(ipe.get("1x1", 0), ipe.get("2x2", 0)),
                        large_windows=max(ipe.get("4x4", 0), ipe.get("8x8", 0)), per_row_extra=0,
                        barriers=r["barriers"], shared=r["shared_bytes"], div_full=r["ptx_div_full_f32"]))
    return out


def main(argv: Optional[List[str]] = None) -> Dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(RESULTS, "kernels_sm90_static.json"))
    p.add_argument("--before", default=BEFORE_COMMIT, help="commit of the 'before' kernels ('' to skip)")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)

    t0 = time.perf_counter()
    # A fresh Triton cache, so that compile_s is a cold compile (what a first request would pay).
    cache = tempfile.mkdtemp(prefix="triton_cache_")
    os.environ["TRITON_CACHE_DIR"] = cache
    results = run_jobs([dict(j, version="after") for j in shipped_jobs()], args.workers)
    before = []
    if args.before:
        src = subprocess.run(["git", "-C", ROOT, "show", f"{args.before}:vr_kernels/pool_pack.py"],
                             capture_output=True, text=True, check=True).stdout
        before = run_jobs(before_jobs(src), args.workers)
    shutil.rmtree(cache, ignore_errors=True)
    bad = [v for r in results for v in violations(r)]
    env = environment(None)
    env["device"] = "static: sm_90 (H100) SASS compiled on a machine without a GPU"
    env["compiled_by"] = "triton.compile(target=GPUTarget('cuda', 90, 32)) + cuobjdump"
    notes = [
        "STATIC figures: read from the compiled sm_90 SASS, not measured on a GPU. Occupancy is "
        "theoretical (registers, warps, shared memory of an H100 SM).",
        "ipe_<path>: instructions in one iteration of the innermost data-moving loop of that path "
        "divided by the elements one thread loads (fwd) or stores (bwd) in it (max over the path's "
        "loops). Paths: the constexpr window specialisations 1x1/2x2/4x4/8x8 and the generic path. "
        "The 'before' kernels have no specialisations: their loops are listed in before_loops.",
        "compile_s: a cold compile for sm_90 on this CPU (fresh Triton cache, 2 compiles at a time, "
        "machine shared), i.e. what a first request pays per configuration without warmup().",
        f"Bounds asserted by tests/kernels/test_kernels_static.py: {BOUNDS}.",
    ]
    rows = _summary_rows(results + before)
    cols = ["version", "kernel", "dtype", "config", "registers", "occupancy", "spills", "shared", "barriers",
            "ldg128", "stg128", "ipe_1x1", "ipe_2x2", "ipe_4x4", "ipe_8x8", "ipe_generic", "div_full", "int_div",
            "compile_s"]
    md = ["# pool_pack kernels: static sm_90 figures", "",
          environment_line(env, ("triton",), load=False), ""]
    ba = before_after(results, before)
    if ba:
        md += ["## Before / after (forward, bf16, instructions per loaded element)", "",
               markdown_table(ba, ["version", "config", "registers", "occupancy", "small_windows", "large_windows",
                                   "per_row_extra", "barriers", "shared", "div_full"],
                              ["version", "config (rows x D x warps)", "registers", "occupancy",
                               "1x1/2x2 path", "4x4/8x8 path", "extra instr per large-window row (cross-warp sum)",
                               "BAR.SYNC", "shared B", "div.full.f32 (PTX)"]), ""]
    md += [f"> {n}" for n in notes] + ["", "## Every shipped configuration", "", markdown_table(rows, cols), "",
                                       "Violations of the bounds: " + ("; ".join(bad) if bad else "none")]
    payload = dict(environment=env, label="static", notes=notes, bounds=BOUNDS, before_commit=args.before or None,
                   summary=rows, results=results, before=before, before_loops=before_window_path(before),
                   before_after=ba,
                   violations=bad,
                   elapsed_s=time.perf_counter() - t0)
    finish(args.out, payload, "\n".join(md))
    return payload


if __name__ == "__main__":
    main()
