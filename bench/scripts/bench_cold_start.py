"""Cold start: what the first question in a fresh process pays, against the next.

    python -m bench.scripts.bench_cold_start                         # CPU: the tiny model, 8 frames
    python -m bench.scripts.bench_cold_start --shape 8b --device cuda --processes 3   # InternVL3-8B shape

Each process is fresh (its own interpreter, CUDA context, kernel caches). In it:

* ``import_s``   importing torch and vr_runtime;
* ``load_s``     building the VideoRouter (weights on the device, routers, and the load-time
                 warm-up ``vr_kernels.warmup`` that ``VideoRouter.__init__`` runs);
* ``warmup_s``   that warm-up alone (``vr.kernel_warmup["seconds"]``; 0 where skipped: CPU);
* ``cold_ttft_s`` the first ``answer`` (TTFT = the runtime's vision + router + compress + prefill
                 stage timers, synchronised) and its router stage, ``cold_router_s``;
* ``warm_ttft_s`` a second ``answer`` on a different video of the same shape, same options.

Modes (each in its own fresh processes): ``plain`` loads with ``warm_request=False`` (the kernel
warm-up only); ``hook`` then runs the runtime's load-time request warm-up,
``VideoRouter.warm_up_request`` (``hook_s``; what ``warm_request=True``, the default on CUDA,
does at load) before the timed questions. The gap plain - hook in cold TTFT is what the request
warm-up buys.

Model: ``--shape tiny`` is the shipped tiny model with its trained routers, policy "auto" (what
``videorouter ask`` runs); ``--shape 1b/2b/8b`` random weights in the exact InternVL3 shape
(vr_runtime/configs, as bench_e2e.py builds them), untrained routers run in full with the
decisions imposed (``FixedRelevance(run_routers=True)``, 28 of 64 relevant, as bench_e2e.py),
budget 12,288 at 64 frames. Inputs: random [T, 3, 448, 448] frames (decoding is not timed).
"""
from __future__ import annotations

import time

_T_START = time.perf_counter()  # before the heavy imports: import time is part of a cold start

import argparse  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
from typing import Dict, List  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULE = "bench.scripts.bench_cold_start"

