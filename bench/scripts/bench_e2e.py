"""End-to-end latency and memory of VideoRouter against its baselines (paper table
`latency_breakdown`), measured side by side in one run on one device.

    python bench/scripts/bench_e2e.py                        # GPU: InternVL3-8B shape, 64 frames, budget 12,288
    python bench/scripts/bench_e2e.py --sweep all            # + frames, budget and batch sweeps
    python bench/scripts/bench_e2e.py --cpu                  # CPU figures: the tiny preset, 8 frames
    python bench/scripts/bench_e2e.py --model /ckpt/InternVL3-8B-hf --routers routers.safetensors

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
import ctypes
import json
import pathlib
import statistics
import sys
import time
from typing import Dict, List, Optional

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]   # the package and the harness, run as a file

import torch  # noqa: E402

import common  # noqa: E402  (bench/common.py: environment, device name, results writing)
from models import e2e_memory  # noqa: E402
from report import e2e_report  # noqa: E402

CONFIGS = ROOT / "vr_runtime" / "configs"
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
    # scorer "clip": MatchedCLIPScorer (below), built once per run by clip_scorer()
    ("clip", "CLIP relevance pooling", dict(policy="fragment", scales=(2, 1, 4),
                                            scorer="clip")),
]
PAPER_FRAMES, PAPER_BUDGET, PAPER_RELEVANT = 64, 12288, 28
SWEEP_FRAMES = (16, 32, 64, 128, 256)
SWEEP_BUDGETS = (4096, 8192, 12288, 16384, 24576)   # the paper's budget table, 4K..24K
TARGETS = dict(ttft_x_dense=0.40, ttft_s=1.0, router_share=0.08, peak_mem_gb=20.0)


class BenchError(ValueError):
    """A bad benchmark argument (the message names it and says what to do)."""


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


# ----------------------------------------------------------------------------- model
def shape_config(args) -> Optional[dict]:
    """The config dict of --shape/--config, with --text-layers/--vision-layers applied."""
    if args.model or args.shape == "tiny":
        return None
    path = pathlib.Path(args.config) if args.config else CONFIGS / f"internvl3_{args.shape}.json"
    if not path.is_file():
        raise BenchError(f"--config {str(path)!r}: no such file")
    cfg = json.loads(path.read_text())
    if args.text_layers:
        cfg["text_config"]["num_hidden_layers"] = args.text_layers
        cfg["text_config"]["max_window_layers"] = args.text_layers
    if args.vision_layers:
        cfg["vision_config"]["num_hidden_layers"] = args.vision_layers
    return cfg


def shape_name(args) -> str:
    if args.model:
        return pathlib.Path(args.model).name
    if args.shape == "tiny":
        return "tiny preset"
    base = pathlib.Path(args.config).stem if args.config else f"InternVL3-{args.shape.upper()} shape"
    base += ", random weights"
    if args.text_layers or args.vision_layers:
        base += f" (reduced: {args.text_layers or 'all'} text / {args.vision_layers or 'all'} vision layers)"
    return base


PAPER_ROUTER_LAYERS = 4  # k of the shadow stack (paper: first four language layers)


def router_layers(args) -> Optional[int]:
    """Shadow-stack depth for untrained routers: --router-layers; None (the runtime's 4) at a
    preset's full depth; for a reduced decoder (--text-layers, or the 4-layer tiny preset) 4
    scaled by the share of depth kept (against 28, InternVL3-8B, for tiny or a custom config),
    so the router's cost relative to the LLM stays that of the full-size model."""
    if args.router_layers:
        return args.router_layers
    if args.model or not (args.text_layers or args.shape == "tiny"):
        return None
    if args.shape == "tiny":
        from vr_runtime.backbones.tiny import ASSETS
        depth = json.loads((ASSETS / "config.json").read_text())["text_config"]["num_hidden_layers"]
        full = 28
    else:
        depth = args.text_layers
        full = 28 if args.config else json.loads(
            (CONFIGS / f"internvl3_{args.shape}.json").read_text())["text_config"]["num_hidden_layers"]
    return max(1, min(depth, round(PAPER_ROUTER_LAYERS * depth / full)))


def build(args, device, dtype):
    """A VideoRouter on ``device``: real checkpoint, the tiny preset, or a random-weight shape."""
    from vr_runtime import VideoRouter
    from vr_runtime.routing.routers import RouterConfig
    k = None if args.routers else router_layers(args)
    rc = RouterConfig(num_layers=k) if k else None
    if args.model:
        return VideoRouter.from_pretrained(args.model, routers=args.routers, device=device,
                                           dtype=dtype, router_config=rc, decoding=args.decoding)
    if args.shape == "tiny":
        if args.routers:
            return VideoRouter.from_pretrained("tiny", routers=args.routers, device=device,
                                               dtype=dtype, decoding=args.decoding)
        # from_pretrained("tiny") would pick up the shipped trained routers, which decide on the
        # synthetic task's frames; the benchmark feeds random frames, so it keeps its fixed
        # relevance protocol (untrained routers, decisions imposed) unless --routers is given.
        from vr_runtime.backbones import load_backbone
        from vr_runtime.routing.routers import Routers
        lm = load_backbone("tiny", device=device, dtype=dtype)
        return VideoRouter(lm, Routers.from_backbone(lm, rc), decoding=args.decoding)
    return VideoRouter.from_config(shape_config(args), routers=args.routers, device=device,
                                   dtype=dtype, seed=args.seed, router_config=rc,
                                   decoding=args.decoding)


def routers_trained(vr) -> bool:
    r = getattr(vr, "routers", None)
    return bool(getattr(r, "trained", False))


# ----------------------------------------------------------------------------- relevance
def relevance_pattern(num_frames: int, frac: float, kind: str) -> List[bool]:
    """``round(frac * T)`` relevant frames: evenly spread (UniformSample) or one centred block."""
    from vr_runtime import uniform_sample
    k = min(num_frames, int(frac * num_frames + 0.5))
    if kind == "spread":
        keep = set(uniform_sample(list(range(num_frames)), k))
    else:
        start = (num_frames - k) // 2
        keep = set(range(start, start + k))
    return [t in keep for t in range(num_frames)]


# ----------------------------------------------------------------------------- CLIP row
# CLIP ViT-B/16's shape (openai/clip-vit-base-patch16) and a toy for the CPU mode.
CLIP_SHAPES = {
    "b16": dict(text=dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=12,
                          num_attention_heads=8),
                vision=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                            num_attention_heads=12, image_size=224, patch_size=16),
                projection_dim=512),
    "toy": dict(text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=2),
                vision=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=2, image_size=224, patch_size=32),
                projection_dim=64),
}


