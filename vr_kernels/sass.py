"""Static figures of the pool_pack kernels on sm_90 (H100), obtained without a GPU.

CPU CI runs the kernels under the interpreter, which accepts code the compiler rejects (and the
reverse) and says nothing of what a GPU would execute. Here a kernel configuration is compiled
for sm_90 by Triton's NVIDIA backend (ptxas and cuobjdump ship with the triton wheel) and its
SASS is read back. Recorded per kernel x dtype x configuration:

* registers per thread, stack/local bytes, spill instructions (STL/LDL), shared memory;
* theoretical occupancy on an H100 SM (65,536 registers, 64 warps, 32 blocks, 228 KB shared);
* the instruction mix (global loads/stores by width, FP adds, conversions, integer ops,
  barriers, branches);
* every loop of the SASS (a backward branch) with its instructions per loaded element and per
  stored element: the instruction count of the loop body divided by the elements one thread
  moves in one iteration (a 128-bit load of bf16 moves 8).

These are STATIC figures (what the compiler emitted), not measurements: they say nothing of
achieved bandwidth, which needs a GPU. ``violations`` holds a result to :data:`BOUNDS`
(tests/kernels/test_kernels_static.py asserts them on every shipped configuration);
``python -m bench.scripts.bench_kernels_static`` records every figure in
bench/results/kernels_sm90_static.json.

A job (``shipped_jobs``) names one compile: ``kernel`` ("fwd" / "bwd"), ``dtype``, ``meta``
(the block sizes), ``num_warps`` and, backward, ``write_dx`` / ``zero_dy``. Another version of
the kernels is compiled from its source text (``source``), with the argument types
(``types``), the 16-divisible arguments (``aligned``) and whether it is a shipped build
(``shipped``: the grid, hidden size and register cap of today's launches) given in the job.
"""
from __future__ import annotations

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

# The kernels' runtime arguments as a launch passes them: pointers to the element type or to
# int32 tables, int32 strides; the pointers and the row strides are 16-divisible (contiguous
# rows of a hidden size that is a multiple of 16), as on real buffers.
TYPES = {
    "fwd": lambda dt: dict(x=f"*{dt}", y=f"*{dt}", tiles="*i32", dest="*i32", SIZE_CLASS="i32",
                           stride_xt="i32", stride_yr="i32", stride_yd="i32"),
    "bwd": lambda dt: dict(dy=f"*{dt}", dx=f"*{dt}", dy_kept=f"*{dt}", tiles="*i32", dest="*i32",
                           SIZE_CLASS="i32", stride_dyr="i32", stride_dyd="i32", stride_xt="i32",
                           stride_kr="i32", stride_kd="i32"),
}
ALIGNED = {"fwd": ("x", "y", "tiles", "dest", "stride_xt", "stride_yr"),
           "bwd": ("dy", "dx", "dy_kept", "tiles", "dest", "stride_dyr", "stride_xt", "stride_kr")}
# Unit inner strides are specialised to 1 by Triton at launch (contiguous rows).
UNIT_STRIDES = ("stride_yd", "stride_dyd", "stride_kd", "stride_xd")
# Today's launches: the InternVL grid and the hidden size (a job's ``D``, default the 8B's) are
# compile-time constants.
SHIPPED_CONSTS = dict(H=16, W=16, D=3584)

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


def kernel_module(source: Optional[str] = None):
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


def _signature(job: Dict, names: List[str]):
    """(signature, constexprs, attributes) of ``job``'s kernel for ``triton.compile``."""
    kernel = job["kernel"]
    types = dict(TYPES[kernel](job["dtype"]), **job.get("types", {}))
    aligned = ALIGNED[kernel] + tuple(job.get("aligned", ()))
    consts = {n: 1 for n in UNIT_STRIDES if n in names}
    if job.get("shipped", True):
        consts.update(SHIPPED_CONSTS, D=job.get("D", SHIPPED_CONSTS["D"]))
    if kernel == "bwd":
        consts.update(WRITE_DX=job["write_dx"], ZERO_DY=job["zero_dy"])
    consts.update(job["meta"])
    consts = {n: v for n, v in consts.items() if n in names}
    sig = {n: "constexpr" if n in consts else types.get(n, "constexpr") for n in names}
    missing = [n for n in names if sig[n] == "constexpr" and n not in consts]
    if missing:
        raise RuntimeError(f"{missing[0]}: no value for a constexpr of {kernel}")
    cst = {(names.index(n),): v for n, v in consts.items()}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned if n in names}
    return sig, cst, attrs


def _compile(job: Dict):
    """(the compiled kernel, its compile seconds) of ``job`` for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    mod = kernel_module(job.get("source"))
    jf = (mod._pool_pack_fwd_kernel if job["kernel"] == "fwd" else mod._pool_pack_bwd_kernel).fn
    sig, cst, attrs = _signature(job, jf.arg_names)
    opts = dict(num_warps=job["num_warps"])
    if job.get("shipped", True):
        from vr_kernels.pool_pack import MAX_REGISTERS
        opts["maxnreg"] = MAX_REGISTERS
    t0 = time.perf_counter()
    k = triton.compile(ASTSource(fn=jf, signature=sig, constexprs=cst, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=opts)
    return k, time.perf_counter() - t0


def compile_one(job: Dict) -> Dict:
    """Compile one kernel variant for sm_90 and analyse it (runs in a worker process)."""
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    k, compile_s = _compile(job)
    sass, res = _cuobjdump(k.asm["cubin"])
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", res)
    regs, stack, shared_static, local = (int(v) for v in m.groups())
    shared = max(int(k.metadata.shared), shared_static)
    ins = parse_sass(sass)
    mix = instruction_mix(ins)
    lps = loops(ins, DTYPES[job["dtype"]])
    ptx = k.asm["ptx"]
    bwd = job["kernel"] == "bwd"
    return dict(
        kernel=job["kernel"], dtype=job["dtype"], **({"version": job["version"]} if "version" in job else {}),
        config=dict(job["meta"], num_warps=job["num_warps"]),
        **({"write_dx": job["write_dx"], "zero_dy": job["zero_dy"]} if bwd else {}),
        registers=regs, stack_bytes=stack, local_bytes=local, shared_bytes=shared,
        spill_instructions=mix.get("spill", 0),
        occupancy=occupancy(regs, shared, job["num_warps"]),
        compile_s=round(compile_s, 3), sass_instructions=mix.get("total", 0), mix=mix,
        barriers=mix.get("barrier", 0),
        ptx_div_full_f32=ptx.count("div.full.f32"), ptx_div_rn_f32=ptx.count("div.rn.f32"),
        ptx_cvt_rn_bf16=ptx.count("cvt.rn.bf16"),
        ptx_int_div=len(re.findall(r"\b(?:div|rem)\.s32", ptx)),
        loops=lps, hot_loops=hot_loops(lps, job["kernel"], bool(job.get("zero_dy"))),
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


def run_jobs(jobs: List[Dict], workers: int = 2) -> List[Dict]:
    """Compile ``jobs`` in fresh (spawned) processes without TRITON_INTERPRET: Triton decides
    interpreter vs compiler at import, and the caller (a CPU test run) may have imported it
    with the interpreter on."""
    import multiprocessing as mp
    saved = os.environ.pop("TRITON_INTERPRET", None)
    try:
        with ProcessPoolExecutor(max_workers=max(1, workers), mp_context=mp.get_context("spawn")) as ex:
            return list(ex.map(compile_one, jobs))
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved


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
