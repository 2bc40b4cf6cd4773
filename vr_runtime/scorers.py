"""Frame scoring, the one seam between "which frames matter" and the planner.

A :class:`FrameScorer` turns a question and a video's frames into per-frame scores and
relevance decisions (:class:`FrameScores`). The runtime's ``fragment`` policy calls the scorer
it is given; the implementations are

* :class:`ImageRouterScorer` -- the paper's Image Router over [Z_t; Emb(q)] (the default);
* :class:`CachedImageRouterScorer` -- the same, reusing the shadow stack's question-independent
  state over each Z_t across questions on one video (``cache_visual``);
* :class:`FixedRelevance` -- given decisions (benchmarks, ablations, label probes), optionally
  after running the real routers so their cost stays in TTFT;
* :class:`CLIPScorer` -- frame-question similarity from a frozen CLIP/SigLIP model, top frames
  kept (the paper's Appendix D baseline).

Adding a scorer is one subclass; pass an instance as ``VideoRouter.answer(scorer=...)``.
"""
from __future__ import annotations

import abc
import pathlib
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Optional, Sequence

import torch

from .policies import Windows, relevant_from_probs, topk_of, topk_relevant


@dataclass
class FrameScores:
    relevant: List[bool]                 # the decision per frame
    scores: Optional[List[float]]        # what the decision came from (report), or None
    source: str                          # scorer name
    router_pool: Optional[int] = None    # window on Z_t before the Image Router, when it ran


@dataclass
class ScoringInput:
    """What a scorer may read. ``Z`` is filled only for scorers with ``needs_z``."""
    question: str
    pixel_values: torch.Tensor           # [T, 3, H, W] normalised by the backbone's FrameSpec
    Z: Optional[torch.Tensor]            # [T, H*W, D]
    budget: int                          # visual budget (for rank-based scorers)
    windows: Windows
    video_state: Optional[Dict[str, Any]] = None  # per-video cache (cache_visual), or None


class FrameScorer(abc.ABC):
    name: ClassVar[str] = ""
    needs_z: ClassVar[bool] = True       # the runtime encodes Z before scoring
    uses_routers: ClassVar[bool] = True  # decisions come from the routers' weights

    @abc.abstractmethod
    def score(self, vr, inp: ScoringInput) -> FrameScores:
        """``vr``: the :class:`~vr_runtime.runtime.VideoRouter` (backbone, routers)."""


class ImageRouterScorer(FrameScorer):
    """sigmoid(Image Router logit) > the routers' threshold, per frame."""
    name = "image-router"

    def __init__(self, frame_batch: Optional[int] = None, router_pool: Optional[int] = None):
        self.frame_batch = frame_batch
        self.router_pool = router_pool

    def probs(self, vr, inp: ScoringInput) -> torch.Tensor:
        q = vr.question_embeddings(inp.question)
        return vr.routers.frame_probs(inp.Z, q, self.frame_batch, self.router_pool, vr.lm.grid)

    def pool(self, vr) -> int:
        return vr.routers.config.router_pool if self.router_pool is None else self.router_pool

    def score(self, vr, inp: ScoringInput) -> FrameScores:
        probs = self.probs(vr, inp).tolist()
        return FrameScores(relevant_from_probs(probs, vr.routers.config.threshold), probs,
                           self.name, router_pool=self.pool(vr))


class CachedImageRouterScorer(ImageRouterScorer):
    """The Image Router with the shadow stack's state over each Z_t kept in the video's cache:
    Z_t comes before the question in a causal stack, so a new question only runs its own tokens."""
    name = "image-router-cached"

    def probs(self, vr, inp: ScoringInput) -> torch.Tensor:
        state = inp.video_state if inp.video_state is not None else {}
        pool = self.pool(vr)
        key = ("router-cache", id(vr.routers), pool)
        cache = state.get(key)
        if cache is None:
            cache = state[key] = vr.routers.visual_cache(inp.Z, self.frame_batch, pool, vr.lm.grid)
        q = vr.question_embeddings(inp.question)
        return torch.sigmoid(vr.routers.frame_logits_cached(cache, q).float())


class FixedRelevance(FrameScorer):
    """Given decisions. With ``run_routers`` the real Semantic and Image Routers still run (and
    are timed) and their outputs are discarded: the benchmark's stand-in for trained routers,
    so router cost stays in TTFT while the decisions are controlled. ``frame_batch`` and
    ``router_pool`` reach the Image Router exactly as :class:`ImageRouterScorer`'s do, so the
    cost measured is the cost of the configuration asked for (the report names the pool)."""
    name = "fixed"

    def __init__(self, relevant: Sequence[bool], run_routers: bool = False,
                 frame_batch: Optional[int] = None, router_pool: Optional[int] = None):
        self.relevant = [bool(r) for r in relevant]
        self.run_routers = run_routers
        self.uses_routers = False
        self.needs_z = run_routers
        self.frame_batch = frame_batch
        self.router_pool = router_pool

    def pool(self, vr) -> Optional[int]:
        """The window the Image Router runs at (None: the routers do not run)."""
        if not self.run_routers:
            return None
        return vr.routers.config.router_pool if self.router_pool is None else self.router_pool

    def score(self, vr, inp: ScoringInput) -> FrameScores:
        T = inp.pixel_values.shape[0]
        if len(self.relevant) != T:
            raise ValueError(f"relevant: expected {T} entries (one per sampled frame), got "
                             f"{len(self.relevant)}")
        if self.run_routers:
            q = vr.question_embeddings(inp.question)
            vr.routers.policy_logits(q[None])
            vr.routers.frame_probs(inp.Z, q, self.frame_batch, self.router_pool, vr.lm.grid)
        return FrameScores(list(self.relevant), None, self.name, router_pool=self.pool(vr))


