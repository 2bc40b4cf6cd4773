"""The fast path's options against today's path, in one process on one model (the GPU issue's
A/B): the vision tower and the Image Router per frame under each compile mode and chunk, then
time to first token at 64 and 1,024 frames with the chosen settings against today's, Dense
included, with torch profiler tables of the top kernels.

Sections, in order of value (each one's results are written as soon as it ends, so a run cut
short keeps what it measured):

  vision    ms a frame of the tower + projector over ``--frames`` frames: today's path (the
            request's chunks of 16, eager), the eager fixed chunks ``--chunks`` (the sweep that
            picks the size), and ``VisionEncoder(chunk, mode)`` for the compiled
            ``--vision-modes`` at ``--compile-chunks``; the attention kernels the tower's sdpa runs
            (flash, cuDNN, memory-efficient or math), read from a profile of one chunk
  router    ms a frame of the Image Router (shadow stack + head over [Z_t; q]) at router_pool
            1 and 2: today's eager chunks and ``RouterRunner(mode)`` for every
            ``--router-modes``
  ttft      TTFT of VideoRouter (s=2,4; 28 of 64 frames relevant, the routers run and their
            decisions are imposed) and of Dense, at each of ``--ttft-frames``, today's settings
            against ``--tuned`` (vision and router modes, router_pool), both tuned the same way,
            and the tuned settings at router_pool 2 (VideoRouter only);
            peak memory (the allocator's peak over the answer, weights included; Dense's less
            the routers' weights, which a plain InternVL3 process does not hold)
  profile   torch profiler tables (top 25 kernels by CUDA time) of one tuned VideoRouter answer
            at 64 frames and of 8 eager decode steps, written beside the results
  floors    (not in the default run; no GPU, nothing built) the TTFT floors of VideoRouter at
            router_pool 1 and 2 and of Dense from the cost model's FLOPs and bytes: model figures

Floors (InternVL3-8B shape, bf16, H200 at 790 TFLOP/s and 4.8 TB/s): the tower 0.72 TFLOP a
frame -> 0.91 ms; the router 1.86 GFLOP a token over 256 + q tokens -> 0.68 ms (pool 2: 64 + q,
0.22 ms); the results give the measured ms beside them.

Usage (GPU, the InternVL3-8B shape, random weights)::

    python -m bench.scripts.bench_fast_path --out $OUT/fast_path_gpu_8b.json

The floors alone (model figures, CPU, seconds)::

    python -m bench.scripts.bench_fast_path --cpu --shape 8b --sections floors \\
        --out bench/results/fast_path_floors_model.json

CPU dry run (tiny preset; figures say nothing about a GPU)::

    python -m bench.scripts.bench_fast_path --cpu --frames 4 --ttft-frames 4 --runs 1
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from typing import Dict, List

import torch

from bench.harness.env import environment
from bench.harness.tables import markdown_table
from bench.harness.timing import measure
from bench.models.e2e_model import relevance_pattern   # bench_e2e's: the same frames

ROOT = pathlib.Path(__file__).resolve().parents[2]

CONFIGS = ROOT / "vr_runtime" / "configs"
QUESTION = "What does the person put into the red box after the phone rings?"
BUDGET = 12288
RELEVANT_FRAC = 7 / 16   # 28 of 64 frames relevant, spread evenly: bench_e2e's default
FLOORS_MS = {"vision": 0.91, "router_pool1": 0.68, "router_pool2": 0.22}   # H200, bf16
ATTENTION = ("flash", "cudnn", "efficient", "fmha", "attention", "sdpa", "softmax")


def _list(kind, name):
    def conv(text):
        try:
            return [kind(x) for x in text.split(",") if x]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: expected a comma list, got {text!r}")
    return conv


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default=None, help="tiny, 2b or 8b (default: 8b on CUDA, tiny "
                    "on CPU)")
    ap.add_argument("--sections", type=_list(str, "--sections"),
                    default=["vision", "router", "ttft", "profile"])
    ap.add_argument("--frames", type=int, default=64, help="frames of the per-stage sections")
    ap.add_argument("--vision-modes", type=_list(str, "--vision-modes"), default=None,
                    help="compile modes of the vision section (default: off,inductor,cudagraphs "
                         "on CUDA; off,inductor on CPU)")
    ap.add_argument("--router-modes", type=_list(str, "--router-modes"), default=None,
                    help="compile modes of the router section (default: as --vision-modes)")
    ap.add_argument("--chunks", type=_list(int, "--chunks"), default=[8, 16, 32, 64],
                    help="fixed chunks (units a tower call) the vision section sweeps eagerly")
    ap.add_argument("--compile-chunks", type=_list(int, "--compile-chunks"), default=[32],
                    help="chunks the vision section compiles (each chunk size is a compile of "
                         "its own, about a minute at the 8B shape)")
    ap.add_argument("--ttft-frames", type=_list(int, "--ttft-frames"), default=[64, 1024])
    ap.add_argument("--dense-max-frames", type=int, default=64,
                    help="Dense runs only at frame counts up to this (1,024 frames dense are "
                         "263k tokens, past the model's context)")
    ap.add_argument("--tuned", default=None, metavar="VISION,CHUNK,ROUTER,POOL",
                    help="the tuned settings of the ttft section, e.g. cudagraphs,32,cudagraphs,1 "
                         "(default: the fastest mode and chunk of the vision and router sections "
                         "at router_pool 1)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--out", default=None, help="results JSON (a .md beside it, and the "
                    "profile tables as <stem>_profile_*.txt)")
    a = ap.parse_args(argv)
    a.cpu = a.cpu or not torch.cuda.is_available()
    a.shape = a.shape or ("tiny" if a.cpu else "8b")
    if a.shape not in ("tiny", "2b", "8b"):
        ap.error(f"--shape: expected tiny, 2b or 8b, got {a.shape!r}")
    bad = set(a.sections) - {"vision", "router", "ttft", "profile", "floors"}
    if bad:
        ap.error(f"--sections: unknown {sorted(bad)}; expected vision, router, ttft, profile, "
                 f"floors")
    if "floors" in a.sections and a.shape == "tiny":
        ap.error("--sections floors: model figures of a real shape; give --shape 2b or 8b")
    from vr_runtime.backbones.compiled import COMPILE_MODES
    default = ["off", "inductor"] + ([] if a.cpu else ["cudagraphs"])
    a.vision_modes = a.vision_modes or default
    a.router_modes = a.router_modes or default
    for m in a.vision_modes + a.router_modes:
        if m not in COMPILE_MODES:
            ap.error(f"modes: {m!r} is not one of {', '.join(COMPILE_MODES)}")
        if m == "cudagraphs" and a.cpu:
            ap.error("modes: cudagraphs needs CUDA")
    if a.tuned is not None:
        parts = a.tuned.split(",")
        if len(parts) != 4 or parts[0] not in COMPILE_MODES or parts[2] not in COMPILE_MODES \
                or not parts[1].isdigit() or parts[3] not in ("1", "2"):
            ap.error(f"--tuned: expected VISION,CHUNK,ROUTER,POOL (modes, an int, 1 or 2), got "
                     f"{a.tuned!r}")
        a.tuned = dict(vision=parts[0], chunk=int(parts[1]), router=parts[2], pool=int(parts[3]))
    for name in ("frames", "runs"):
        if getattr(a, name) < 1:
            ap.error(f"--{name}: expected an int >= 1")
    if min(a.chunks + a.compile_chunks + a.ttft_frames) < 1 or a.warmup < 0:
        ap.error("--chunks, --compile-chunks and --ttft-frames >= 1, --warmup >= 0, please")
    return a


# ----------------------------------------------------------------------------- set-up

def build_lm(args, device, dtype):
    """The backbone, built once (an 8B random-weight model takes ~25 s on an H200): every
    section's VideoRouter shares it (:func:`build`)."""
    from vr_runtime.backbones import backbone_from_config, load_backbone
    if args.shape == "tiny":
        return load_backbone("tiny", device=device, dtype=dtype)
    cfg = json.loads((CONFIGS / f"internvl3_{args.shape}.json").read_text())
    return backbone_from_config(cfg, device=device, dtype=dtype, seed=0)


