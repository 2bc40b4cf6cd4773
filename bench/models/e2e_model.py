"""The model side of bench/scripts/bench_e2e.py: a VideoRouter in a preset's shape with random
weights (or a checkpoint), the shadow-stack depth that keeps the routers' share of a full-size
model, the fixed relevance pattern of untrained routers, the CLIP row's scorer, and the random
video every row answers."""
from __future__ import annotations

import json
import pathlib
from typing import List, Optional

import torch

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "vr_runtime" / "configs"


class BenchError(ValueError):
    """A bad benchmark argument (the message names it and says what to do)."""


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


def random_video(num_frames: int, seed: int) -> torch.Tensor:
    """An ImageNet-normalised-range [T, 3, 448, 448] float tensor, as decoded video would be."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(num_frames, 3, 448, 448, generator=g)


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
