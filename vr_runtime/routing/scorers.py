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

A scorer sees a :class:`ScoringInput` only -- the question (and its embeddings on demand), the
frames, Z, the routers, the patch grid, the budget and windows, the video's cache -- never the
runtime, and says what the report should note in :class:`FrameScores`.

Adding a scorer is one subclass plus one :func:`register_scorer` call (a name and a factory);
``videorouter ask``/``serve``/``eval`` then take ``--scorer NAME [--scorer-model DIR]``. An
instance can also be passed directly as ``AnswerOptions(scorer=...)``.
"""
from __future__ import annotations

import abc
import json
import pathlib
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from ..errors import ModelFilesError, expected_one_of
from ..planning.policies import Windows, relevant_from_probs, topk_of, topk_relevant


@dataclass
class FrameScores:
    relevant: List[bool]                 # the decision per frame
    scores: Optional[List[float]]        # what the decision came from (report), or None
    source: str                          # scorer name
    router_pool: Optional[int] = None    # window on Z_t before the Image Router, when it ran
    notes: List[str] = field(default_factory=list)   # for the report (e.g. untrained routers)


def image_router_notes(routers, uses_routers: bool, pool: Optional[int]) -> List[str]:
    """What the report says about an Image Router run: decisions from untrained weights, or a
    window on Z_t other than the one the routers were built with."""
    notes = []
    if uses_routers and not getattr(routers, "trained", False):
        notes.append("routers are untrained: the Image Router's frame scores come from "
                     "untrained weights")
    if pool is not None and pool != routers.config.router_pool:
        notes.append(f"router_pool={pool} differs from the pooling the routers were built with "
                     f"({routers.config.router_pool})")
    return notes


@dataclass
class ScoringInput:
    """What a scorer may read. ``Z`` is filled only for scorers with ``needs_z``, and
    ``pixel_values`` only for scorers with ``needs_pixels`` (the runtime streams frames through
    the vision tower and keeps no pixel otherwise)."""
    question: str                        # what the routers read (the bare question)
    pixel_values: Optional[torch.Tensor]  # [T, 3, H, W] normalised by ``frame_spec``
    Z: Optional[torch.Tensor]            # [T, H*W, D]
    budget: int                          # visual budget (for rank-based scorers)
    windows: Windows
    video_state: Optional[Dict[str, Any]] = None  # per-video cache (cache_visual), or None
    routers: Any = None                  # vr_runtime.routing.routers.Routers (Semantic + Image Router)
    grid: Tuple[int, int] = (16, 16)     # the backbone's patch grid of one frame
    frame_spec: Any = None               # the backbone's FrameSpec (size, mean, std)
    embed: Optional[Callable[[str], torch.Tensor]] = None   # text -> Emb(text) [L, D]
    num_frames: Optional[int] = None     # T (the routing units); default pixel_values' or Z's
    _emb: Optional[torch.Tensor] = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if self.num_frames is None:
            src = self.pixel_values if self.pixel_values is not None else self.Z
            self.num_frames = None if src is None else int(src.shape[0])

    def question_embeddings(self) -> torch.Tensor:
        """Emb(q) [Lq, D] of ``question``, what both routers read (computed once)."""
        if self._emb is None:
            self._emb = self.embed(self.question)
        return self._emb


class FrameScorer(abc.ABC):
    name: ClassVar[str] = ""
    needs_z: ClassVar[bool] = True       # the runtime encodes Z before scoring
    # the runtime keeps the frames' pixels for it (True unless a scorer says it reads none:
    # a scorer written before the frame stream may read them)
    needs_pixels: ClassVar[bool] = True
    uses_routers: ClassVar[bool] = True  # decisions come from the routers' weights

    @abc.abstractmethod
    def score(self, inp: ScoringInput) -> FrameScores:
        """Per-frame decisions (and scores, notes) for ``inp``."""

    def image_router_pool(self, routers) -> Optional[int]:
        """The window the Image Router runs at for this scorer (None: it runs no Image Router);
        the latency model counts its cost."""
        return None


class ImageRouterScorer(FrameScorer):
    """sigmoid(Image Router logit) > the routers' threshold, per frame."""
    name = "image-router"
    needs_pixels = False

    def __init__(self, frame_batch: Optional[int] = None, router_pool: Optional[int] = None):
        self.frame_batch = frame_batch
        self.router_pool = router_pool

    def probs(self, inp: ScoringInput) -> torch.Tensor:
        return inp.routers.frame_probs(inp.Z, inp.question_embeddings(), self.frame_batch,
                                       self.router_pool, inp.grid)

    def image_router_pool(self, routers) -> int:
        return routers.config.router_pool if self.router_pool is None else self.router_pool

    def score(self, inp: ScoringInput) -> FrameScores:
        probs = self.probs(inp).tolist()
        pool = self.image_router_pool(inp.routers)
        return FrameScores(relevant_from_probs(probs, inp.routers.config.threshold), probs,
                           self.name, router_pool=pool,
                           notes=image_router_notes(inp.routers, self.uses_routers, pool))