def build(lm, pool: int = 1, compile=None):
    """A VideoRouter over ``lm`` with new routers at ``pool`` (the shadow stack copied from the
    LLM's first 4 layers) and ``compile``; a compiled stage is compiled here, as at load."""
    from vr_runtime.routing.routers import RouterConfig, Routers
    from vr_runtime.runtime import VideoRouter
    routers = Routers.from_backbone(lm, RouterConfig(router_pool=pool))
    return VideoRouter(lm, routers, warm_request=False, compile=compile)


def timed(fn, device, args) -> Dict[str, float]:
    t = measure(fn, device=device, warmup=args.warmup, rep=args.runs)
    return {"median_s": t.median, "q20_s": t.q20, "q80_s": t.q80, "first_s": t.first_call}


def pixels(lm, n, device):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3 * lm.frames_per_unit, *lm.frame_spec.size, generator=g).to(device)


# ----------------------------------------------------------------------------- sections

def vision_section(args, vr, device) -> List[dict]:
    from vr_runtime.backbones.encode import VisionEncoder
    lm, T = vr.lm, args.frames
    pv = pixels(lm, T, device)
    rows = []
    with torch.inference_mode():
        t = timed(lambda: lm.encode_frames(pv, 16), device, args)
        rows.append(dict(variant="today (eager, chunks of 16)", mode="off", chunk=16,
                         ms_per_frame=1e3 * t["median_s"] / T, **t))
        for mode in args.vision_modes:
            for chunk in (args.chunks if mode == "off" else args.compile_chunks):
                row = dict(variant=f"{mode}, chunk {chunk}", mode=mode, chunk=chunk)
                try:
                    enc = VisionEncoder(lm, chunk, mode)
                    row["compile_s"] = enc.warm_up()["seconds"]
                    t = timed(lambda: enc(pv), device, args)
                    row.update(ms_per_frame=1e3 * t["median_s"] / T, **t)
                except Exception as e:   # noqa: BLE001 -- a compile failure: keep the others
                    row["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                rows.append(row)
                print(json.dumps({k: row.get(k) for k in ("variant", "ms_per_frame",
                                                           "compile_s", "error")}), flush=True)
    return rows


def attention_kernels(vr, device) -> List[str]:
    """The attention kernels one chunk of the eager tower launches (which sdpa backend runs)."""
    if device.type != "cuda":
        return []
    pv = pixels(vr.lm, 16, device)
    from torch.profiler import ProfilerActivity, profile
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        vr.lm.encode_frames(pv, 16)
        torch.cuda.synchronize()
    names = {e.key for e in prof.key_averages()}
    return sorted(n for n in names if any(a in n.lower() for a in ATTENTION))


def router_section(args, lm, device, dtype) -> List[dict]:
    from vr_runtime.routing.compiled import RouterRunner
    from vr_runtime.routing.routers import embed_question, pooled_grid
    rows = []
    for pool in (1, 2):
        vr = build(lm, pool)
        r, T = vr.routers, args.frames
        H, W = lm.grid
        g = torch.Generator().manual_seed(1)
        Z = torch.randn(T, H * W, lm.hidden_size * lm.streams, generator=g).to(device, dtype)
        q = embed_question(lm.model, lm.tokenizer, QUESTION)
        tg = pooled_grid(lm.grid, pool)
        with torch.inference_mode():
            r.runner = None
            t = timed(lambda: r.frame_logits(Z, q, grid=lm.grid), device, args)
            rows.append(dict(variant=f"today (eager), pool {pool}", mode="off", pool=pool,
                             ms_per_frame=1e3 * t["median_s"] / T, **t))
            for mode in args.router_modes:
                row = dict(variant=f"{mode}, pool {pool}", mode=mode, pool=pool)
                try:
                    r.runner = RouterRunner(r, tg[0] * tg[1], None, mode)
                    row["chunk"] = r.runner.chunk
                    row["compile_s"] = r.runner.warm_up(tg, Z.shape[-1], (q.shape[0],))["seconds"]
                    t = timed(lambda: r.frame_logits(Z, q, grid=lm.grid), device, args)
                    row.update(ms_per_frame=1e3 * t["median_s"] / T, **t)
                except Exception as e:   # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                r.runner = None
                rows.append(row)
                print(json.dumps({k: row.get(k) for k in ("variant", "ms_per_frame",
                                                           "compile_s", "error")}), flush=True)
        del vr, r, Z
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def pick_tuned(vision_rows, router_rows) -> dict:
    """The fastest measured vision mode and chunk, and router mode at pool 1 (the paper's)."""
    def best(rows, **where):
        ok = [r for r in rows if "ms_per_frame" in r and not r.get("error")
              and all(r.get(k) == v for k, v in where.items()) and not r["variant"].startswith("today")]
        return min(ok, key=lambda r: r["ms_per_frame"]) if ok else None
    v, r = best(vision_rows), best(router_rows, pool=1)
    return dict(vision=v["mode"] if v else "off", chunk=v["chunk"] if v else 16,
                router=r["mode"] if r else "off", pool=1)


def answer_once(vr, T, policy, device):
    """One answer (1 new token): its report. VideoRouter: 7/16 of the frames relevant (28 of
    64), the routers run, their decisions imposed (FixedRelevance)."""
    from vr_runtime.routing.scorers import FixedRelevance
    g = torch.Generator().manual_seed(T)
    frames = torch.randn(T, 3, *vr.lm.frame_spec.size, generator=g)
    text = vr.lm.text_tokens(QUESTION, T)
    kw = dict(num_frames=T, max_new_tokens=1, max_length=BUDGET + text + 1 + 100)
    if policy == "dense":
        kw.update(policy="dense", allow_over_length=True,
                  max_length=T * vr.lm.grid[0] * vr.lm.grid[1] + text + 101)
    else:
        rel = relevance_pattern(T, RELEVANT_FRAC, "spread")
        kw.update(policy="fragment", budget=BUDGET,
                  scorer=FixedRelevance(rel, run_routers=True))
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if device.type == "cuda" else 0
    rep = vr.answer(frames, QUESTION, **kw).report
    if device.type == "cuda":
        rep["_peak_activations_gb"] = (torch.cuda.max_memory_allocated() - before) / 1e9
        rep["_peak_total_gb"] = torch.cuda.max_memory_allocated() / 1e9
    return rep


def ttft_section(args, lm, device, tuned: dict) -> List[dict]:
    from vr_runtime.backbones.compiled import CompileOptions
    rows = []
    settings = {"today": (CompileOptions(vision="off", router="off"), 1),
                "tuned": (CompileOptions(vision=tuned["vision"], vision_chunk=tuned["chunk"],
                                         router=tuned["router"]), tuned["pool"])}
    if tuned["pool"] == 1:   # the floors put 0.58x and 2.0 s within reach at router_pool 2 only
        settings["tuned-pool2"] = (settings["tuned"][0], 2)
    for name, (opts, pool) in settings.items():
        t0 = time.perf_counter()
        vr = build(lm, pool, opts)
        load_s = time.perf_counter() - t0
        for T in args.ttft_frames:
            for policy in ("videorouter", "dense"):
                if policy == "dense" and (T > args.dense_max_frames or name == "tuned-pool2"):
                    # Dense runs no router: the tuned settings' Dense row is this one's too
                    continue
                row = dict(settings=name, policy=policy, frames=T, load_s=round(load_s, 3),
                           compile=vars(opts) if hasattr(opts, "__dict__") else str(opts),
                           router_pool=pool)
                try:
                    reps = [answer_once(vr, T, policy, device)
                            for _ in range(args.warmup + args.runs)][args.warmup:]
                    ts = sorted(r["timings_s"]["ttft"] for r in reps)
                    last = reps[-1]
                    if policy == "dense" and last.get("_peak_total_gb") is not None:
                        # a plain InternVL3 process holds no routers: their weights come off
                        last["_peak_total_gb"] -= sum(p.numel() * p.element_size() for p in
                                                      vr.routers.parameters()) / 1e9
                    row.update(ttft_s=ts[len(ts) // 2], ttft_runs_s=ts,
                               stages_s={k: last["timings_s"].get(k) for k in
                                         ("vision", "router", "compress", "prefill")},
                               prompt_tokens=last["prompt_tokens"],
                               visual_tokens=last["visual_tokens"],
                               peak_activations_gb=last.get("_peak_activations_gb"),
                               peak_total_gb=last.get("_peak_total_gb"))
                except Exception as e:   # noqa: BLE001 -- OOM, a compile failure
                    row["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                rows.append(row)
                print(json.dumps({k: row.get(k) for k in ("settings", "policy", "frames",
                                                           "ttft_s", "error")}), flush=True)
        del vr
        if device.type == "cuda":
            torch.cuda.empty_cache()
    floors(args, rows)
    for T in args.ttft_frames:   # the ratio, within one settings, in this run
        for name in settings:
            vr_row = next((r for r in rows if r["settings"] == name and r["frames"] == T
                           and r["policy"] == "videorouter" and "ttft_s" in r), None)
            dense_of = "tuned" if name == "tuned-pool2" else name
            dense = next((r for r in rows if r["settings"] == dense_of and r["frames"] == T
                          and r["policy"] == "dense" and "ttft_s" in r), None)
            if vr_row and dense:
                vr_row["ratio_to_dense"] = vr_row["ttft_s"] / dense["ttft_s"]
                vr_row["floor_ratio_tokens"] = vr_row["prompt_tokens"] / dense["prompt_tokens"]
    return rows


def floors(args, rows) -> None:
    """Each TTFT row's floor from its FLOPs and bytes (planning.cost_model.stage_costs: the
    tower, the router, pool_pack and the prefill at the row's token counts) at 790 TFLOP/s and
    4.8 TB/s, the H200's bf16 and memory rates; and, for VideoRouter, the floor's ratio to
    Dense's at the same frames: what no tuning of both can beat."""
    if args.shape == "tiny":
        return
    from vr_runtime.planning.cost_model import DeviceSpec, load_shape, stage_costs
    shape = load_shape(str(CONFIGS / f"internvl3_{args.shape}.json"))
    dev = DeviceSpec("H200 peak", 790e12, 4.8e12)
    for r in rows:
        if "visual_tokens" not in r:
            continue
        costs = stage_costs(shape, r["visual_tokens"], r["prompt_tokens"] - r["visual_tokens"],
                            r["frames"], dev, routers=r["policy"] != "dense",
                            router_pool=r["router_pool"])
        r["flops"] = {k: c["flops"] for k, c in costs.items()}
        r["floor_s"] = sum(max(c["flops"] / dev.flops, c["bytes"] / dev.bandwidth)
                           for c in costs.values())
    for r in rows:
        of = "tuned" if r.get("settings") == "tuned-pool2" else r.get("settings")
        dense = next((d for d in rows if d["policy"] == "dense" and d["frames"] == r["frames"]
                      and d.get("floor_s") and d.get("settings") == of), None)
        if r["policy"] == "videorouter" and r.get("floor_s") and dense:
            r["floor_ratio_to_dense"] = r["floor_s"] / dense["floor_s"]


def floor_rows(args) -> List[dict]:
    """The floors section: model figures, no model built. VideoRouter (pool 1 and 2) and Dense
    at each of ``--ttft-frames``, their token counts from the planner (7/16 of the frames
    relevant, budget 12,288) and the tiny tokenizer's prompt text, costed by :func:`floors`."""
    from vr_kernels import pooled_counts
    from vr_runtime.backbones.prompt import text_tokens
    from vr_runtime.backbones.tiny import load_tiny_tokenizer
    from vr_runtime.planning.budget import plan_fragment
    tok, grid = load_tiny_tokenizer(), (16, 16)
    rows = []
    for T in args.ttft_frames:
        plan = plan_fragment(relevance_pattern(T, RELEVANT_FRAC, "spread"), BUDGET, grid)
        kept = [t for t, w in enumerate(plan) if w]
        text = text_tokens(tok, QUESTION, T, kept=kept)
        vis = sum(pooled_counts(plan, grid))
        for pool in (1, 2):
            rows.append(dict(policy="videorouter", frames=T, router_pool=pool, visual_tokens=vis,
                             prompt_tokens=vis + text))
        if T <= args.dense_max_frames:
            dense_text = text_tokens(tok, QUESTION, T)
            rows.append(dict(policy="dense", frames=T, router_pool=1, visual_tokens=T * 256,
                             prompt_tokens=T * 256 + dense_text))
    floors(args, rows)
    for r in rows:   # floors() pairs each VideoRouter row with Dense at its frames
        r["floor_s"] = round(r["floor_s"], 4)
    return rows


def profile_section(args, lm, device, dtype, tuned: dict, stem: pathlib.Path) -> Dict[str, str]:
    """Top-25 kernel tables of one tuned answer at 64 frames and of 8 eager decode steps."""
    from torch.profiler import ProfilerActivity, profile
    from vr_runtime.backbones.compiled import CompileOptions
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    vr = build(lm, tuned["pool"],
               CompileOptions(vision=tuned["vision"], vision_chunk=tuned["chunk"],
                              router=tuned["router"]))
    T = min(64, args.ttft_frames[0])
    answer_once(vr, T, "videorouter", device)   # warm
    out = {}
    with profile(activities=acts) as prof:
        answer_once(vr, T, "videorouter", device)
    out["answer"] = prof.key_averages().table(sort_by=sort, row_limit=25)
    from vr_runtime.generate import GreedyDecoder
    x = torch.randn(1, 512, vr.lm.hidden_size).to(device, dtype)
    dec = GreedyDecoder(vr.lm, "dynamic")
    with torch.inference_mode():
        dec.generate([x], [4], [None], set())
        with profile(activities=acts) as prof:
            dec.generate([x], [9], [None], set())
    out["decode"] = prof.key_averages().table(sort_by=sort, row_limit=25)
    paths = {}
    for k, text in out.items():
        p = stem.with_name(f"{stem.name}_profile_{k}.txt")
        p.write_text(text)
        paths[k] = p.name
    return paths


# ----------------------------------------------------------------------------- main

def main(argv=None) -> int:
    args = parse(argv)
    device = torch.device("cpu" if args.cpu else "cuda")
    dtype = torch.float32 if args.cpu else torch.bfloat16
    out = pathlib.Path(args.out or ROOT / "bench" / "results" /
                       f"fast_path_{'cpu' if args.cpu else 'gpu'}_{args.shape}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    env = environment(device)
    label = "CPU dry run (not a performance figure)" if args.cpu else "GPU figures"
    doc = dict(benchmark="fast path A/B (bench_fast_path.py)", label=label, environment=env,
               settings=dict(shape=args.shape, dtype=str(dtype).replace("torch.", ""),
                             frames=args.frames, budget=BUDGET, runs=args.runs,
                             warmup=args.warmup),
               floors_ms_h200=FLOORS_MS)

    doc["section_s"] = {}
    clock = [time.perf_counter()]

    def save(section=None):
        if section:   # each section's wall time: what sizes the GPU run's cap
            doc["section_s"][section] = round(time.perf_counter() - clock[0], 1)
            clock[0] = time.perf_counter()
        out.write_text(json.dumps(doc, indent=1, default=str))
        out.with_suffix(".md").write_text(markdown(doc))

    vision_rows, router_rows = [], []
    if "floors" in args.sections:   # model figures: nothing is built or run
        doc["floors"] = floor_rows(args)
        doc["label"] = "model figures (FLOPs and bytes at the H200's peak rates), not measured"
        save("floors")
    lm = build_lm(args, device, dtype) if set(args.sections) - {"floors"} else None
    if lm is not None:
        doc["section_s"]["build"] = round(time.perf_counter() - clock[0], 1)
        clock[0] = time.perf_counter()
    if "vision" in args.sections:
        vr = build(lm)
        doc["vision"] = vision_rows = vision_section(args, vr, device)
        doc["attention_kernels"] = attention_kernels(vr, device)
        del vr
        save("vision")
    if "router" in args.sections:
        doc["router"] = router_rows = router_section(args, lm, device, dtype)
        save("router")
    tuned = args.tuned or pick_tuned(vision_rows, router_rows)
    doc["tuned"] = tuned
    if "ttft" in args.sections:
        doc["ttft"] = ttft_section(args, lm, device, tuned)
        save("ttft")
    if "profile" in args.sections:
        doc["profiles"] = profile_section(args, lm, device, dtype, tuned, out.with_suffix(""))
        save("profile")
    save()
    print(markdown(doc))
    print(f"wrote {out}")
    return 0


def markdown(doc) -> str:
    env = doc["environment"]
    lines = [f"### Fast path A/B: {env['device']} | {doc['settings']['shape']} shape, "
             f"{doc['settings']['dtype']}", "", f"*{doc['label']}.* `{env['command']}`; torch "
             f"{env['torch']}; {env['date_utc']}.", ""]
    if doc.get("floors"):
        lines += ["Floors (model: each stage at the larger of FLOPs / 790 TFLOP/s and bytes / 4.8 TB/s):", "",
                  markdown_table(doc["floors"], ["policy", "frames", "router_pool",
                                                        "visual_tokens", "prompt_tokens",
                                                        "floor_s", "floor_ratio_to_dense"],
                                        ["Policy", "Frames", "Router pool", "Visual tokens",
                                         "Prompt tokens", "Floor s", "Floor / Dense"]), ""]
    if doc.get("vision"):
        lines += ["Vision tower + projector, ms a frame:", "",
                  markdown_table(doc["vision"], ["variant", "ms_per_frame", "compile_s",
                                                        "error"],
                                        ["Variant", "ms/frame", "Compile s", "Error"]), ""]
        lines += [f"Attention kernels: {', '.join(doc.get('attention_kernels') or []) or '-'}",
                  ""]
    if doc.get("router"):
        lines += ["Image Router (shadow stack + head), ms a frame:", "",
                  markdown_table(doc["router"], ["variant", "chunk", "ms_per_frame",
                                                        "compile_s", "error"],
                                        ["Variant", "Chunk", "ms/frame", "Compile s",
                                         "Error"]), ""]
    if doc.get("ttft"):
        lines += [f"TTFT (tuned: {doc.get('tuned')}):", "",
                  markdown_table(doc["ttft"], ["settings", "policy", "frames", "ttft_s",
                                                      "floor_s", "ratio_to_dense",
                                                      "floor_ratio_to_dense",
                                                      "floor_ratio_tokens", "peak_total_gb",
                                                      "error"],
                                        ["Settings", "Policy", "Frames", "TTFT s", "Floor s",
                                         "/ Dense", "Floor / Dense", "Tokens / Dense",
                                         "Peak GB", "Error"]), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
