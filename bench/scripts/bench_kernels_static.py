"""Static figures of the pool-and-pack kernels on sm_90 (H100), obtained without a GPU.

    python bench/scripts/bench_kernels_static.py [--out bench/results/kernels_sm90_static.json] [--before COMMIT]

Every shipped autotuning configuration of ``vr_kernels.pool_pack`` is compiled for sm_90 by
Triton's NVIDIA backend (ptxas ships with the triton wheel) and its SASS is read with
``cuobjdump`` (also in the wheel). Recorded per kernel x dtype x configuration:

* registers per thread, stack/local bytes, spill instructions (STL/LDL), shared memory;
* theoretical occupancy on an H100 SM (65,536 registers, 64 warps, 32 blocks, 228 KB shared);
* the instruction mix (global loads/stores by width, FP adds, conversions, integer ops,
  barriers, branches);
* every loop of the SASS (a backward branch) with its instructions per loaded element and per
  stored element: the instruction count of the loop body divided by the elements one thread
  moves in one iteration (a 128-bit load of bf16 moves 8).

These are STATIC figures (what the compiler emitted), not measurements: they say nothing of
achieved bandwidth, which needs a GPU. ``--before COMMIT`` also compiles the kernels as they
were at that commit (default: the commit before the rewrite of the window path) for the
before/after comparison.

``tests/kernels/test_kernels_static.py`` uses the same functions to assert the bounds in
:data:`BOUNDS` on every shipped configuration.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

#: The commit whose kernels are the "before" of the before/after table.
BEFORE_COMMIT = "21b719f"

#: What tests/kernels/test_kernels_static.py asserts for every shipped configuration.
BOUNDS = {
    "spill_instructions": 0,             # no STL/LDL, no local memory
    "min_occupancy": 0.5,                # theoretical, H100 SM
    "barriers": 0,                       # no cross-warp reduction
    # Per iteration of the loop of each specialised window (1x1, 2x2, 4x4, 8x8: the hot paths):
    "fwd_instr_per_loaded_element": 4.0,
    "bwd_instr_per_stored_element": 4.0,
    # Innermost loops of the generic (any other window) path:
    "generic_instr_per_element": 6.0,
}

DTYPES = {"bf16": 2, "fp16": 2, "fp32": 4}
# Backward variants (WRITE_DX, ZERO_DY): frames' gradient only (the training case), both
# (frames and out require grad), out only.
BWD_VARIANTS = [(True, False), (True, True), (False, True)]

# H100 (sm_90) per-SM limits.
SM90 = dict(regs=65536, max_warps=64, max_blocks=32, smem=233472, smem_reserved=1024, reg_unit=256)

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")


def _tool(name: str) -> str:
    import triton
    p = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    if os.path.exists(p):
        return p
    found = shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} not found (it ships with triton's NVIDIA backend)")
    return found


def occupancy(regs: int, shared: int, num_warps: int) -> float:
    """Theoretical occupancy (active warps / 64) of an sm_90 SM."""
    per_warp = math.ceil(regs * 32 / SM90["reg_unit"]) * SM90["reg_unit"]
    blocks_regs = (SM90["regs"] // per_warp) // num_warps if per_warp else SM90["max_blocks"]
    blocks_smem = SM90["smem"] // (shared + SM90["smem_reserved"]) if shared else SM90["max_blocks"]
    blocks = min(SM90["max_blocks"], SM90["max_warps"] // num_warps, blocks_regs, blocks_smem)
    return blocks * num_warps / SM90["max_warps"]


def parse_sass(text: str) -> List[Dict]:
    """``[{addr, pred, op, args}]`` for every instruction of the (single) kernel in ``text``."""
    out = []
    for m in _LINE.finditer(text):
        out.append(dict(addr=int(m.group(1), 16), pred=(m.group(2) or "").strip(), op=m.group(3),
                        args=m.group(4).strip()))
    return out


def _ldst_bytes(op: str) -> int:
    parts = op.split(".")
    for w, b in (("128", 16), ("64", 8), ("U16", 2), ("S16", 2), ("U8", 1), ("S8", 1)):
        if w in parts:
            return b
    return 4


def instruction_mix(ins: List[Dict]) -> Dict[str, int]:
    mix: Dict[str, int] = {}

    def add(k, n=1):
        mix[k] = mix.get(k, 0) + n
    for i in ins:
        op = i["op"]
        base = op.split(".")[0]
        if base == "NOP":
            continue
        add("total")
        if base in ("LDG", "STG"):
            add(f"{base}.{_ldst_bytes(op) * 8}bit")
        elif base in ("STL", "LDL"):
            add("spill")
        elif base in ("FADD", "FFMA", "FMUL", "HADD2", "HFMA2"):
            add("fp_arith")
        elif base in ("F2FP", "F2F", "I2F", "F2I", "PRMT") or (base == "IMAD" and ".U32" in op):
            add("convert_or_permute")
        elif base in ("MUFU",):
            add("mufu")
        elif base in ("BAR",):
            add("barrier")
        elif base in ("SHFL",):
            add("shuffle")
        elif base in ("STS", "LDS"):
            add("shared_mem")
        elif base in ("BRA", "EXIT", "BSSY", "BSYNC", "WARPSYNC", "CALL", "RET"):
            add("control")
        else:
            add("int_or_other")
    return mix


def loops(ins: List[Dict], elem_bytes: int) -> List[Dict]:
    """Every loop (backward branch) with per-iteration instruction and element counts per thread.

    Nested loops: an outer loop's figures exclude its inner loops' bodies (what one outer
    iteration costs besides them)."""
    found = []
    for k, i in enumerate(ins):
        if i["op"].startswith("BRA"):
            m = re.search(r"0x([0-9a-f]+)", i["args"])
            if m and int(m.group(1), 16) <= i["addr"]:
                found.append((int(m.group(1), 16), i["addr"]))
    found = sorted(set(found))
    res = []
    for lo, hi in found:
        inner = [(a, b) for a, b in found if lo <= a and b <= hi and (a, b) != (lo, hi)]
        body = [i for i in ins if lo <= i["addr"] <= hi and not any(a <= i["addr"] <= b for a, b in inner)]
        body = [i for i in body if not i["op"].startswith("NOP")]
        ld = sum(_ldst_bytes(i["op"]) for i in body if i["op"].startswith("LDG"))
        st = sum(_ldst_bytes(i["op"]) for i in body if i["op"].startswith("STG"))
        n = len(body)
        res.append(dict(
            start=hex(lo), end=hex(hi), innermost=not inner, instructions=n,
            ldg128=sum(1 for i in body if i["op"].startswith("LDG.E.128")),
            stg128=sum(1 for i in body if i["op"].startswith("STG.E.128")),
            ldg_other=sum(1 for i in body if i["op"].startswith("LDG") and not i["op"].startswith("LDG.E.128")),
            stg_other=sum(1 for i in body if i["op"].startswith("STG") and not i["op"].startswith("STG.E.128")),
            barriers=sum(1 for i in body if i["op"].startswith("BAR")),
            elements_loaded=ld // elem_bytes, elements_stored=st // elem_bytes,
            instr_per_loaded_element=(n / (ld / elem_bytes)) if ld else None,
            instr_per_stored_element=(n / (st / elem_bytes)) if st else None,
        ))
    return res


def hot_loops(lps: List[Dict], kernel: str, zero_dy: bool = False) -> List[Dict]:
    """The innermost loops that move data, each labelled with the path it belongs to.

    A specialised window's loop holds both the loads and the stores of one step of output rows
    (its window loop is unrolled), so its window area is visible in the SASS: forward,
    ``LDG / STG`` (every output vector reads ``area`` input vectors); backward,
    ``(STG - zero-dy stores) / LDG`` (every dy vector is written to ``area`` tokens). The generic
    path's innermost loops hold only loads (fwd) or only stores (bwd): its window is runtime."""
    out = []
    for lp in lps:
        if not lp["innermost"]:
            continue
        ld, st = lp["ldg128"] + lp["ldg_other"], lp["stg128"] + lp["stg_other"]
        if kernel == "fwd" and ld:
            area = ld / st if st else None
        elif kernel == "bwd" and st:
            area = (st - (ld if zero_dy else 0)) / ld if ld else None
        else:
            continue
        if area is None:
            label = "generic"
        else:
            side = int(round(math.sqrt(area)))
            label = f"{side}x{side}" if side * side == area and side in (1, 2, 4, 8) else f"area {area:g}"
        ipe = lp["instr_per_loaded_element"] if kernel == "fwd" else lp["instr_per_stored_element"]
        out.append(dict(lp, path=label, instr_per_element=ipe))
    return out