def _matched_clip_class():
    from vr_runtime.routing.scorers import FrameScorer, FrameScores

    class MatchedCLIPScorer(FrameScorer):
        """CLIP similarities (really computed, timed as routing); the ``k`` most similar
        frames are relevant, so the row keeps as many frames at s1 as the VideoRouter rows."""
        name = "clip"
        needs_z = False
        uses_routers = False

        def __init__(self, clip, k: int):
            self.clip, self.k = clip, int(k)

        def score(self, inp):
            sims = self.clip.similarities(inp.pixel_values, inp.frame_spec, inp.question)
            k = min(self.k, int(sims.numel()))
            top = set(torch.topk(sims, k).indices.tolist()) if k else set()
            return FrameScores([t in top for t in range(int(sims.numel()))],
                               [float(x) for x in sims], self.name)

    return MatchedCLIPScorer


def clip_model(args, vr):
    """The CLIPScorer of the CLIP row: --clip, else random weights (shape per mode)."""
    from vr_runtime.routing.scorers import CLIPScorer
    dev, dt = vr.lm.device, vr.lm.dtype
    if args.clip:
        return CLIPScorer.from_pretrained(args.clip, device=dev, dtype=dt)
    from transformers import CLIPConfig, CLIPModel
    shape = CLIP_SHAPES["toy" if args.cpu else "b16"]
    tok = vr.lm.tokenizer
    cfg = CLIPConfig(text_config=dict(shape["text"], vocab_size=len(tok),
                                      max_position_embeddings=77),
                     vision_config=shape["vision"], projection_dim=shape["projection_dim"])
    torch.manual_seed(args.seed)
    model = CLIPModel(cfg).to(device=dev, dtype=dt)
    return CLIPScorer(model, tok, shape["vision"]["image_size"],
                      (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))