class CLIPScorer(FrameScorer):
    """CLIP relevance pooling (paper Appendix D): cosine similarity between each frame's image
    embedding and the question's text embedding from a frozen CLIP-style model
    (transformers ``CLIPModel`` or ``SiglipModel``, local directory); the highest-scoring frames
    that Algorithm 1 can keep at full resolution are relevant, the rest pooled to fit."""
    name = "clip"
    needs_z = False
    uses_routers = False

    def __init__(self, model, tokenizer, image_size: int, mean: Sequence[float],
                 std: Sequence[float], batch: int = 32):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.image_size = int(image_size)
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
        self.batch = batch

    @classmethod
    def from_pretrained(cls, path, device="cpu", dtype=torch.float32) -> "CLIPScorer":
        """A local CLIP/SigLIP directory (config.json, safetensors, tokenizer); nothing is
        downloaded. Image size and mean/std come from its preprocessor config when present."""
        import json
        from transformers import AutoModel, AutoTokenizer
        from .errors import ModelFilesError
        p = pathlib.Path(path)
        if not (p / "config.json").is_file():
            raise ModelFilesError(f"--clip {str(path)!r}: not a CLIP/SigLIP directory "
                                  f"(no config.json); pass a local CLIPModel or SiglipModel")
        try:
            mtype = json.loads((p / "config.json").read_text()).get("model_type")
        except (OSError, json.JSONDecodeError) as e:
            raise ModelFilesError(f"--clip {str(path)!r}: unreadable config.json ({e})") from None
        if mtype not in ("clip", "siglip", "siglip2"):
            raise ModelFilesError(f"--clip {str(path)!r}: model_type {mtype!r}, expected clip "
                                  f"or siglip")
        try:
            model = AutoModel.from_pretrained(str(p), local_files_only=True, use_safetensors=True,
                                              dtype=dtype).to(device)
            tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
        except (OSError, ValueError) as e:
            raise ModelFilesError(f"--clip {str(path)!r}: could not be loaded ({e})") from None
        size = model.config.vision_config.image_size
        mean, std = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
        if mtype != "clip":
            mean, std = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
        pre = p / "preprocessor_config.json"
        if pre.is_file():
            cfg = json.loads(pre.read_text())
            mean, std = cfg.get("image_mean", mean), cfg.get("image_std", std)
        return cls(model, tok, size, mean, std)

    @torch.no_grad()
    def similarities(self, pixel_values: torch.Tensor, frame_spec, question: str) -> torch.Tensor:
        """Cosine similarity [T] of each frame to the question."""
        import torch.nn.functional as F
        dev = next(self.model.parameters()).device
        dt = next(self.model.parameters()).dtype
        m = torch.tensor(frame_spec.mean).view(1, 3, 1, 1)
        s = torch.tensor(frame_spec.std).view(1, 3, 1, 1)
        text = self.tokenizer([question], padding="max_length" if "siglip" in
                              self.model.config.model_type else True, truncation=True,
                              return_tensors="pt").to(dev)
        t = self.model.get_text_features(**text)
        t = getattr(t, "pooler_output", t)
        t = F.normalize(t.float(), dim=-1)
        sims = []
        for i in range(0, pixel_values.shape[0], self.batch):
            x = pixel_values[i:i + self.batch].float().cpu() * s + m   # back to [0, 1] RGB
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bicubic",
                              align_corners=False, antialias=True).clamp(0, 1)
            x = ((x - self.mean) / self.std).to(device=dev, dtype=dt)
            v = self.model.get_image_features(pixel_values=x)
            v = getattr(v, "pooler_output", v)
            sims.append(F.normalize(v.float(), dim=-1) @ t[0])
        return torch.cat(sims).cpu()

    def score(self, vr, inp: ScoringInput) -> FrameScores:
        sims = self.similarities(inp.pixel_values, vr.lm.frame_spec, inp.question).tolist()
        rel = topk_relevant(sims, inp.budget, vr.lm.grid, inp.windows)
        return FrameScores(rel, sims, self.name)


class TokenMatchedScorer(FrameScorer):
    """CLIP relevance pooling, token-matched to VideoRouter (the paper's Table 2: CLIP 7,936
    tokens beside VideoRouter's 7,748): per question the Image Router counts its relevant frames
    k, and ``inner`` (a :class:`CLIPScorer`) picks *which* k frames. So the plan differs from
    VideoRouter's Fragment plan only in the frames chosen, not in their number or tokens."""
    name = "clip-matched"
    needs_z = True          # the Image Router runs on Z to count k
    uses_routers = True

    def __init__(self, inner: "CLIPScorer", frame_batch: Optional[int] = None,
                 router_pool: Optional[int] = None, counter: Optional[FrameScorer] = None):
        self.inner = inner
        # what counts k: the Image Router (tests may give fixed decisions)
        self.router = counter if counter is not None else ImageRouterScorer(frame_batch,
                                                                            router_pool)

    def pool(self, vr) -> Optional[int]:
        return self.router.pool(vr)

    def score(self, vr, inp: ScoringInput) -> FrameScores:
        k = sum(self.router.score(vr, inp).relevant)
        sims = self.inner.similarities(inp.pixel_values, vr.lm.frame_spec, inp.question).tolist()
        return FrameScores(topk_of(sims, k), sims, self.name, router_pool=self.pool(vr))


__all__ = ["TokenMatchedScorer", "FrameScores", "ScoringInput", "FrameScorer", "ImageRouterScorer",
           "CachedImageRouterScorer", "FixedRelevance", "CLIPScorer"]