class CachedImageRouterScorer(ImageRouterScorer):
    """The Image Router with the shadow stack's state over each Z_t kept in the video's cache:
    Z_t comes before the question in a causal stack, so a new question only runs its own tokens."""
    name = "image-router-cached"

    def cache_key(self, inp: ScoringInput) -> tuple:
        """Where the video's cache keeps this Image Router's state (one per routers and pool)."""
        return ("router-cache", id(inp.routers), self.image_router_pool(inp.routers))

    def probs(self, inp: ScoringInput) -> torch.Tensor:
        state = inp.video_state if inp.video_state is not None else {}
        pool = self.image_router_pool(inp.routers)
        key = self.cache_key(inp)
        cache = state.get(key)
        if cache is None:
            cache = state[key] = inp.routers.visual_cache(inp.Z, self.frame_batch, pool, inp.grid)
        q = inp.question_embeddings()
        return torch.sigmoid(inp.routers.frame_logits_cached(cache, q).float())


class FixedRelevance(FrameScorer):
    """Given decisions. With ``run_routers`` the real Semantic and Image Routers still run (and
    are timed) and their outputs are discarded: the benchmark's stand-in for trained routers,
    so router cost stays in TTFT while the decisions are controlled. ``frame_batch`` and
    ``router_pool`` reach the Image Router exactly as :class:`ImageRouterScorer`'s do, so the
    cost measured is the cost of the configuration asked for (the report names the pool)."""
    name = "fixed"
    needs_pixels = False

    def __init__(self, relevant: Sequence[bool], run_routers: bool = False,
                 frame_batch: Optional[int] = None, router_pool: Optional[int] = None):
        self.relevant = [bool(r) for r in relevant]
        self.run_routers = run_routers
        self.uses_routers = False
        self.needs_z = run_routers
        self.frame_batch = frame_batch
        self.router_pool = router_pool

    def image_router_pool(self, routers) -> Optional[int]:
        """The window the Image Router runs at (None: the routers do not run)."""
        if not self.run_routers:
            return None
        return routers.config.router_pool if self.router_pool is None else self.router_pool

    def score(self, inp: ScoringInput) -> FrameScores:
        T = inp.num_frames
        if len(self.relevant) != T:
            raise ValueError(f"relevant: expected {T} entries (one per sampled frame), got "
                             f"{len(self.relevant)}")
        if self.run_routers:
            q = inp.question_embeddings()
            inp.routers.policy_logits(q[None])
            inp.routers.frame_probs(inp.Z, q, self.frame_batch, self.router_pool, inp.grid)
        pool = self.image_router_pool(inp.routers)
        return FrameScores(list(self.relevant), None, self.name, router_pool=pool,
                           notes=image_router_notes(inp.routers, self.uses_routers, pool))


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

    @staticmethod
    def check_dir(path, flag: str = "--clip") -> str:
        """A cheap check of a CLIP/SigLIP directory (its config.json) -> its model_type;
        ``ModelFilesError`` naming ``flag`` otherwise. Nothing is loaded."""
        p = pathlib.Path(path)
        if not (p / "config.json").is_file():
            raise ModelFilesError(f"{flag} {str(path)!r}: not a CLIP/SigLIP directory "
                                  f"(no config.json); pass a local CLIPModel or SiglipModel")
        try:
            mtype = json.loads((p / "config.json").read_text()).get("model_type")
        except (OSError, json.JSONDecodeError) as e:
            raise ModelFilesError(f"{flag} {str(path)!r}: unreadable config.json ({e})") from None
        if mtype not in ("clip", "siglip", "siglip2"):
            raise ModelFilesError(f"{flag} {str(path)!r}: model_type {mtype!r}, expected clip "
                                  f"or siglip")
        return mtype

    @classmethod
    def from_pretrained(cls, path, device="cpu", dtype=torch.float32,
                        flag: str = "--clip") -> "CLIPScorer":
        """A local CLIP/SigLIP directory (config.json, safetensors, tokenizer); nothing is
        downloaded. Image size and mean/std come from its preprocessor config when present."""
        from transformers import AutoModel, AutoTokenizer
        p = pathlib.Path(path)
        mtype = cls.check_dir(path, flag)
        try:
            model = AutoModel.from_pretrained(str(p), local_files_only=True, use_safetensors=True,
                                              dtype=dtype).to(device)
            tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
        except (OSError, ValueError) as e:
            raise ModelFilesError(f"{flag} {str(path)!r}: could not be loaded ({e})") from None
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
        """Cosine similarity [T] of each frame to the question. Units of k frames ([T, 3k, H, W],
        ``Backbone.units``: Qwen3-VL's temporal patches) score as their most similar frame, as a
        unit is relevant when one of its frames is."""
        k = pixel_values.shape[1] // 3
        if k > 1:
            U = pixel_values.shape[0]
            frames = pixel_values.reshape(U * k, 3, *pixel_values.shape[-2:])
            return self.similarities(frames, frame_spec, question).view(U, k).max(1).values
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

    def score(self, inp: ScoringInput) -> FrameScores:
        sims = self.similarities(inp.pixel_values, inp.frame_spec, inp.question).tolist()
        rel = topk_relevant(sims, inp.budget, inp.grid, inp.windows)
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

    def image_router_pool(self, routers) -> Optional[int]:
        return self.router.image_router_pool(routers)

    def score(self, inp: ScoringInput) -> FrameScores:
        k = sum(self.router.score(inp).relevant)
        sims = self.inner.similarities(inp.pixel_values, inp.frame_spec, inp.question).tolist()
        pool = self.image_router_pool(inp.routers)
        return FrameScores(topk_of(sims, k), sims, self.name, router_pool=pool,
                           notes=image_router_notes(inp.routers, self.uses_routers, pool))