def clip_scorer(args, vr, num_frames: int):
    """The CLIP row's scorer at ``num_frames``: k = the fixed pattern's relevant count."""
    if getattr(args, "_clip", None) is None:
        args._clip = clip_model(args, vr)
    k = sum(relevance_pattern(num_frames, args.relevant_frac, args.relevance))
    return _matched_clip_class()(args._clip, k)


# ----------------------------------------------------------------------------- measuring
class Device:
    """Synchronisation, allocator resets and memory readers for one device."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.nvml, self.nvml_scope = e2e_memory.nvml_reader(device.index or 0)
        else:
            self.nvml, self.nvml_scope = None, "n/a (CPU)"
        self.rss = None if self.cuda else e2e_memory.rss_reader()
        self._libc = None
        if not self.cuda:
            try:
                self._libc = ctypes.CDLL("libc.so.6")
            except OSError:
                self._libc = None

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def release(self):
        """Between rows: hand cached/freed memory back so the next row's peak is its own."""
        import gc
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()
        elif self._libc is not None and hasattr(self._libc, "malloc_trim"):
            self._libc.malloc_trim(0)

    def sampler(self) -> e2e_memory.PeakSampler:
        # Within one call the caching allocator only grows its reserve (nothing calls
        # empty_cache), so NVML's reading is non-decreasing and a 10 ms poll loses nothing while
        # keeping the sampler thread off the launch path. Freed CPU buffers do go back to the OS
        # (large blocks are mmapped), so RSS is polled faster.
        if self.cuda:
            return e2e_memory.PeakSampler(self.nvml, interval_s=0.010)
        return e2e_memory.PeakSampler(self.rss, interval_s=0.002)

    def reset_peak(self):
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def torch_peak(self) -> Optional[int]:
        return torch.cuda.max_memory_allocated(self.device) if self.cuda else None


def random_video(num_frames: int, seed: int) -> torch.Tensor:
    """An ImageNet-normalised-range [T, 3, 448, 448] float tensor, as decoded video would be."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(num_frames, 3, 448, 448, generator=g)


def needs_relevance(kw: dict) -> bool:
    """Whether a row's planner reads frame relevance: asked of its registration
    (vr_runtime.planning.policies), so a new relevance planner gets the relevance rows' treatment."""
    from vr_runtime.planning.policies import get_planner
    return get_planner(kw["policy"]).needs_relevance


def budgeted(kw: dict) -> bool:
    """Whether a row's planner (or the ones auto routes to) plans under a visual budget."""
    from vr_runtime.planning.policies import is_budgeted
    return is_budgeted(kw["policy"])


def answer_options(args, num_frames: int, max_length: int, budget: int, kw: dict,
                   relevant=None):
    """The AnswerOptions of one row, at the fixed visual budget. VideoRouter rows run both
    routers: with a fixed ``relevant`` pattern through ``FixedRelevance(run_routers=True)``
    (decisions imposed, cost real), else policy "auto" as a trained deployment would."""
    from vr_runtime.request import AnswerOptions
    from vr_runtime.routing.scorers import FixedRelevance
    out = dict(num_frames=num_frames, max_length=max_length, max_new_tokens=args.max_new_tokens,
               margin=args.margin, **kw)
    if budgeted(kw):
        out["budget"] = budget
    if kw.get("scorer") == "clip":
        out["scorer"] = clip_scorer(args, args._vr, num_frames)
    elif needs_relevance(kw):
        if relevant is not None:
            # the pool goes to the scorer: answer(router_pool=) only reaches the default one
            out["scorer"] = FixedRelevance(relevant, run_routers=True,
                                           router_pool=args.router_pool)
        else:
            out["policy"] = "auto"
            if args.router_pool is not None:
                out["router_pool"] = args.router_pool
    return AnswerOptions(**out)


