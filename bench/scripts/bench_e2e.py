"""End-to-end latency and memory of VideoRouter against its baselines (paper table
`latency_breakdown`), measured side by side in one run on one device.

    python -m bench.scripts.bench_e2e                        # GPU: InternVL3-8B shape, 64 frames, budget 12,288
    python -m bench.scripts.bench_e2e --sweep all            # + frames, budget and batch sweeps
    python -m bench.scripts.bench_e2e --cpu                  # CPU figures: the tiny preset, 8 frames
    python -m bench.scripts.bench_e2e --model /ckpt/InternVL3-8B-hf --routers routers.safetensors

Rows (one VideoRouter.answer call each, on the same random video tensor):
  Dense                     every frame at full resolution, no budget
  Budget (InternVL3*)       as many full-resolution frames as the budget holds, uniformly sampled
  Uniform pooling           one window for all frames, the finest that fits (1x2 at 64 frames)
  VideoRouter (s=2,4)       the paper's default: s_g=2 (Global), s1=1 (relevant), s0=4 (others)
  VideoRouter (s=4,8)       the paper's coarser row: s_g=4, s1=1, s0=8
  CLIP relevance pooling    frame-question similarity from a frozen CLIP model; the top k frames
                            at s1=1, the rest at s0=4, k = the VideoRouter rows' relevant count
                            (token-matched, as the paper's 7,936 vs 7,748 tokens); CLIP's
                            forward passes are timed in the router stage (the paper's 0.2 s)

What is measured, and how:
* Model: random weights in the exact shape of InternVL3-1B/2B/8B (vr_runtime/configs), paired with
  the tiny tokenizer; timings depend on shapes and sequence lengths, not on weight values. With
  --model, a real InternVL3-*-hf checkpoint.
* Relevance: untrained routers make meaningless decisions, so the VideoRouter rows impose a
  fixed pattern (default 28 of 64 frames, spread evenly; --relevance clustered puts them in one
  block). They call ``answer(policy="fragment", scorer=FixedRelevance(pattern, run_routers=True))``
  (the runtime's FrameScorer seam): the Semantic Router and the Image Router run their full
  forward passes (shadow stack + heads, every frame) in the timed router stage and only their
  decisions are replaced, so the router time in TTFT is real. With trained router weights
  (--routers with ``trained`` set) the routers decide, with ``policy="auto"``.
* CLIP: the paper does not name its CLIP model; without --clip PATH the row runs a random-weight
  CLIPModel in the shape of openai/clip-vit-base-patch16 (GPU) or a 2-layer toy (CPU mode),
  paired with the benchmark's tokenizer; timings depend on shapes, not weight values.
* Shadow stack: 4 decoder layers, as in the paper. For a reduced decoder (--text-layers, or the
  4-layer tiny preset of the CPU mode) the stack is reduced in proportion (4/28 of the depth, at
  least 1), so that the router's cost relative to the LLM stays that of the full-size model;
  --router-layers overrides.
* Budget: the visual-token budget is fixed (12,288 as in the paper's controlled protocol) and
  passed as ``answer(budget=...)``; ``max_length`` is budget + the full T-frame prompt's text
  tokens + max_new_tokens + margin (the runtime's own count), so every plan fits (each report's
  ``budget`` is checked against it).
* Timing: stage times come from the runtime's synchronised stage timers (report["timings_s"]);
  TTFT = vision + router + compress + prefill, after video decoding (the input is a ready
  [T, 3, 448, 448] tensor). Each row: ``--warmup`` untimed calls, then the median of ``--runs``.
* Memory: peak torch allocation per call (``torch.cuda.max_memory_allocated``), and the peak
  NVML reading (driver-level, CUDA context and allocator cache included) polled in a thread. The
  allocator cache is emptied between rows so each row's NVML peak is its own. The baselines are
  plain InternVL3, so on a GPU their rows run with the routers moved to the CPU (the shadow
  stack is ~1.9 GB at 8B); the VideoRouter rows count them. On CPU: the process RSS peak
  (weights included), with freed heap returned to the OS between rows.
* Batch: B different videos per row through the runtime's ``answer_batch`` when it has one
  (else B ``answer`` calls): one batched prefill and decode by default, ``--no-batch-prefill``
  the videos one after another; total and per-video wall time, peak memory over the batch.
* ``--decoding`` picks VideoRouter's decode mode (vr_runtime.generate); the rows report the mode
  used and ``decode_ms_per_token``. ``--router-pool`` reaches every row that runs the routers.
* Targets: on an H100/H200 at 8B / 64 frames / 12,288, VideoRouter (1,4) TTFT <= 0.40x
  Dense and <= 1.0 s, routers <= 8% of its TTFT, peak memory <= 20 GB; evaluated and printed
  only for such a run, and never for CPU figures.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time
from typing import Dict, List

import torch

from bench.harness.env import device_name, environment
from bench.models import e2e_memory
from bench.models.e2e_measure import Device, run_batch, run_table, used_router_pool
from bench.models.e2e_model import (BenchError, build, relevance_pattern, routers_trained,  # noqa: F401
                                    shape_config, shape_name)
from bench.report import e2e_report

ROOT = pathlib.Path(__file__).resolve().parents[2]

SHAPES = ("tiny", "1b", "2b", "8b")
QUESTION = "What does the person pick up from the table after the door opens?"

# (key, label, answer() keyword arguments)
POLICIES = [
    # the paper's Dense row: no budget, so its prompt may exceed max_length (said explicitly)
    ("dense", "Dense", dict(policy="dense", allow_over_length=True)),
    ("budget", "Budget (InternVL3*)", dict(policy="budget")),
    ("uniform", "Uniform pooling", dict(policy="uniform")),
    # The paper's rows "VideoRouter (s=2,4)" (its default) and "(s=4,8)": (s_g, s0) with s1 = 1.
    ("vr24", "VideoRouter (s=2,4) default", dict(policy="fragment", scales=(2, 1, 4))),
    ("vr48", "VideoRouter (s=4,8)", dict(policy="fragment", scales=(4, 1, 8))),
    # scorer "clip": MatchedCLIPScorer (models/e2e_model.py), built once per run by clip_scorer()
    ("clip", "CLIP relevance pooling", dict(policy="fragment", scales=(2, 1, 4),
                                            scorer="clip")),
]
PAPER_FRAMES, PAPER_BUDGET, PAPER_RELEVANT = 64, 12288, 28
SWEEP_FRAMES = (16, 32, 64, 128, 256)
SWEEP_BUDGETS = (4096, 8192, 12288, 16384, 24576)   # the paper's budget table, 4K..24K
TARGETS = dict(ttft_x_dense=0.40, ttft_s=1.0, router_share=0.08, peak_mem_gb=20.0)


# ----------------------------------------------------------------------------- arguments
def _ints(name):
    def parse(text):
        try:
            vals = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: expected comma-separated ints, got {text!r}")
        if not vals or min(vals) < 1:
            raise argparse.ArgumentTypeError(f"{name}: expected ints >= 1, got {text!r}")
        return vals
    return parse


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=SHAPES, help="model shape preset (GPU default 8b; CPU "
                    "default tiny; 1b/2b/8b can be reduced with --text-layers/--vision-layers)")
    ap.add_argument("--config", help="a config.json (HF InternVLConfig layout) instead of --shape")
    ap.add_argument("--model", help="a local InternVL3-*-hf checkpoint directory (real weights)")
    ap.add_argument("--routers", help="router weights (safetensors); trained ones decide relevance")
    ap.add_argument("--text-layers", type=int, help="keep only this many decoder layers")
    ap.add_argument("--vision-layers", type=int, help="keep only this many ViT layers")
    ap.add_argument("--router-layers", type=int, help="shadow-stack depth of untrained routers "
                    "(default 4, scaled with --text-layers)")
    ap.add_argument("--frames", type=int, help=f"sampled frames (GPU {PAPER_FRAMES}; CPU 8)")
    ap.add_argument("--budget", type=int, help=f"visual-token budget (GPU {PAPER_BUDGET}; CPU: "
                    f"the paper's 192 tokens per frame, frames * 192)")
    ap.add_argument("--runs", type=int, help="timed runs per row; the median is reported (default 5)")
    ap.add_argument("--warmup", type=int, help="untimed calls before the runs (default 2)")
    ap.add_argument("--sweep", choices=("none", "frames", "budget", "batch", "all"), default="none")
    ap.add_argument("--sweep-frames", type=_ints("--sweep-frames"),
                    help="frame counts of the frames sweep (GPU 16,32,64,128,256; CPU 4,8,16,32)")
    ap.add_argument("--sweep-budgets", type=_ints("--sweep-budgets"),
                    help="budgets of the budget sweep (GPU 4096,...,24576; CPU scaled to --frames)")
    ap.add_argument("--batch-sizes", type=_ints("--batch-sizes"), default=[1, 2, 4])
    ap.add_argument("--relevance", choices=("spread", "clustered"), default="spread")
    ap.add_argument("--relevant-frac", type=float, default=PAPER_RELEVANT / PAPER_FRAMES,
                    help="share of frames marked relevant (default 28/64)")
    ap.add_argument("--policies", default=",".join(k for k, _, _ in POLICIES),
                    help="rows to run, a subset of " + ",".join(k for k, _, _ in POLICIES))
    ap.add_argument("--router-pool", type=int, help="window applied to Z_t before the Image Router "
                    "(reaches the Image Router on every VideoRouter row; the results record the "
                    "pool the answers report; default: the routers' own setting)")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--clip", metavar="PATH", help="a local CLIPModel/SiglipModel directory for "
                    "the CLIP row (default: random weights in CLIP ViT-B/16's shape)")
    ap.add_argument("--decoding", choices=("auto", "dynamic", "static", "graph"), default="auto",
                    help="VideoRouter(decoding=): auto = the eager dynamic cache; graph = CUDA "
                    "graphs over a static KV cache, opt-in (vr_runtime.generate)")
    ap.add_argument("--no-batch-prefill", action="store_true",
                    help="batch sweep: answer_batch(batch_prefill=False), the videos one after "
                    "another (default: one batched prefill and decode)")
    ap.add_argument("--context", type=int, help="raise the decoder's context "
                    "(max_position_embeddings) to at least this many tokens, so Dense runs past "
                    "InternVL3-8B's 32,768 (123 frames): a compute comparison on random weights; "
                    "a real checkpoint past its context answers nonsense")
    ap.add_argument("--margin", type=int, default=100, help="safety margin epsilon of the budget")
    ap.add_argument("--dtype", choices=("bf16", "fp16", "fp32"))
    ap.add_argument("--cpu", action="store_true", help="CPU mode (the default without CUDA)")
    ap.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's own); "
                    "1 gives steadier figures on a machine shared with other jobs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--question", default=QUESTION)
    ap.add_argument("--out", help="results path stem (default bench/results/e2e_<device>_<shape>)")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return finish_args(args, ap)


def finish_args(args, ap):
    args.cpu = args.cpu or not torch.cuda.is_available()
    cpu = args.cpu
    if args.model and (args.shape or args.config):
        ap.error("--model: give either a checkpoint (--model) or a shape (--shape/--config), not both")
    if args.shape is None and args.config is None and not args.model:
        args.shape = "tiny" if cpu else "8b"
    if (args.text_layers or args.vision_layers) and (args.model or args.shape == "tiny"):
        ap.error("--text-layers/--vision-layers: only for --shape 1b/2b/8b or --config")
    args.frames = args.frames or (8 if cpu else PAPER_FRAMES)
    args.budget = args.budget or (args.frames * PAPER_BUDGET // PAPER_FRAMES if cpu else PAPER_BUDGET)
    args.runs = args.runs if args.runs is not None else 5
    args.warmup = args.warmup if args.warmup is not None else 2
    args.sweep_frames = args.sweep_frames or ([4, 8, 16, 32] if cpu else list(SWEEP_FRAMES))
    args.sweep_budgets = args.sweep_budgets or (
        [b * args.frames // PAPER_FRAMES for b in SWEEP_BUDGETS] if cpu else list(SWEEP_BUDGETS))
    if args.router_pool is not None and args.router_pool < 1:
        ap.error("--router-pool: expected an int >= 1")
    if args.context is not None and args.context < 1:
        ap.error("--context: expected an int >= 1")
    for name in ("frames", "budget", "runs", "max_new_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: expected an int >= 1")
    if args.threads is not None and args.threads < 1:
        ap.error("--threads: expected an int >= 1")
    if args.warmup < 0 or args.margin < 0:
        ap.error("--warmup / --margin: expected ints >= 0")
    if not 0.0 <= args.relevant_frac <= 1.0:
        ap.error(f"--relevant-frac: expected a share in [0, 1], got {args.relevant_frac}")
    keys = [k for k, _, _ in POLICIES]
    args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in args.policies if p not in keys]
    if bad or not args.policies:
        ap.error(f"--policies: unknown {bad}; choose from {','.join(keys)}")
    if args.clip is not None and not pathlib.Path(args.clip).is_dir():
        ap.error(f"--clip {args.clip!r}: no such directory")
    if "dense" not in args.policies:
        args.policies.insert(0, "dense")  # ratios and the text-token count need the Dense row
    for n in ("text_layers", "vision_layers", "router_layers"):
        v = getattr(args, n)
        if v is not None and v < 1:
            ap.error(f"--{n.replace('_', '-')}: expected an int >= 1")
    return args


# ----------------------------------------------------------------------------- targets
def check_targets(rows, args, cuda: bool) -> dict:
    """The fast path's latency and memory targets; only meaningful on a GPU at 8B / 64 frames /
    12,288."""
    applies = (cuda and args.shape == "8b" and not args.text_layers and not args.vision_layers
               and args.frames == PAPER_FRAMES and args.budget == PAPER_BUDGET)
    out = {"applies": applies, "targets": TARGETS}
    if not applies:
        out["note"] = ("targets are defined for a GPU (H100/H200) at the InternVL3-8B shape, 64 "
                       "frames, budget 12,288; not evaluated for this run")
        return out
    main = {r["policy"]: r for r in rows if r["sweep"] == "main" and not r.get("error")}
    vr, dense = main.get("vr24"), main.get("dense")
    if not vr or not dense:
        out["note"] = "VideoRouter (s=2,4) or Dense row missing or failed"
        return out
    checks = {
        "ttft_x_dense <= 0.40": vr["ttft_s"] / dense["ttft_s"] <= TARGETS["ttft_x_dense"],
        "ttft_s <= 1.0": vr["ttft_s"] <= TARGETS["ttft_s"],
        "router <= 8% of TTFT": (vr["router_s"] or 0) <= TARGETS["router_share"] * vr["ttft_s"],
        "peak memory <= 20 GB": (vr["peak_mem_gb"] or 0) <= TARGETS["peak_mem_gb"],
    }
    out["other_rows"] = {k: dict(ttft_x_dense=r["ttft_s"] / dense["ttft_s"], ttft_s=r["ttft_s"],
                                 router_share=(r["router_s"] or 0) / r["ttft_s"],
                                 peak_mem_gb=r["peak_mem_gb"])
                         for k, r in main.items() if k in ("vr48",)}
    out.update(row="vr24 (VideoRouter (s=2,4), the paper's default)", checks=checks, passed=all(checks.values()),
               values=dict(ttft_x_dense=vr["ttft_s"] / dense["ttft_s"], ttft_s=vr["ttft_s"],
                           router_share=(vr["router_s"] or 0) / vr["ttft_s"],
                           peak_mem_gb=vr["peak_mem_gb"]))
    return out


# ----------------------------------------------------------------------------- main
def device_tag(dev: torch.device) -> str:
    if dev.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(dev).lower()
    for k in ("h200", "h100", "a100", "l40s", "l4", "a10", "b200", "4090", "3090"):
        if k in name:
            return k
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def measure_all(vr, dev, args):
    """The main table, then the sweeps asked for; (rows with ratios to Dense, text tokens a
    frame count)."""
    policies = [p for p in POLICIES if p[0] in args.policies]
    rows: List[dict] = []
    text_cache: Dict[int, int] = {}
    run_table(vr, dev, args, policies, args.frames, args.budget, "main", rows, text_cache)
    sweeps = {"frames", "budget", "batch"} if args.sweep == "all" else {args.sweep}
    if "frames" in sweeps:
        for T in args.sweep_frames:
            run_table(vr, dev, args, policies, T, args.budget, "frames", rows, text_cache)
    if "budget" in sweeps:
        for B in args.sweep_budgets:
            run_table(vr, dev, args, policies, args.frames, B, "budget", rows, text_cache)
    if "batch" in sweeps:
        run_batch(vr, dev, args, policies, rows, text_cache)
    e2e_report.add_ratios(rows)
    return rows, text_cache


def settings_of(args, vr, dev, rows, text_cache, build_s) -> dict:
    """What a reader needs to interpret the figures (the results file's ``settings``)."""
    cpu, trained = not dev.cuda, routers_trained(vr)
    main_rows = [r for r in rows if r["sweep"] == "main"]
    return dict(
        shape=shape_name(args), config=shape_config(args), model=args.model, routers=args.routers,
        routers_trained=trained, frames=args.frames, budget=args.budget,
        text_tokens=text_cache.get(args.frames), max_new_tokens=args.max_new_tokens,
        margin=args.margin, context=getattr(vr.lm.text_config, "max_position_embeddings", None),
        context_raised=args.context is not None,
        max_length=main_rows[0].get("max_length") if main_rows else None,
        runs=args.runs, warmup=args.warmup, dtype=str(vr.lm.dtype).replace("torch.", ""),
        relevance=("from trained Image Router" if trained else
                   f"fixed {args.relevance}: {sum(relevance_pattern(args.frames, args.relevant_frac, args.relevance))}"
                   f" of {args.frames} frames"),
        relevant_frac=args.relevant_frac, sweep=args.sweep, sweep_frames=args.sweep_frames,
        sweep_budgets=args.sweep_budgets, batch_sizes=args.batch_sizes,
        router_layers=getattr(getattr(vr.routers, "config", None), "num_layers", None),
        decoding=getattr(getattr(vr, "greedy", None), "mode", None),
        batch_prefill=not args.no_batch_prefill,
        router_pool_requested=args.router_pool,
        # the pool the Image Router actually ran at, from the answers' own reports
        router_pool=used_router_pool(rows),
        router_mode=("Semantic + Image Router run, decisions imposed" if not trained else
                     "trained routers decide (policy 'auto')"),
        router_mode_detail=("policy 'fragment' with scorer FixedRelevance(pattern, run_routers=True): "
                            "both routers' full forward passes run on every VideoRouter call "
                            "(timed in 'router'); their outputs are discarded, Fragment and the "
                            "fixed pattern decide"
                            if not trained else "policy 'auto' with the loaded router weights"),
        memory=("torch max_memory_allocated + NVML " + dev.nvml_scope) if not cpu else
               "process RSS peak (sampled every 2 ms), freed heap trimmed between rows",
        build_s=build_s, seed=args.seed, question=args.question, argv=args.argv,
        attn_implementation=getattr(vr.lm.model.config, "_attn_implementation", None),
        cpu_threads=torch.get_num_threads() if cpu else None)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device("cpu" if args.cpu else "cuda")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}.get(args.dtype)
    torch.manual_seed(args.seed)
    cpu = device.type == "cpu"
    if cpu and args.threads:
        torch.set_num_threads(args.threads)
    label = "CPU figures (not comparable with GPU figures)" if cpu else "GPU figures"

    t0 = time.perf_counter()
    vr = build(args, device, dtype)
    if args.context:
        cfg = vr.lm.text_config
        cfg.max_position_embeddings = max(int(cfg.max_position_embeddings or 0), args.context)
    args._vr, args._clip = vr, None      # the CLIP row's scorer is built on first use
    build_s = time.perf_counter() - t0
    dev = Device(device)
    print(f"{label}: {device_name(device)} | {shape_name(args)} | build {build_s:.1f} s | "
          f"routers {'trained' if routers_trained(vr) else 'untrained: relevance fixed (' + args.relevance + ')'}",
          flush=True)

    rows, text_cache = measure_all(vr, dev, args)
    env = environment(device)
    env["driver"] = e2e_memory.nvml_driver_version()
    shape_tag = args.shape or (pathlib.Path(args.config).stem if args.config else "model")
    stem = pathlib.Path(args.out) if args.out else \
        ROOT / "bench" / "results" / f"e2e_{device_tag(device)}_{shape_tag}"
    targets = check_targets(rows, args, not cpu)
    settings = settings_of(args, vr, dev, rows, text_cache, build_s)
    meta = dict(benchmark="e2e_latency (paper table latency_breakdown)", label=label,
                environment=env, settings=settings, targets=targets)
    title = f"{device_name(device)} | {shape_name(args)} | {args.frames} frames, budget {args.budget:,}"

    main_rows = [r for r in rows if r["sweep"] == "main"]
    md = e2e_report.markdown_block(main_rows, rows, cpu, title, label, settings, env)
    files = e2e_report.write_results(stem, meta, rows, md)
    if not args.no_plot:
        p = e2e_report.plot(stem.with_suffix(".png"), rows, title, cpu)
        if p:
            files.append(p)
    e2e_report.print_run(rows, cpu, label, title, targets, md, files)
    return 0


if __name__ == "__main__":
    from vr_runtime.errors import DeviceError
    try:
        sys.exit(main())
    except (ValueError, DeviceError) as e:  # BenchError, missing model files, bad routers, no CUDA
        print(f"bench_e2e: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)