def _kernel_module(source: Optional[str] = None):
    """``vr_kernels.pool_pack`` as it is now, or as ``source`` (an older version's text)."""
    if source is None:
        return importlib.import_module("vr_kernels.pool_pack")
    importlib.import_module("vr_kernels")
    spec = importlib.util.spec_from_loader("vr_kernels._pool_pack_before", loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "vr_kernels"
    fd, path = tempfile.mkstemp(suffix=".py", prefix="pool_pack_before_")
    with os.fdopen(fd, "w") as f:
        f.write(source)
    mod.__file__ = path  # triton.jit reads the kernels' source through inspect
    sys.modules[spec.name] = mod
    exec(compile(source, path, "exec"), mod.__dict__)
    return mod


def _cuobjdump(cubin_bytes: bytes):
    """(SASS listing, resource usage) of a compiled kernel, from the wheel's cuobjdump."""
    with tempfile.TemporaryDirectory() as d:
        cubin = os.path.join(d, "k.cubin")
        with open(cubin, "wb") as f:
            f.write(cubin_bytes)
        sass = subprocess.run([_tool("cuobjdump"), "-sass", cubin], capture_output=True, text=True, check=True).stdout
        res = subprocess.run([_tool("cuobjdump"), "-res-usage", cubin], capture_output=True, text=True,
                             check=True).stdout
    return sass, res


def compile_one(job: Dict) -> Dict:
    """Compile one kernel variant for sm_90 and analyse it (runs in a worker process)."""
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    mod = _kernel_module(job.get("source"))
    dt, kernel = job["dtype"], job["kernel"]
    es = DTYPES[dt]
    before = job.get("source") is not None
    if kernel == "fwd":
        jf = mod._pool_pack_fwd_kernel.fn
        types = dict(x=f"*{dt}", y=f"*{dt}", tiles="*i32", dest="*i32", SIZE_CLASS="i32",
                     stride_xt="i32", stride_yr="i32", stride_yd="i32")
        aligned = ("x", "y", "tiles", "dest", "stride_xt", "stride_yr")
        old = dict(H="i32", W="i32", D="i32", stride_xn="i32", stride_xd="i32")
    else:
        jf = mod._pool_pack_bwd_kernel.fn
        types = dict(dy=f"*{dt}", dx=f"*{dt}", dy_kept=f"*{dt}", tiles="*i32", dest="*i32", SIZE_CLASS="i32",
                     stride_dyr="i32", stride_dyd="i32", stride_xt="i32", stride_kr="i32", stride_kd="i32")
        aligned = ("dy", "dx", "dy_kept", "tiles", "dest", "stride_dyr", "stride_xt", "stride_kr")
        old = dict(H="i32", W="i32", D="i32", stride_xn="i32", stride_xd="i32")
    names = jf.arg_names
    # Unit inner strides are specialised to 1 by Triton at launch (contiguous rows); 16-divisible
    # pointers and strides get the divisibility attribute, as a launch on real buffers does.
    consts = {n: 1 for n in ("stride_yd", "stride_dyd", "stride_kd", "stride_xd") if n in names}
    if before:
        types.update(old)
        aligned = aligned + ("D", "stride_xn")
        if kernel == "bwd":
            consts.update(WRITE_DX=job["write_dx"], ZERO_DY=job["zero_dy"])
    else:
        consts.update(H=16, W=16, D=job.get("D", 3584))  # the InternVL grid and the 8B hidden size
        if kernel == "bwd":
            consts.update(WRITE_DX=job["write_dx"], ZERO_DY=job["zero_dy"])
    consts.update(job["meta"])
    types = {n: v for n, v in types.items() if n in names and n not in consts}
    sig = {n: types.get(n, "constexpr") for n in names}
    consts = {n: v for n, v in consts.items() if n in names}
    for n in names:
        if sig[n] == "constexpr" and n not in consts:
            raise RuntimeError(f"{n}: no value for a constexpr of {kernel}")
    cst = {(names.index(n),): v for n, v in consts.items()}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned if n in names}
    opts = dict(num_warps=job["num_warps"])
    if not before:
        from vr_kernels.pool_pack import MAX_REGISTERS
        opts["maxnreg"] = MAX_REGISTERS
    t0 = time.perf_counter()
    k = triton.compile(ASTSource(fn=jf, signature=sig, constexprs=cst, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=opts)
    compile_s = time.perf_counter() - t0
    sass, res = _cuobjdump(k.asm["cubin"])
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", res)
    regs, stack, shared_static, local = (int(v) for v in m.groups())
    shared = max(int(k.metadata.shared), shared_static)
    ins = parse_sass(sass)
    mix = instruction_mix(ins)
    lps = loops(ins, es)
    ptx = k.asm["ptx"]
    return dict(
        kernel=kernel, dtype=dt, version="before" if before else "after",
        config=dict(job["meta"], num_warps=job["num_warps"]),
        **({"write_dx": job["write_dx"], "zero_dy": job["zero_dy"]} if kernel == "bwd" else {}),
        registers=regs, stack_bytes=stack, local_bytes=local, shared_bytes=shared,
        spill_instructions=mix.get("spill", 0),
        occupancy=occupancy(regs, shared, job["num_warps"]),
        compile_s=round(compile_s, 3), sass_instructions=mix.get("total", 0), mix=mix,
        barriers=mix.get("barrier", 0),
        ptx_div_full_f32=ptx.count("div.full.f32"), ptx_div_rn_f32=ptx.count("div.rn.f32"),
        ptx_cvt_rn_bf16=ptx.count("cvt.rn.bf16"),
        ptx_int_div=len(re.findall(r"\b(?:div|rem)\.s32", ptx)),
        loops=lps, hot_loops=hot_loops(lps, kernel, bool(job.get("zero_dy"))),
    )


def shipped_jobs(dtypes=("bf16", "fp16", "fp32"), bwd_variants=BWD_VARIANTS) -> List[Dict]:
    """Every shipped configuration: kernel x dtype x autotuning config (x backward variant)."""
    from vr_kernels.pool_pack import CONFIGS
    jobs = []
    for dt in dtypes:
        for br, bd, nw in CONFIGS[DTYPES[dt]]:
            meta = dict(BLOCK_R=br, BLOCK_D=bd)
            jobs.append(dict(kernel="fwd", dtype=dt, meta=meta, num_warps=nw))
            for wd, zd in bwd_variants:
                jobs.append(dict(kernel="bwd", dtype=dt, meta=meta, num_warps=nw, write_dx=wd, zero_dy=zd))
    return jobs


def before_jobs(source: str, dtypes=("bf16",)) -> List[Dict]:
    """The old kernels' configurations (BLOCK_T, BLOCK_D, warps) as the old _configs made them."""
    jobs = []
    cfgs = [(bt, bd, nw) for bt in (8, 16) for bd in (128, 256, 512) for nw in (2, 4, 8)
            if 8 <= bt * bd // (32 * nw) <= 64]
    for dt in dtypes:
        for bt, bd, nw in cfgs:
            meta = dict(BLOCK_T=bt, BLOCK_D=bd)
            jobs.append(dict(kernel="fwd", dtype=dt, meta=meta, num_warps=nw, source=source))
            jobs.append(dict(kernel="bwd", dtype=dt, meta=meta, num_warps=nw, write_dx=True, zero_dy=False,
                             source=source))
    return jobs


def run_jobs(jobs: List[Dict], workers: int = 2) -> List[Dict]:
    """Compile ``jobs`` in fresh (spawned) processes without TRITON_INTERPRET: Triton decides
    interpreter vs compiler at import, and the caller (a CPU test run) may have imported it
    with the interpreter on."""
    import multiprocessing as mp
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (here, ROOT):
        if p not in sys.path:
            sys.path.insert(0, p)
    saved = os.environ.pop("TRITON_INTERPRET", None)
    try:
        with ProcessPoolExecutor(max_workers=max(1, workers), mp_context=mp.get_context("spawn")) as ex:
            return list(ex.map(_compile_by_name, jobs))
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved


def _compile_by_name(job: Dict) -> Dict:
    # Resolved in the worker by module name, so a copy of this file loaded by path (tests)
    # and the worker's import agree.
    import bench_kernels_static
    return bench_kernels_static.compile_one(job)


def violations(r: Dict) -> List[str]:
    """What a shipped configuration breaks of :data:`BOUNDS` (empty = fine)."""
    bad = []
    name = f"{r['kernel']} {r['dtype']} {r['config']}" + (
        f" WRITE_DX={r['write_dx']} ZERO_DY={r['zero_dy']}" if r["kernel"] == "bwd" else "")
    if r["spill_instructions"] or r["local_bytes"] or r["stack_bytes"]:
        bad.append(f"{name}: spills ({r['spill_instructions']} STL/LDL, {r['local_bytes']} B local)")
    if r["occupancy"] < BOUNDS["min_occupancy"]:
        bad.append(f"{name}: occupancy {r['occupancy']:.0%} ({r['registers']} registers)")
    if r["barriers"] > BOUNDS["barriers"]:
        bad.append(f"{name}: {r['barriers']} barriers")
    if r["kernel"] == "bwd" and not r["write_dx"]:
        return bad  # zeroes rows of dy_kept only: no window path
    paths = {lp["path"] for lp in r["hot_loops"]}
    for w in ("1x1", "2x2", "4x4", "8x8"):
        if w not in paths:
            bad.append(f"{name}: no loop found for the {w} specialisation")
    bound = BOUNDS["fwd_instr_per_loaded_element" if r["kernel"] == "fwd" else "bwd_instr_per_stored_element"]
    for lp in r["hot_loops"]:
        where = f"{name}: {lp['path']} loop at {lp['start']}"
        ipe = lp["instr_per_element"]
        if lp["path"] == "generic":
            if ipe is not None and ipe > BOUNDS["generic_instr_per_element"]:
                bad.append(f"{where} runs {ipe:.2f} instructions per element "
                           f"(bound {BOUNDS['generic_instr_per_element']})")
            continue
        if lp["ldg_other"] or lp["stg_other"] or not lp["ldg128"] or not lp["stg128"]:
            bad.append(f"{where}: global accesses narrower than 128 bits "
                       f"({lp['ldg_other']} loads, {lp['stg_other']} stores)")
        if ipe is None or ipe > bound:
            bad.append(f"{where} runs {ipe} instructions per element (bound {bound})")
    return bad


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
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "kernels_sm90_static.json"))
    p.add_argument("--before", default=BEFORE_COMMIT, help="commit of the 'before' kernels ('' to skip)")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from common import environment, environment_line, finish, markdown_table

    t0 = time.perf_counter()
    # A fresh Triton cache, so that compile_s is a cold compile (what a first request would pay).
    cache = tempfile.mkdtemp(prefix="triton_cache_")
    os.environ["TRITON_CACHE_DIR"] = cache
    results = run_jobs(shipped_jobs(), args.workers)
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