def answer(vr, video, args, max_length: int, budget: int, kw: dict, relevant):
    """One VideoRouter.answer call of a row."""
    return vr.answer(video, args.question, options=answer_options(
        args, int(video.shape[0]), max_length, budget, kw, relevant))


def call(vr, dev: Device, video, args, max_length: int, budget: int, kw: dict, relevant) -> dict:
    """One answer(); returns its report plus the harness's own measurements."""
    dev.reset_peak()
    with dev.sampler() as s:
        dev.sync()
        t0 = time.perf_counter()
        res = answer(vr, video, args, max_length, budget, kw, relevant)
        dev.sync()
        wall = time.perf_counter() - t0
    rep = dict(res.report)
    rep["_wall_s"] = wall
    rep["_outside_peak"] = s.peak
    tp = dev.torch_peak()
    # the report's peak is the CUDA allocator's there; on CPU it is the process's resident
    # high-water mark, which the harness measures apart (_outside_peak)
    rep["_torch_peak"] = (rep.get("peak_memory_bytes") or tp) if dev.cuda else None
    return rep


def used_router_pool(rows: List[dict]):
    """The Image Router window the rows' answers report (one value, a sorted list when rows
    differ, None when no row ran the Image Router)."""
    pools = sorted({r["router_pool"] for r in rows if r.get("router_pool") is not None})
    return pools[0] if len(pools) == 1 else (pools or None)


def _norm(w):
    """A window as JSON writes it (1, [1, 2]) or as the planner returns it (1, (1, 2)) -> tuple."""
    if isinstance(w, (list, tuple)):
        return tuple(int(x) for x in w)
    return (int(w), int(w)) if w else 0


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarise(reports: List[dict]) -> dict:
    """Median over runs of each stage (TTFT is the median of the per-run TTFTs, not a sum)."""
    t = lambda k: median([r.get("timings_s", {}).get(k) for r in reports])  # noqa: E731
    last = reports[-1]
    ttfts = [r.get("timings_s", {}).get("ttft") for r in reports]
    vision, compress = t("vision"), t("compress")
    vc = median([(r["timings_s"].get("vision") or 0) + (r["timings_s"].get("compress") or 0)
                 for r in reports])
    gb = lambda b: None if b is None else b / 1e9  # noqa: E731
    return dict(
        visual_tokens=last.get("visual_tokens"), dense_visual_tokens=last.get("dense_visual_tokens"),
        budget_runtime=last.get("budget"), text_tokens=last.get("text_tokens"),
        scales=last.get("scales"), policy_run=last.get("policy"),
        router_pool=last.get("router_pool"), generated_tokens=last.get("generated_tokens"),
        router_s=t("router"), vision_s=vision, compress_s=compress, vision_compress_s=vc,
        prefill_s=t("prefill"), ttft_s=t("ttft"), generate_s=t("generate"),
        # decode steps after the prefill's token; the first step of a run includes the copy
        # into the static cache (static/graph decoding)
        decode_ms_per_token=median([1e3 * r["timings_s"]["generate"] / (r["generated_tokens"] - 1)
                                    for r in reports if (r.get("generated_tokens") or 0) > 1
                                    and r.get("timings_s", {}).get("generate") is not None]),
        decoding=last.get("decoding"),
        total_s=median([r["_wall_s"] for r in reports]),
        ttft_min_s=min(x for x in ttfts if x is not None) if any(x is not None for x in ttfts) else None,
        ttft_max_s=max(x for x in ttfts if x is not None) if any(x is not None for x in ttfts) else None,
        runs=len(reports), runs_ttft_s=ttfts,
        peak_mem_gb=gb(max((r["_torch_peak"] or 0) for r in reports) or None),
        nvml_stage_peak_gb=gb(max((r.get("peak_memory_nvml_bytes") or 0) for r in reports) or None),
        outside_peak_gb=gb(max((r["_outside_peak"] or 0) for r in reports) or None),
        # the runtime's own: CUDA, the allocator's peak minus the weights on the device; CPU,
        # the resident set's rise over the request (vr_runtime.telemetry.memory)
        activation_peak_gb=gb(max((r.get("peak_activation_bytes") or 0) for r in reports) or None),
        weights_gb=gb((last.get("weights_bytes") or {}).get("total")),
        shadow_stack_gb=gb((last.get("weights_bytes") or {}).get("shadow_stack")),
    )