# ---------------------------------------------------------------------- scorers by name
@dataclass(frozen=True)
class ScorerEntry:
    """A registered scorer: ``factory(model_dir, **settings) -> FrameScorer`` (None: the
    runtime's own Image Router). ``settings``: ``device``, ``dtype``, ``cache_visual``; a
    factory takes what it needs and ignores the rest (``**kw``)."""
    name: str
    factory: Callable[..., Optional[FrameScorer]]
    needs_model: bool = False            # --scorer-model DIR is required
    check: Optional[Callable[[str], None]] = None   # a cheap check of DIR, before any load
    description: str = ""


SCORERS: Dict[str, ScorerEntry] = {}
DEFAULT_SCORER = "image-router"


def register_scorer(name: str, factory: Callable[..., Optional[FrameScorer]], *,
                    needs_model: bool = False, check: Optional[Callable[[str], None]] = None,
                    description: str = "") -> ScorerEntry:
    """Make a scorer selectable as ``--scorer NAME`` (``videorouter ask``/``serve``/``eval``)."""
    if name in SCORERS:
        raise ValueError(f"scorer {name!r} is already registered")
    SCORERS[name] = entry = ScorerEntry(name, factory, needs_model, check, description)
    return entry


def scorer_names() -> List[str]:
    return list(SCORERS)


def get_scorer(name: str) -> ScorerEntry:
    entry = SCORERS.get(name)
    if entry is None:
        raise ValueError(f"--scorer {name!r}: {expected_one_of(name, SCORERS)}")
    return entry


def check_scorer(name: str, model_dir: Optional[str]) -> ScorerEntry:
    """Everything about ``--scorer NAME --scorer-model DIR`` that can be checked before any
    model loads (one line each)."""
    entry = get_scorer(name)
    if model_dir is None and entry.needs_model:
        raise ValueError(f"--scorer {name}: needs --scorer-model DIR (its model directory)")
    if model_dir is not None and not entry.needs_model:
        raise ValueError(f"--scorer-model: scorer {name!r} loads no model; drop --scorer-model "
                         f"or pick a scorer that needs one")
    if model_dir is not None and entry.check is not None:
        entry.check(model_dir)
    return entry


def build_scorer(name: str, model_dir: Optional[str] = None, **settings) -> Optional[FrameScorer]:
    """The scorer ``--scorer NAME --scorer-model DIR`` names, loaded (None: the runtime's
    default Image Router)."""
    entry = check_scorer(name, model_dir)
    return entry.factory(model_dir, **settings)


def _check_clip_dir(path) -> None:
    CLIPScorer.check_dir(path, "--scorer-model")


def _clip(model_dir, device="cpu", **_):
    return TokenMatchedScorer(CLIPScorer.from_pretrained(model_dir, device=device,
                                                         flag="--scorer-model"))


def _clip_fill(model_dir, device="cpu", **_):
    return CLIPScorer.from_pretrained(model_dir, device=device, flag="--scorer-model")


register_scorer(DEFAULT_SCORER, lambda model_dir, **_: None,
                description="the paper's Image Router over [Z_t; Emb(q)] (cached across "
                            "questions on one video with a visual cache)")
register_scorer("clip", _clip, needs_model=True, check=_check_clip_dir,
                description="CLIP relevance pooling, token-matched (paper Appendix D): the "
                            "Image Router counts k relevant frames, CLIP picks which k")
register_scorer("clip-fill", _clip_fill, needs_model=True, check=_check_clip_dir,
                description="CLIP top frames at s1 until the budget is full (not token-matched)")

__all__ = ["TokenMatchedScorer", "FrameScores", "ScoringInput", "FrameScorer", "ImageRouterScorer",
           "CachedImageRouterScorer", "FixedRelevance", "CLIPScorer", "ScorerEntry", "SCORERS",
           "DEFAULT_SCORER", "register_scorer", "scorer_names", "get_scorer", "check_scorer",
           "build_scorer", "image_router_notes"]