CONFIGS = ROOT / "vr_runtime" / "configs"
SHAPES = ("tiny", "1b", "2b", "8b")
MODES = ("plain", "hook")
QUESTION = "What happens in the video?"
FIGURES = ("import_s", "load_s", "warmup_s", "hook_s", "cold_ttft_s", "cold_router_s", "cold_wall_s",
           "warm_ttft_s", "warm_router_s", "warm_wall_s")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="tiny", help=f"one of {', '.join(SHAPES)} (default tiny)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when there is one)")
    ap.add_argument("--dtype", default=None, help="default: the runtime's for the device")
    ap.add_argument("--frames", type=int, default=None, help="frames a question (default 8 tiny, 64 otherwise)")
    ap.add_argument("--budget", type=int, default=12288, help="visual-token budget of the shape rows")
    ap.add_argument("--max-new-tokens", type=int, default=4)
    ap.add_argument("--processes", type=int, default=1, help="fresh processes per mode (default 1)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    ap.add_argument("--warmup-frames", type=int, default=256,
                    help="VideoRouter(warmup_frames=): frames the load-time kernel warm-up covers")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads in each process (default: torch's; 1 steadies CPU figures "
                         "on a shared machine)")
    ap.add_argument("--out", default=None, help="results .json (a .md is written beside it)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # internal: one process's JSON
    a = ap.parse_args(argv)
    if a.shape not in SHAPES:
        ap.error(f"--shape: expected one of {', '.join(SHAPES)}, got {a.shape!r}")
    if a.device not in (None, "cpu", "cuda"):
        ap.error(f"--device: expected cpu or cuda, got {a.device!r}")
    a.modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if not a.modes or any(m not in MODES for m in a.modes):
        ap.error(f"--modes: expected a comma list of {', '.join(MODES)}, got {','.join(a.modes)!r}")
    for name in ("processes", "max_new_tokens"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: expected >= 1, got {getattr(a, name)}")
    if a.threads is not None and a.threads < 1:
        ap.error(f"--threads: expected >= 1, got {a.threads}")
    if a.frames is not None and a.frames < 1:
        ap.error(f"--frames: expected >= 1, got {a.frames}")
    if a.warmup_frames < 0:
        ap.error(f"--warmup-frames: expected >= 0, got {a.warmup_frames}")
    a.frames = a.frames or (8 if a.shape == "tiny" else 64)
    return a


# ----------------------------------------------------------------------------- one process
def _build(a, device, dtype):
    from vr_runtime import VideoRouter
    if a.shape == "tiny":
        return VideoRouter.from_pretrained("tiny", device=device, dtype=dtype,
                                           warmup_frames=a.warmup_frames, warm_request=False)
    cfg = json.loads((CONFIGS / f"internvl3_{a.shape}.json").read_text())
    return VideoRouter.from_config(cfg, device=device, dtype=dtype, warmup_frames=a.warmup_frames,
                                   warm_request=False)


def _options(a, vr):
    from vr_runtime.request import AnswerOptions
    if a.shape == "tiny":  # trained routers decide: what `videorouter ask` runs
        return AnswerOptions(num_frames=a.frames, max_new_tokens=a.max_new_tokens)
    from vr_runtime.routing.scorers import FixedRelevance
    T = a.frames
    k = max(1, round(T * 28 / 64))
    relevant = [i * T // k for i in range(k)]
    pattern = [i in relevant for i in range(T)]
    return AnswerOptions(num_frames=T, max_new_tokens=a.max_new_tokens, policy="fragment",
                         budget=a.budget, max_length=a.budget + 64 * T + a.max_new_tokens + 512,
                         scorer=FixedRelevance(pattern, run_routers=True))


def _ask(vr, video, opts, device) -> Dict[str, float]:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    res = vr.answer(video, QUESTION, options=opts)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall = time.perf_counter() - t0
    t = res.report["timings_s"]
    return {"ttft_s": float(t["ttft"]), "router_s": float(t.get("router", 0.0)), "wall_s": wall,
            "timings_s": dict(t), "policy": res.report.get("policy"),
            "visual_tokens": int(sum(res.report.get("frame_tokens") or []))}


def child(a) -> None:
    """Runs in the fresh process: measure, write ``a.child`` (JSON)."""
    import torch
    import vr_runtime  # noqa: F401  (its import time is part of a cold start)
    imported = time.perf_counter()
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if a.dtype and not isinstance(getattr(torch, a.dtype, None), torch.dtype):
        raise SystemExit(f"bench_cold_start: --dtype {a.dtype!r} is not a torch dtype (e.g. bfloat16)")
    dtype = getattr(torch, a.dtype) if a.dtype else None
    if a.threads:
        torch.set_num_threads(a.threads)
    mode = a.modes[0]
    t0 = time.perf_counter()
    vr = _build(a, device, dtype)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    load_s = time.perf_counter() - t0
    warm = dict(vr.kernel_warmup)
    opts = _options(a, vr)

    def video(seed):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(a.frames, 3, 448, 448, generator=g)

    hook_s = None
    if mode == "hook":
        t0 = time.perf_counter()
        vr.warm_up_request(num_frames=a.frames)   # what warm_request=True (CUDA's default) runs
        hook_s = time.perf_counter() - t0
    cold = _ask(vr, video(1), opts, device)
    again = _ask(vr, video(2), opts, device)
    out = dict(mode=mode, import_s=imported - _T_START, load_s=load_s,
               warmup_s=float(warm.get("seconds", 0.0)), hook_s=hook_s,
               cold_ttft_s=cold["ttft_s"], cold_router_s=cold["router_s"], cold_wall_s=cold["wall_s"],
               warm_ttft_s=again["ttft_s"], warm_router_s=again["router_s"], warm_wall_s=again["wall_s"],
               kernel_warmup={k: v for k, v in warm.items() if k != "best"},
               cold=cold, warm=again, device=str(device), threads=torch.get_num_threads(), dtype=str(vr.lm.dtype).replace("torch.", ""))
    from vr_runtime.data.atomic import write_atomic
    write_atomic(a.child, json.dumps(out, indent=2, default=str) + "\n")


# ----------------------------------------------------------------------------- parent
def _child_argv(a, mode: str) -> List[str]:
    """One process's arguments: ``mode`` alone, the rest as the parent's."""
    argv = ["--shape", a.shape, "--frames", str(a.frames), "--budget", str(a.budget),
            "--max-new-tokens", str(a.max_new_tokens), "--modes", mode,
            "--warmup-frames", str(a.warmup_frames)]
    if a.device:
        argv += ["--device", a.device]
    if a.dtype:
        argv += ["--dtype", a.dtype]
    if a.threads:
        argv += ["--threads", str(a.threads)]
    return argv


def summarise(per_process: List[dict]) -> List[dict]:
    """One row per mode: the median of each figure over its processes, and the spread
    (max/min - 1) of cold TTFT across them."""
    from bench.harness.timing import spread
    rows = []
    for mode in MODES:
        rs = [r for r in per_process if r["mode"] == mode]
        if not rs:
            continue
        row: Dict[str, object] = dict(mode=mode, processes=len(rs))
        for k in FIGURES:
            vals = [r[k] for r in rs if r.get(k) is not None]
            row[k] = statistics.median(vals) if vals else None
        row["cold_over_warm"] = (row["cold_ttft_s"] / row["warm_ttft_s"]) if row["warm_ttft_s"] else None
        row["cold_ttft_spread"] = spread([r["cold_ttft_s"] for r in rs])
        rows.append(row)
    return rows


def main(argv=None) -> dict:
    a = parse_args(argv)
    if a.child:
        child(a)
        return {}
    import torch
    from bench.harness.env import environment, environment_line
    from bench.harness.processes import run_processes
    from bench.harness.results import finish
    from bench.harness.tables import markdown_table
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_cold_start: --device cuda asked for but torch sees no CUDA device; "
                         "use --device cpu")
    cpu = device.type == "cpu"
    out = a.out or str(ROOT / "bench" / "results" / f"cold_start_{a.shape}_{'cpu' if cpu else 'gpu'}.json")
    per_process = run_processes(MODULE, [(f"the {mode} process {i + 1}", _child_argv(a, mode))
                                         for mode in a.modes for i in range(a.processes)],
                                out_flag="--child")
    rows = summarise(per_process)
    env = environment(device)
    label = "CPU" if cpu else env["device"]
    model = "tiny model (trained routers, policy auto)" if a.shape == "tiny" else \
        f"InternVL3-{a.shape.upper()} shape, random weights, routers run with decisions imposed, budget {a.budget}"
    notes = [f"{label} figures. {model}; {a.frames} random 448x448 frames; {a.max_new_tokens} new tokens; "
             f"{a.processes} fresh process(es) per mode, medians"
             + (f"; {a.threads} torch thread(s) each." if a.threads else "."),
             "load_s includes the load-time kernel warm-up (warmup_s; skipped on CPU, where the PyTorch "
             "path has nothing to compile). TTFT = vision + router + compress + prefill (the runtime's "
             "stage timers). warm = a second question on another video of the same shape.",
             "hook: the runtime's load-time request warm-up (VideoRouter.warm_up_request, hook_s; on by "
             "default on CUDA) before the timed ones; plain loads with warm_request=False."]
    if cpu:
        notes.append("CPU figures on a shared machine (see the load average); no GPU figure here.")
    cols = ["mode", "processes", "import_s", "load_s", "warmup_s", "hook_s", "cold_ttft_s", "warm_ttft_s",
            "cold_over_warm", "cold_router_s", "warm_router_s", "cold_ttft_spread"]
    md = "\n".join([f"# Cold start ({label}, {a.shape})", "", environment_line(env, ("torch", "triton")),
                    ""] + [f"> {n}" for n in notes] + ["", markdown_table(rows, cols)])
    payload = dict(environment=env, label=label, shape=a.shape, frames=a.frames, budget=a.budget,
                   max_new_tokens=a.max_new_tokens, warmup_frames=a.warmup_frames, notes=notes,
                   results=rows, per_process=per_process)
    finish(out, payload, md)
    return payload


if __name__ == "__main__":
    main()