def measure_row(vr, dev, args, video, key, label, kw, *, sweep, budget, max_length, relevant):
    """Warm-up, then ``args.runs`` timed calls of one policy; a row dict (``error`` on failure)."""
    row = dict(sweep=sweep, policy=key, label=label, frames=int(video.shape[0]), budget=budget,
               batch=1, max_length=max_length)
    fragment = needs_relevance(kw)
    routed = fragment and kw.get("scorer") != "clip"     # the CLIP row does not use the routers
    rel = relevant if fragment else None
    if fragment:
        row["relevant"] = None if rel is None else sum(rel)
    if kw.get("scorer") == "clip":
        row["relevant"] = sum(relevance_pattern(int(video.shape[0]), args.relevant_frac,
                                                args.relevance))
    try:
        with e2e_memory.routers_offloaded(vr, enabled=dev.cuda and not routed):
            dev.release()
            for _ in range(args.warmup):
                call(vr, dev, video, args, max_length, budget, kw, rel)
            reports = [call(vr, dev, video, args, max_length, budget, kw, rel)
                       for _ in range(args.runs)]
    except (ValueError, RuntimeError) as e:  # BudgetError, OOM, ...: keep the other rows
        row["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        if dev.cuda:
            torch.cuda.empty_cache()
        return row
    row.update(summarise(reports))
    if row.get("budget_runtime") is not None and budgeted(kw) \
            and row["budget_runtime"] != budget:
        row["error"] = (f"runtime budget {row['budget_runtime']} != requested {budget}: the text "
                        f"token count differs from the runtime's")
    if dev.cuda:
        row["nvml_peak_gb"] = row.pop("outside_peak_gb")
    else:
        row["peak_mem_gb"] = row.pop("outside_peak_gb")  # CPU: process RSS peak
    if routed and rel is None and row.get("scales") is not None:
        row["relevant"] = sum(1 for s in row["scales"] if _norm(s) == _norm(kw["scales"][1]))
    return row


def text_tokens_for(vr, dev, args, video) -> int:
    """Text tokens of the full T-frame prompt (question, chat template and every frame's
    "FrameN: <img></img>" line), counted the way the runtime counts them for its budget."""
    return int(vr.lm.text_tokens(args.question, int(video.shape[0])))


def run_table(vr, dev, args, frames, budget, sweep, rows, text_cache) -> None:
    """All policies at one (frames, budget) point. A sweep point equal to the main table's
    reuses its rows (marked ``reused_from``) instead of measuring the same thing twice."""
    if sweep != "main":
        same = [r for r in rows if r["sweep"] == "main" and r["frames"] == frames
                and r["budget"] == budget]
        if same:
            rows.extend(dict(r, sweep=sweep, reused_from="main") for r in same)
            return
    video = random_video(frames, args.seed)
    if frames not in text_cache:
        text_cache[frames] = text_tokens_for(vr, dev, args, video)
    max_length = budget + text_cache[frames] + args.max_new_tokens + args.margin
    relevant = None if routers_trained(vr) else relevance_pattern(frames, args.relevant_frac,
                                                                   args.relevance)
    for key, label, kw in POLICIES:
        if key not in args.policies:
            continue
        row = measure_row(vr, dev, args, video, key, label, kw, sweep=sweep, budget=budget,
                          max_length=max_length, relevant=relevant)
        rows.append(row)
        print(f"  [{sweep}] T={frames} B={budget} {label}: "
              + (row["error"] if row.get("error") else
                 f"{row['visual_tokens']} tokens, TTFT {row['ttft_s']:.3f} s"), flush=True)


def run_batch(vr, dev, args, rows, text_cache) -> None:
    """B different videos per row: answer_batch when the runtime has one, else B sequential calls."""
    frames, budget = args.frames, args.budget
    videos = [random_video(frames, args.seed + i) for i in range(max(args.batch_sizes))]
    if frames not in text_cache:
        text_cache[frames] = text_tokens_for(vr, dev, args, videos[0])
    max_length = budget + text_cache[frames] + args.max_new_tokens + args.margin
    relevant = None if routers_trained(vr) else relevance_pattern(frames, args.relevant_frac,
                                                                   args.relevance)
    batched = hasattr(vr, "answer_batch")
    for B in args.batch_sizes:
        for key, label, kw in POLICIES:
            if key not in args.policies:
                continue
            fragment = needs_relevance(kw)
            routed = fragment and kw.get("scorer") != "clip"
            rel = relevant if fragment else None
            row = dict(sweep="batch", policy=key, label=label, frames=frames, budget=budget, batch=B,
                       batch_mode=(("answer_batch(batch_prefill=False): the videos one after "
                                    "another" if args.no_batch_prefill else
                                    "answer_batch: stages per video, then one batched prefill "
                                    "and decode")
                                   if batched else "sequential answer() calls (no answer_batch)"),
                       max_length=max_length)
            try:
                with e2e_memory.routers_offloaded(vr, enabled=dev.cuda and not routed):
                    dev.release()
                    runs = [batch_call(vr, dev, args, videos[:B], max_length, budget, kw, rel,
                                       batched)
                            for _ in range(args.warmup + args.runs)][args.warmup:]
            except (ValueError, RuntimeError) as e:
                row["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                rows.append(row)
                continue
            gb = lambda b: None if not b else b / 1e9  # noqa: E731
            walls = [w for w, _, _, _ in runs]
            reps = [r for _, _, _, got in runs for r in got]
            peaks = [p for _, p, _, _ in runs]
            outs = [o for _, _, o, _ in runs]
            row.update(
                visual_tokens=sum(r.get("visual_tokens") or 0 for r in runs[0][3]),
                ttft_s=median([r["timings_s"].get("ttft") for r in reps]),
                total_s=median(walls), per_video_s=median(walls) / B, runs=len(walls),
                peak_mem_gb=gb(max(p or 0 for p in peaks)) if dev.cuda else gb(max(o or 0 for o in outs)),
                nvml_peak_gb=gb(max(o or 0 for o in outs)) if dev.cuda else None)
            rows.append(row)
            print(f"  [batch] B={B} {label}: {row['total_s']:.3f} s for {B} videos "
                  f"({row['batch_mode']})", flush=True)


def batch_call(vr, dev, args, videos, max_length, budget, kw, rel, batched):
    """One timed pass over ``videos`` -> (wall s, torch peak, NVML/RSS peak, reports)."""
    dev.reset_peak()
    with dev.sampler() as s:
        dev.sync()
        t0 = time.perf_counter()
        if batched:  # the runtime's batched entry point, when it has one
            res = vr.answer_batch(videos, args.question,
                                  batch_prefill=not args.no_batch_prefill, options=answer_options(
                                      args, int(videos[0].shape[0]), max_length, budget, kw, rel))
            got = [r.report for r in res]
        else:
            got = [answer(vr, v, args, max_length, budget, kw, rel).report for v in videos]
        dev.sync()
        wall = time.perf_counter() - t0
    peak = (dev.torch_peak() or max((r.get("peak_memory_bytes") or 0) for r in got) or None) \
        if dev.cuda else None
    return wall, peak, s.peak, got


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
    args._vr, args._clip = vr, None      # the CLIP row's scorer is built on first use
    build_s = time.perf_counter() - t0
    dev = Device(device)
    trained = routers_trained(vr)
    print(f"{label}: {common.device_name(device)} | {shape_name(args)} | build {build_s:.1f} s | "
          f"routers {'trained' if trained else 'untrained: relevance fixed (' + args.relevance + ')'}",
          flush=True)

    rows: List[dict] = []
    text_cache: Dict[int, int] = {}
    run_table(vr, dev, args, args.frames, args.budget, "main", rows, text_cache)
    sweeps = {"frames", "budget", "batch"} if args.sweep == "all" else {args.sweep}
    if "frames" in sweeps:
        for T in args.sweep_frames:
            run_table(vr, dev, args, T, args.budget, "frames", rows, text_cache)
    if "budget" in sweeps:
        for B in args.sweep_budgets:
            run_table(vr, dev, args, args.frames, B, "budget", rows, text_cache)
    if "batch" in sweeps:
        run_batch(vr, dev, args, rows, text_cache)
    e2e_report.add_ratios(rows)

    main_rows = [r for r in rows if r["sweep"] == "main"]
    env = common.environment(device)
    env["driver"] = e2e_memory.nvml_driver_version()
    tag = device_tag(device)
    shape_tag = args.shape or (pathlib.Path(args.config).stem if args.config else "model")
    stem = pathlib.Path(args.out) if args.out else ROOT / "bench" / "results" / f"e2e_{tag}_{shape_tag}"
    targets = check_targets(rows, args, not cpu)
    settings = dict(
        shape=shape_name(args), config=shape_config(args), model=args.model, routers=args.routers,
        routers_trained=trained, frames=args.frames, budget=args.budget,
        text_tokens=text_cache.get(args.frames), max_new_tokens=args.max_new_tokens,
        margin=args.margin,
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
    meta = dict(benchmark="e2e_latency (paper table latency_breakdown)", label=label,
                environment=env, settings=settings, targets=targets)
    title = f"{common.device_name(device)} | {shape_name(args)} | {args.frames} frames, budget {args.budget:,}"

    md = markdown_block(main_rows, rows, cpu, title, label, settings, env)
    files = e2e_report.write_results(stem, meta, rows, md)
    if not args.no_plot:
        p = e2e_report.plot(stem.with_suffix(".png"), rows, title, cpu)
        if p:
            files.append(p)

    print()
    print(f"== {label}: {title}")
    print(e2e_report.text_table(main_rows, cpu))
    for sweep in ("frames", "budget", "batch"):
        srows = [r for r in rows if r["sweep"] == sweep]
        if srows:
            print(f"\n== {sweep} sweep")
            print(batch_text(srows) if sweep == "batch" else e2e_report.text_table(
                [dict(r, label=f"{r['label']} (T={r['frames']}, B={r['budget']:,})") for r in srows], cpu))
    print(f"\n== reference: {e2e_report.PAPER_NOTE}")
    print(e2e_report.paper_table())
    print("\n== targets: " + json.dumps({k: v for k, v in targets.items() if k != "targets"},
                                        default=str))
    print("\n== markdown for BENCHMARKS.md\n")
    print(md)
    print("\nwrote " + ", ".join(str(f) for f in files))
    return 0


def batch_text(rows) -> str:
    lines = ["Method  B  mode  visual tokens  total s  per video s  peak GB"]
    for r in rows:
        if r.get("error"):
            lines.append(f"{r['label']}  {r['batch']}  {r['error']}")
        else:
            pk = "-" if r.get("peak_mem_gb") is None else f"{r['peak_mem_gb']:.2f}"
            lines.append(f"{r['label']}  {r['batch']}  {r['batch_mode']}  {r['visual_tokens']:,}  "
                         f"{r['total_s']:.3f}  {r['per_video_s']:.3f}  {pk}")
    return "\n".join(lines)


def settings_line(st: dict, env: dict) -> str:
    """One paragraph with what a reader needs to interpret the table."""
    ml = st.get("max_length")
    parts = [
        f"{st['shape']}, {st['dtype']}, attention {st.get('attn_implementation')}",
        f"{st['frames']} frames, visual budget {st['budget']:,}"
        + (f" (max_length {ml:,} = budget + {st['text_tokens']} text + {st['max_new_tokens']} "
           f"new + {st['margin']} margin)" if ml else ""),
        f"relevance: {st['relevance']}",
        f"routers: {st['router_mode']}, shadow stack {st.get('router_layers')} "
        f"layer(s), router_pool {st.get('router_pool')}",
        f"median of {st['runs']} runs after {st['warmup']} warm-up",
        f"memory: {st['memory']}",
        f"torch {env.get('torch')}, transformers {env.get('transformers')}, triton "
        f"{env.get('triton')}, CUDA {env.get('cuda')}, driver {env.get('driver')}",
        f"{env.get('date_utc')}",
        f"`{env.get('command')}`",
    ]
    if st.get("cpu_threads"):
        parts.insert(5, f"{st['cpu_threads']} CPU thread(s)")
    return "; ".join(parts) + "."


def markdown_block(main_rows, rows, cpu, title, label, settings=None, env=None) -> str:
    out = [f"### {title}", "", f"*{label}.* Median of the timed runs; ratios to Dense from the same run."]
    if settings is not None:
        out += ["", settings_line(settings, env or {})]
    out += ["", e2e_report.markdown_table(main_rows, cpu)]
    for sweep in ("frames", "budget"):
        srows = [r for r in rows if r["sweep"] == sweep]
        if srows:
            out += ["", f"{sweep} sweep:", "", e2e_report.markdown_table(
                [dict(r, label=f"{r['label']} (T={r['frames']}, B={r['budget']:,})") for r in srows], cpu)]
    brows = [r for r in rows if r["sweep"] == "batch"]
    if brows:
        out += ["", f"batch sweep ({brows[0].get('batch_mode')}):", "", batch_markdown(brows, cpu)]
    if cpu:
        out += ["", "GPU (InternVL3-8B shape, 64 frames, budget 12,288): pending -- run "
                "`python bench/scripts/bench_e2e.py --sweep all` on an H100/H200.", "",
                e2e_report.pending_markdown("NVIDIA H100 / H200", "pending: no GPU in this session")]
    out += ["", f"Reference ({e2e_report.PAPER_NOTE}):", "", e2e_report.paper_table(markdown=True)]
    return "\n".join(out)


def batch_markdown(rows, cpu) -> str:
    mem = "Peak RSS GB (CPU)" if cpu else "Peak mem GB"
    out = [f"| Method | Videos | Visual tokens (all) | Total s | Per video s | {mem} |",
           "|:--|--:|--:|--:|--:|--:|"]
    for r in rows:
        if r.get("error"):
            out.append(f"| {r['label']} | {r['batch']} | {r['error']} | | | |")
            continue
        pk = "-" if r.get("peak_mem_gb") is None else f"{r['peak_mem_gb']:.2f}"
        out.append(f"| {r['label']} | {r['batch']} | {r['visual_tokens']:,} | {r['total_s']:.3f} | "
                   f"{r['per_video_s']:.3f} | {pk} |")
    return "\n".join(out)


if __name__ == "__main__":
    from vr_runtime.errors import DeviceError
    try:
        sys.exit(main())
    except (ValueError, DeviceError) as e:  # BenchError, missing model files, bad routers, no CUDA
        print(f"bench_e2e: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)
