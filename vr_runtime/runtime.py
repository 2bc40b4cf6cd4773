"""VideoRouter: the inference path of the paper (Sections 3.1-3.2, Algorithm 1) over a backbone.

``answer`` is a list of stages with small typed results between them::

    request   check every argument (and the budget: it depends only on the question and T)
    decode    sample + preprocess T frames -> Frames   (not part of TTFT, as in the paper)
    policy    the Semantic Router on the question (``auto``) -> PolicyDecision
    vision    frozen vision tower + projector -> Z [T, H*W, D]
    score     a FrameScorer (Image Router, cached, fixed, CLIP) -> FrameScores
    plan      the policy's planner, fitted exactly into max_length -> FittedPlan
    compress  the prompt with per-frame placeholder counts, pool_pack into inputs_embeds
    prefill   one decoder pass (last-row logits, KV cache)       TTFT = vision + router +
    generate  greedy decoding with the cache                            compress + prefill
    report    report.build_report

When the plan does not depend on Z (every policy but ``fragment``), it is made before the vision
stage and only the frames it keeps are encoded. Everything specific to a model family (frame
spec, vision, prompt layout, positions, decoder) is behind ``self.lm``, a
:class:`~vr_runtime.backbones.Backbone`.

Untrained routers (no weights given, none shipped): ``auto`` does not pretend to route -- it falls
back to :data:`~vr_runtime.policies.UNTRAINED_AUTO_POLICY` and the report says so.
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import pathlib
from dataclasses import dataclass, field
from typing import List, Mapping, Optional, Sequence

import torch

from vr_kernels import pooled_counts

from . import budget as B
from .backbones import Backbone, backbone_from_config, load_backbone
from .backbones.base import output_cache
from .decode import GreedyDecoder
from .policies import (AUTO, SEMANTIC_CLASSES, UNTRAINED_AUTO_POLICY, FittedPlan, Windows,
                       get_planner, is_budgeted, kept_frames, plan_fitted, policy_from_logits,
                       policy_names)
from .reconstruct import reconstruct_embeds
from .report import build_report
from .routers import RouterConfig, Routers, embed_question
from .scorers import (CachedImageRouterScorer, FixedRelevance, FrameScorer, FrameScores,
                      ImageRouterScorer, ScoringInput)
from .timing import StageTimer

POLICIES = policy_names()  # the built-in ones; register_planner adds more at run time


@dataclass
class Answer:
    text: str
    report: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Request:
    """One checked call of :meth:`VideoRouter.answer`."""
    video: object
    question: str
    num_frames: int
    max_length: int
    max_new_tokens: int
    policy: str
    time_window: Optional[tuple]
    scorer: Optional[FrameScorer]
    windows: Windows
    margin: int
    budget: Optional[int]          # a fixed visual budget B_img (controlled protocol), or None
    chunk_size: int
    system: Optional[str]
    cache_visual: bool
    route_to: Mapping[str, str]    # Semantic Router class -> planner
    decoder: str                   # video decoding library (vr_runtime.decoders)
    ttft_budget_s: Optional[float]  # latency-budgeted routing (vr_runtime.latency), or None
    router_question: str = ""      # what the routers and scorers read ("" -> ``question``)

    @property
    def routed_question(self) -> str:
        return self.router_question or self.question


@dataclass
class Frames:
    pixel_values: torch.Tensor     # [T, 3, H, W]
    indices: List[int]
    times_s: Optional[List[float]]
    notes: List[str]
    decode_s: Optional[float]
    decoder: Optional[str] = None  # which library decoded the file, and its codec
    codec: Optional[str] = None

    @property
    def T(self) -> int:
        return int(self.pixel_values.shape[0])


@dataclass
class _Prepared:
    """One request after every stage before the prefill (``answer`` / ``answer_batch``)."""
    req: Request
    timer: StageTimer
    frames: Frames
    decision: "PolicyDecision"
    planner: object
    scores: Optional[FrameScores]
    fitted: FittedPlan
    ids: torch.Tensor
    embeds: Optional[torch.Tensor]
    position_ids: Optional[torch.Tensor]
    notes: list
    hit: bool


@dataclass(frozen=True)
class PolicyDecision:
    policy: str                    # the planner that runs
    probability: Optional[float]   # the Semantic Router's confidence, when it decided
    notes: tuple = ()


class VideoRouter:
    def __init__(self, lm: Backbone, routers: Optional[Routers] = None,
                 visual_cache_size: int = 1, warmup_frames: int = 256, decoding: str = "auto"):
        """``decoding``: how tokens after the first are generated (vr_runtime.decode): "auto"
        (the eager dynamic cache; "graph", CUDA graphs over a static KV cache, is opt-in until
        measured on a GPU), "dynamic", "static" or "graph" -- the same greedy tokens in every mode."""
        self.lm = lm
        self.greedy = GreedyDecoder(lm, decoding)   # checks ``decoding`` before any warm-up
        # Compile and autotune the pool_pack kernels now (CUDA; a no-op on CPU), for up to
        # ``warmup_frames`` frames, so that no request pays for compilation (0: skip).
        import vr_kernels
        self.kernel_warmup = vr_kernels.warmup(lm.hidden_size, lm.dtype, lm.device, lm.grid,
                                               max_frames=warmup_frames) if warmup_frames else \
            {"skipped": "warmup_frames=0"}
        self.routers = routers if routers is not None else Routers.from_backbone(lm)
        self.routers.eval()
        self._stop_ids = lm.stop_token_ids()
        # cache_visual: question-independent state of the last videos (LRU).
        self.visual_cache_size = int(visual_cache_size)
        self._vcache: "collections.OrderedDict[tuple, dict]" = collections.OrderedDict()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(cls, path_or_name="tiny", routers=None, device="cpu", dtype=None,
                        attn_implementation=None, router_config: Optional[RouterConfig] = None,
                        **kw):
        """``path_or_name``: a local InternVL3-*-hf / Qwen2.5-VL-*-Instruct directory or a preset
        (``tiny``, ``tiny-qwen2.5-vl``). ``routers``: a safetensors path, a :class:`Routers`, or
        None; for ``"tiny"`` with None the shipped ``assets/tiny/routers.safetensors`` loads."""
        lm = load_backbone(path_or_name, device=device, dtype=dtype,
                           attn_implementation=attn_implementation)
        if routers is None and str(path_or_name) == "tiny":
            from .tiny import ASSETS
            shipped = ASSETS / "routers.safetensors"
            if shipped.is_file():
                routers = shipped
        return cls(lm, cls._routers_for(lm, routers, router_config), **kw)

    @classmethod
    def from_config(cls, config, device="cpu", dtype=None, seed: int = 0, routers=None,
                    attn_implementation=None, router_config: Optional[RouterConfig] = None, **kw):
        """Random weights of a shape preset (``vr_runtime.backbones.backbone_from_config``)."""
        lm = backbone_from_config(config, device=device, dtype=dtype, seed=seed,
                                  attn_implementation=attn_implementation)
        return cls(lm, cls._routers_for(lm, routers, router_config), **kw)

    @staticmethod
    def _routers_for(lm, routers, router_config):
        if isinstance(routers, Routers):
            routers.positions = lm.router_position_ids
            return routers.to_model(lm.device, lm.dtype)
        if routers is not None:
            return Routers.load(pathlib.Path(routers), lm)  # built on the model's device/dtype
        return Routers.from_backbone(lm, router_config)

    @property
    def routers_trained(self) -> bool:
        return bool(getattr(self.routers, "trained", False))

    def clear_visual_cache(self) -> None:
        self._vcache.clear()

    def question_embeddings(self, question: str) -> torch.Tensor:
        """Emb(q) [Lq, D]: what both routers read (the bare question, no prompt around it)."""
        return embed_question(self.lm.model, self.lm.tokenizer, question)

    # ------------------------------------------------------------------ stage: request
    def request(self, video, question, num_frames=64, max_length=12288, max_new_tokens=64,
                policy="auto", time_window=None, relevant=None, scorer=None, high=1, low=4,
                global_scale=2, margin=100, budget=None, chunk_size=16, frame_batch=None,
                system=None, router_pool=None, cache_visual=False, route_to=None,
                decoder="auto", ttft_budget_s=None, router_question=None) -> Request:
        """Check the arguments of :meth:`answer` (before any decoding) -> :class:`Request`."""
        if policy not in policy_names():
            from .errors import did_you_mean
            raise ValueError(f"policy {policy!r}: expected one of {', '.join(policy_names())}"
                             f"{did_you_mean(policy, policy_names())}")
        if not isinstance(question, str) or not question.strip():
            raise ValueError("question: empty; ask a non-empty question about the video")
        for name, v, lo in (("num_frames", num_frames, 1), ("max_length", max_length, 1),
                            ("max_new_tokens", max_new_tokens, 0), ("margin", margin, 0),
                            ("chunk_size", chunk_size, 1)):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"{name}: expected an int >= {lo}, got {v!r}")
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool)
                                   or budget < 1):
            raise ValueError(f"budget: expected a visual-token budget >= 1 or None, got {budget!r}")
        if relevant is not None and scorer is not None:
            raise ValueError("relevant and scorer: give one of them (relevant= is a fixed scorer)")
        if scorer is not None and (router_pool is not None or frame_batch is not None):
            raise ValueError("router_pool/frame_batch: configure the Image Router of the default "
                             "scorer; with scorer= set them on the scorer itself (e.g. "
                             "FixedRelevance(..., run_routers=True, router_pool=2))")
        if relevant is not None:
            scorer = FixedRelevance(relevant)
        elif scorer is None:
            cls = CachedImageRouterScorer if cache_visual else ImageRouterScorer
            scorer = cls(frame_batch=frame_batch, router_pool=router_pool)
        elif not isinstance(scorer, FrameScorer):
            raise ValueError(f"scorer: expected a vr_runtime.scorers.FrameScorer, got "
                             f"{type(scorer).__name__}")
        routes = dict(zip(SEMANTIC_CLASSES, SEMANTIC_CLASSES))
        routes.update(route_to or {})
        for cls_name, target in routes.items():
            if cls_name not in SEMANTIC_CLASSES:
                raise ValueError(f"route_to: keys are Semantic Router classes {SEMANTIC_CLASSES}, "
                                 f"got {cls_name!r}")
            get_planner(target)
        if router_question is not None and (not isinstance(router_question, str)
                                            or not router_question.strip()):
            raise ValueError("router_question: expected a non-empty string or None (None: the "
                             "routers read the question itself)")
        if time_window is not None:
            time_window = tuple(time_window)
        if ttft_budget_s is not None:
            if isinstance(ttft_budget_s, bool) or not isinstance(ttft_budget_s, (int, float)) \
                    or not ttft_budget_s > 0:
                raise ValueError(f"ttft_budget_s: expected seconds > 0, got {ttft_budget_s!r}")
            if not is_budgeted(policy, routes) or budget is not None:
                raise ValueError(f"ttft_budget_s: chooses the visual budget, so it does not go "
                                 f"with policy {policy!r} (no budget) or a fixed budget=")
        return Request(video, question, num_frames, max_length, max_new_tokens, policy,
                       time_window, scorer, Windows(high, low, global_scale), margin, budget,
                       chunk_size, system, bool(cache_visual), routes, decoder,
                       None if ttft_budget_s is None else float(ttft_budget_s),
                       router_question or "")

    def check_budget(self, req: Request, num_frames: int) -> None:
        """The budget depends only on the question and the frame count: refuse a hopeless one
        before decoding (``BudgetError``: one frame's line + one frame at the coarse window must
        fit ``max_length`` with the generation and the margin)."""
        if not is_budgeted(req.policy, req.route_to) or req.budget is not None or num_frames < 1:
            return
        n_text = self.lm.text_tokens(req.question, num_frames, req.system, kept=[0])
        B.visual_budget(req.max_length, n_text, req.max_new_tokens, req.margin, grid=self.lm.grid,
                        coarsest=req.windows.low)

    # ------------------------------------------------------------------ stage: decode
    @staticmethod
    def _video_key(video, num_frames, time_window, decoder="auto") -> tuple:
        """Identity of a video input for ``cache_visual``. Paths: file identity + sampling
        arguments. Tensors and clips: the object itself (held by the cache, so its id cannot be
        reused) and, for tensors, its in-place version counter."""
        if isinstance(video, (str, pathlib.Path)):
            p = pathlib.Path(video).resolve()
            try:
                st = p.stat()
                ident = (st.st_mtime_ns, st.st_size)
            except OSError:
                ident = None
            tw = tuple(time_window) if time_window is not None else None
            return ("path", str(p), ident, int(num_frames), tw, decoder)
        if isinstance(video, torch.Tensor):
            return ("tensor", id(video), video._version, tuple(video.shape))
        return ("clip", id(video))

    def video_state(self, req: Request) -> Optional[dict]:
        """The cached per-video state for ``cache_visual`` (a dict, ``{}`` on a miss), or None."""
        if not req.cache_visual:
            return None
        key = self._video_key(req.video, req.num_frames, req.time_window, req.decoder)
        obj = None if key[0] == "path" else req.video
        st = self._vcache.get(key)
        if st is not None and st["obj"] is obj:
            self._vcache.move_to_end(key)
            st["hit"] = True
            return st
        st = {"key": key, "obj": obj, "hit": False}
        self._vcache[key] = st
        while len(self._vcache) > max(self.visual_cache_size, 1):
            self._vcache.popitem(last=False)
        return st

    def decode(self, req: Request, timer: StageTimer, state: Optional[dict] = None) -> Frames:
        if state is not None and "frames" in state:
            f = state["frames"]
            return Frames(f.pixel_values, f.indices, f.times_s, list(f.notes), None, f.decoder,
                          f.codec)
        with timer.stage("decode"):
            frames = self._decode(req.video, req.num_frames, req.time_window, req.decoder)
        spec = self.lm.frame_spec
        if tuple(frames.pixel_values.shape[-2:]) != tuple(spec.size):
            raise ValueError(f"video: frames are {tuple(frames.pixel_values.shape[-2:])}, the "
                             f"model expects {tuple(spec.size)}")
        if frames.T == 0:
            raise ValueError("video: no frames to answer from")
        if isinstance(req.video, torch.Tensor) and frames.T != req.num_frames:
            frames.notes.append(f"{frames.T} frames were given as a tensor; "
                                f"num_frames={req.num_frames} was not applied")
        if state is not None:
            state["frames"] = frames
        return frames

    def _decode(self, video, num_frames, time_window, decoder="auto") -> Frames:
        from .errors import VideoError
        if isinstance(video, torch.Tensor):
            if video.ndim != 4 or video.shape[1] != 3:
                raise ValueError(f"video: a tensor must be [T, 3, H, W] frames, got {tuple(video.shape)}")
            if time_window is not None:
                raise ValueError("time_window: only applies to a video file, not to a frame tensor")
            return Frames(video, list(range(video.shape[0])), None, [], None)
        spec = self.lm.frame_spec
        if isinstance(video, (str, pathlib.Path)):
            from .video import load_video
            clip = load_video(str(video), num_frames=num_frames, time_window=time_window,
                              size=spec.size[0], mean=spec.mean, std=spec.std, decoder=decoder)
        elif isinstance(video, cf.Future):  # from vr_runtime.video.prefetch_video
            clip = video.result()
        elif hasattr(video, "pixel_values") and hasattr(video, "frame_indices"):
            clip = video
        else:
            raise VideoError(f"video: expected a path, a VideoClip, a Future of one or a "
                             f"[T,3,H,W] tensor, got {type(video).__name__}")
        notes = [clip.note] if getattr(clip, "note", None) else []
        return Frames(clip.pixel_values, list(clip.frame_indices), list(clip.timestamps_s), notes,
                      getattr(clip, "decode_s", None), getattr(clip, "decoder", None),
                      getattr(clip, "codec", None))

    # ------------------------------------------------------------------ stage: policy
    def decide_policy(self, req: Request, timer: StageTimer) -> PolicyDecision:
        """``auto``: the Semantic Router's class, routed through ``req.route_to``."""
        if req.policy != AUTO:
            return PolicyDecision(req.policy, None)
        if not self.routers_trained:
            return PolicyDecision(req.route_to[UNTRAINED_AUTO_POLICY], None, (
                f"routers are untrained: policy 'auto' fell back to '{UNTRAINED_AUTO_POLICY}' "
                f"(pass trained router weights or an explicit --policy)",))
        with timer.stage("router"):
            q = self.question_embeddings(req.routed_question)
            cls, prob = policy_from_logits(self.routers.policy_logits(q[None])[0])
        return PolicyDecision(req.route_to[cls], prob)

    # ------------------------------------------------------------------ stage: vision
    def encode(self, frames: Frames, req: Request, timer: StageTimer, state: Optional[dict],
               keep: Optional[Sequence[int]] = None) -> torch.Tensor:
        """Z of the ``keep`` frames (all when None). With a video cache, Z of every frame is
        computed once and kept (a later question may keep other frames)."""
        if state is not None:
            if "Z" not in state:
                with timer.stage("vision"):
                    state["Z"] = self.lm.encode_frames(frames.pixel_values, req.chunk_size)
            else:
                timer.add("vision", 0.0)
            Z = state["Z"]
            return Z if keep is None else Z[list(keep)]
        pv = frames.pixel_values if keep is None else frames.pixel_values[list(keep)]
        with timer.stage("vision"):
            return self.lm.encode_frames(pv, req.chunk_size) if pv.shape[0] else None

    # ------------------------------------------------------------------ stage: score
    def score_frames(self, req: Request, frames: Frames, Z, timer: StageTimer,
                     state: Optional[dict], budget: int) -> FrameScores:
        inp = ScoringInput(req.routed_question, frames.pixel_values, Z, budget, req.windows, state)
        with timer.stage("router"):
            return req.scorer.score(self, inp)

    # ------------------------------------------------------------------ stage: plan
    def plan(self, req: Request, policy: str, T: int,
             relevant: Optional[Sequence[bool]] = None) -> FittedPlan:
        """Windows per frame for ``policy``, fitted exactly: the plan plus the prompt text it
        implies fits ``max_length - max_new_tokens - margin`` (a fixed ``req.budget`` instead
        bounds the visual tokens alone, as in the paper's controlled protocol)."""
        planner = get_planner(policy)
        grid, w = self.lm.grid, req.windows

        def text_for(kept):
            return self.lm.text_tokens(req.question, T, req.system, kept=kept)

        fitted = plan_fitted(planner, T, grid, relevant, w, text_for, req.max_length,
                             req.max_new_tokens, req.margin, budget=req.budget)
        if req.ttft_budget_s is not None and planner.budgeted:
            fitted = self._fit_latency(req, planner, T, relevant, fitted, text_for)
        if sum(pooled_counts(fitted.plan, grid)) == 0:
            raise B.BudgetError(f"visual budget {fitted.budget} holds no frame under policy "
                                f"{policy!r}; raise max_length or lower max_new_tokens")
        return fitted

    # ------------------------------------------------------------------ latency budget
    def latency_model(self):
        """The cost model of this backbone on this device, corrected by this process's
        measurements (``vr_runtime.latency``); built (CPU: calibrated) on first use."""
        if getattr(self, "_latency", None) is None:
            from .latency import LatencyModel
            model = LatencyModel.for_backbone(self.lm)
            model.probe(self)
            self._latency = model
        return self._latency

    def _latency_request(self, req: Request, planner, T: int):
        """-> ``inputs(plan)``: the cost model's inputs for one plan of this request. What does
        not depend on the plan (the prompt's text, the question's length) is counted once."""
        pool = self._scorer_pool(req.scorer)   # None: the scorer runs no Image Router
        fixed = dict(text_tokens=self.lm.text_tokens(req.question, T, req.system),
                     routers=planner.needs_relevance and (req.scorer.uses_routers
                                                          or pool is not None),
                     router_layers=self.routers.config.num_layers,
                     router_pool=self.routers.config.router_pool if pool is None else pool,
                     question_tokens=int(self.question_embeddings(req.routed_question).shape[0]))
        grid = self.lm.grid

        def inputs(plan: Sequence) -> dict:
            kept = len(kept_frames(plan, grid))
            # plan-first policies encode only the frames they keep
            return dict(fixed, visual_tokens=sum(pooled_counts(plan, grid)), kept_frames=kept,
                        num_frames=T if planner.needs_relevance else kept)
        return inputs

    def _fit_latency(self, req: Request, planner, T: int, relevant, fitted: FittedPlan,
                     text_for) -> FittedPlan:
        """The largest visual budget (at most the context's) whose predicted TTFT fits."""
        from .latency import largest_fitting_budget
        model = self.latency_model()
        grid, w = self.lm.grid, req.windows
        inputs = self._latency_request(req, planner, T)

        def plan_for(budget: int):
            try:
                plan = planner.plan(T, budget, grid, relevant, w)
            except B.BudgetError:
                return None
            return plan if sum(pooled_counts(plan, grid)) else None

        def predicted(budget: int) -> float:
            plan = plan_for(budget)
            if plan is None:
                return float("inf")
            return sum(model.predict(**inputs(plan)).values())

        # The smallest budget that holds a frame at one of the policy's windows.
        sizes = sorted(B.window_tokens(x, grid) for x in (w.low, w.global_scale, w.high, 1))
        lo = next((b for b in sizes if plan_for(b) is not None), fitted.budget)
        best = largest_fitting_budget(predicted, lo, max(fitted.budget, lo), req.ttft_budget_s)
        chosen = lo if best is None else best
        notes = () if best is not None else (
            f"ttft_budget_s {req.ttft_budget_s:g}: even the smallest plan is predicted at "
            f"{predicted(lo):.3f} s (the vision tower and routers see every frame); it was used",)
        plan = planner.plan(T, chosen, grid, relevant, w)
        return FittedPlan(plan, chosen, text_for(kept_frames(plan, grid)), notes)

    def _latency_report(self, req: Request, planner, T: int, fitted: FittedPlan,
                        timer: StageTimer, observe: bool = True) -> dict:
        model = self.latency_model()
        inputs = self._latency_request(req, planner, T)(fitted.plan)
        raw = model.raw(**inputs)
        pred = model.predict(**inputs)
        if observe:   # a batch's shared prefill is not one request's: it would mislead the model
            model.observe(raw, timer.times)   # corrects the next prediction
        return {"ttft_budget_s": req.ttft_budget_s,
                "ttft_predicted_s": round(sum(pred.values()), 6),
                "ttft_predicted_stages_s": {k: round(v, 6) for k, v in pred.items()},
                "ttft_model_device": model.device.name}

    def _scorer_pool(self, scorer) -> Optional[int]:
        """The window the Image Router runs at for ``scorer`` (None: it runs no Image Router)."""
        pool = getattr(scorer, "pool", None)
        return pool(self) if callable(pool) else None

    def _scoring_budget(self, req: Request, T: int) -> int:
        """The budget a rank-based scorer plans for: the fixed one, or the one with every
        frame's line counted (safe for any plan)."""
        if req.budget is not None:
            return req.budget
        n_text = self.lm.text_tokens(req.question, T, req.system)
        return max(req.max_length - n_text - req.max_new_tokens - req.margin, 0)

    # ------------------------------------------------------------------ stage: compress
    def compress(self, req: Request, plan: Sequence, Z: torch.Tensor, keep: Sequence[int],
                 timer: StageTimer):
        """Prompt ids with per-frame placeholder counts; the kept frames of Z pooled straight
        into their rows of inputs_embeds. -> (ids [L], embeds [1, L, D], position_ids or None)."""
        lm = self.lm
        with timer.stage("compress"):
            counts = pooled_counts(plan, lm.grid)
            ids, starts = lm.build_prompt(req.question, counts, req.system)
            kept_plan = [plan[t] for t in keep]
            embeds = reconstruct_embeds(lm.model, ids, Z, kept_plan, lm.image_token_id, lm.grid,
                                        frame_starts=starts)
            pos = lm.position_ids(ids, kept_plan, starts)
        return ids, embeds, pos

    # ------------------------------------------------------------------ stage: generate
    @torch.inference_mode()
    def generate(self, embeds: torch.Tensor, max_new_tokens: int,
                 timer: Optional[StageTimer] = None,
                 position_ids: Optional[torch.Tensor] = None, on_token=None) -> List[int]:
        """Prefill ``embeds`` [1, L, D] (logits of the last row only, KV cache on), then greedy
        decoding with the cache until a stop id or ``max_new_tokens`` (``self.greedy``: dynamic,
        static or graph-captured steps, the same tokens). Returns the new ids (the stop id
        excluded). Stages "prefill" and "generate" go to ``timer``. ``on_token(id)``: called
        with each new id as it is decided (streaming)."""
        each = None if on_token is None else (lambda row, i: on_token(i))
        return self.greedy.generate([embeds], [max_new_tokens], [position_ids], self._stop_ids,
                                    timer, each)[0]

    # ------------------------------------------------------------------ option scoring
    @torch.inference_mode()
    def option_logprobs(self, Z: torch.Tensor, prompt: str, plans: Sequence[Sequence],
                        continuations: Sequence[Sequence[int]], system: Optional[str] = None,
                        batch_size: int = 8) -> torch.Tensor:
        """log p(continuation | video under plan, prompt) -> float32 [len(plans),
        len(continuations)] on the CPU: the sum of each continuation's token log-probabilities.

        ``Z`` [T, H*W, D] is every sampled frame encoded once (``lm.encode_frames``); each plan
        has one window per frame (0 = dropped), fixed by the caller (no planner, no budget).
        The prompt and its pooled frames are built exactly as :meth:`answer` builds them
        (``lm.build_prompt``, ``reconstruct_embeds``, ``lm.position_ids``). Prompts of equal
        length are prefilled together, up to ``batch_size`` plans per decoder pass; a
        one-token continuation (an option letter) is read off the prefill's last row, longer
        ones continue from its KV cache, repeated once per continuation (memory: batch_size x
        len(continuations) caches -- lower ``batch_size`` for long prompts on large models)."""
        lm = self.lm
        T = int(Z.shape[0]) if Z is not None and Z.ndim == 3 else -1
        if T < 1:
            raise ValueError(f"Z: expected [T, N, D] encoded frames, got "
                             f"{None if Z is None else tuple(Z.shape)}")
        if not continuations or any(len(c) < 1 for c in continuations):
            raise ValueError("continuations: expected one or more non-empty token-id lists")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: expected an int >= 1, got {batch_size!r}")
        prompts = []
        for i, plan in enumerate(plans):
            if len(plan) != T:
                raise ValueError(f"plans[{i}]: {len(plan)} windows for {T} frames")
            ids, starts = lm.build_prompt(prompt, pooled_counts(list(plan), lm.grid), system)
            prompts.append((i, list(plan), ids, starts))
        by_length: dict = {}
        for p in prompts:
            by_length.setdefault(p[2].numel(), []).append(p)
        out = torch.empty(len(prompts), len(continuations), dtype=torch.float32)
        for group in by_length.values():
            for k in range(0, len(group), batch_size):
                chunk = group[k:k + batch_size]
                out[[p[0] for p in chunk]] = self._score_chunk(Z, chunk, continuations)
        return out

    def _score_chunk(self, Z, chunk, continuations) -> torch.Tensor:
        """Equal-length prompts (one decoder batch) -> [len(chunk), len(continuations)]."""
        lm = self.lm
        embeds, positions = [], []
        for _, plan, ids, starts in chunk:
            kept_plan = [w for w in plan if pooled_counts([w], lm.grid)[0] > 0]
            if kept_plan:
                embeds.append(reconstruct_embeds(lm.model, ids, Z, plan, lm.image_token_id,
                                                 lm.grid, frame_starts=starts))
            else:   # every frame dropped: the text alone
                embeds.append(lm.embed_tokens(ids.to(lm.device))[None])
            positions.append(lm.position_ids(ids, kept_plan, starts))
        L = chunk[0][2].numel()
        pos = None if positions[0] is None else torch.cat(positions, 1)
        res = lm.forward(inputs_embeds=torch.cat(embeds, 0), position_ids=pos, logits_to_keep=1)
        first = torch.log_softmax(res.logits[:, -1].float(), -1)              # [b, V]
        C = len(continuations)
        score = first[:, [int(c[0]) for c in continuations]].clone()           # [b, C]
        n = max(len(c) for c in continuations) - 1
        if n == 0:
            return score.cpu()
        cache = output_cache(res)
        cache.batch_repeat_interleave(C)
        # Step j reads token j and predicts token j + 1. Continuations are right-padded with
        # their own last token: causal, so padding after a token never changes its logits.
        def padded(c, shift):
            return [int(c[min(j + shift, len(c) - 1)]) for j in range(n)]
        toks = torch.tensor([padded(c, 0) for c in continuations],
                            device=lm.device).repeat(len(chunk), 1)
        targets = torch.tensor([padded(c, 1) for c in continuations],
                               device=lm.device).repeat(len(chunk), 1)
        step_pos = None
        if pos is not None:
            step_pos = torch.cat([torch.cat([lm.step_position_ids(lm.next_position(p, L) + j)
                                             for j in range(n)], -1) for p in positions], 1)
            step_pos = step_pos.repeat_interleave(C, 1)
        o = lm.forward(inputs_embeds=lm.embed_tokens(toks), past_key_values=cache,
                       position_ids=step_pos, logits_to_keep=0)
        lp = torch.log_softmax(o.logits.float(), -1)                           # [b*C, n, V]
        got = lp.gather(-1, targets[..., None])[..., 0].view(len(chunk), C, n)
        for j, c in enumerate(continuations):
            score[:, j] += got[:, j, :len(c) - 1].sum(-1)
        return score.cpu()

    # ------------------------------------------------------------------ the pipeline
    @torch.inference_mode()
    def answer(self, video, question: str, num_frames: int = 64, max_length: int = 12288,
               max_new_tokens: int = 64, policy: str = "auto", **options) -> Answer:
        """Answer ``question`` about ``video`` (path | VideoClip | Future | [T,3,H,W] tensor).

        ``options`` (see :meth:`request`): ``time_window``; ``relevant`` (fixed Image Router
        decisions, one bool per sampled frame) or ``scorer`` (a FrameScorer); ``high``/``low``/
        ``global_scale`` (s1, s0, s_g); ``margin``; ``budget`` (a fixed visual budget B_img
        instead of one derived from ``max_length``); ``chunk_size``; ``frame_batch`` and
        ``router_pool`` (the Image Router: frames per shadow-stack call; window on Z_t first,
        None = the routers' configured one); ``system``; ``cache_visual`` (keep decoded frames,
        Z and the Image Router's question-independent state for the next question on the same
        video: the report says "hit"/"miss"); ``route_to`` (Semantic Router class -> policy,
        e.g. ``{"fragment": "uniform"}`` for the no-Image-Router ablation); ``decoder``
        ("auto", "pyav", "decord": the video library, see vr_runtime.decoders);
        ``ttft_budget_s`` (beyond the paper: the largest visual budget whose predicted TTFT on
        this device fits, vr_runtime.latency; the report gives the prediction);
        ``router_question`` (what the routers and frame scorers read when ``question`` is a full
        LLM prompt, e.g. a multiple-choice prompt with options and an instruction: the routers
        are trained on the bare question); ``on_token`` (called with each generated id as it is
        decided, e.g. to stream the answer; the answer is the same)."""
        on_token = options.pop("on_token", None)   # streaming: each new id, as it is decided
        p = self._prepare(video, question, num_frames, max_length, max_new_tokens, policy,
                          **options)
        gen = self.generate(p.embeds, p.req.max_new_tokens, p.timer, p.position_ids, on_token)
        return self._finish(p, gen)

    def _prepare(self, video, question, num_frames=64, max_length=12288, max_new_tokens=64,
                 policy="auto", **options) -> "_Prepared":
        """Every stage of :meth:`answer` before the prefill -> the prompt's embeddings and
        everything the report needs."""
        req = self.request(video, question, num_frames, max_length, max_new_tokens, policy,
                           **options)
        T_req = int(video.shape[0]) if isinstance(video, torch.Tensor) else num_frames
        self.check_budget(req, T_req)
        timer = StageTimer(self.lm.device)
        state = self.video_state(req)
        hit = bool(state and state["hit"])
        frames = self.decode(req, timer, state)
        T = frames.T
        notes = list(frames.notes)
        if hit:
            notes.append("visual cache hit: decoded frames, Z and the Image Router's "
                         "question-independent state were reused from an earlier question")

        decision = self.decide_policy(req, timer)
        notes += decision.notes
        planner = get_planner(decision.policy)
        scores, Z, keep = None, None, None
        if planner.needs_relevance:
            scorer = req.scorer
            if scorer.uses_routers and not self.routers_trained:
                notes.append("routers are untrained: the Image Router's frame scores come from "
                             "untrained weights")
            pool = self._scorer_pool(scorer)
            if pool is not None and pool != self.routers.config.router_pool:
                notes.append(f"router_pool={pool} differs from the pooling the "
                             f"routers were built with ({self.routers.config.router_pool})")
            Z = self.encode(frames, req, timer, state) if scorer.needs_z else None
            scores = self.score_frames(req, frames, Z, timer, state, self._scoring_budget(req, T))
            fitted = self.plan(req, decision.policy, T, scores.relevant)
            if not any(scores.relevant):
                notes.append("no frame was relevant: " + (
                    "every frame at s0 (Algorithm 1 literally)"
                    if decision.policy == "fragment-literal" else "the Global plan was used"))
        else:
            fitted = self.plan(req, decision.policy, T)
        notes += fitted.notes
        keep = kept_frames(fitted.plan, self.lm.grid)
        if Z is None:
            Z = self.encode(frames, req, timer, state, keep)
        elif len(keep) < T:
            Z = Z[keep]

        ids, embeds, pos = self.compress(req, fitted.plan, Z, keep, timer)
        if not planner.budgeted and ids.numel() + req.max_new_tokens > req.max_length:
            notes.append(f"{decision.policy} has no budget: its prompt of {ids.numel()} tokens "
                         f"plus {req.max_new_tokens} new tokens exceeds max_length {req.max_length}")
        return _Prepared(req, timer, frames, decision, planner, scores, fitted, ids, embeds, pos,
                         notes, hit)

    def _finish(self, p: "_Prepared", gen: List[int], batch: int = 1) -> Answer:
        """The answer's text and report from the generated ids."""
        req, T = p.req, p.frames.T
        p.embeds = None
        text = self.lm.tokenizer.decode(gen, skip_special_tokens=True).strip()
        extra = None
        if req.ttft_budget_s is not None:
            extra = self._latency_report(req, p.planner, T, p.fitted, p.timer,
                                         observe=batch == 1)
        report = build_report(self, req, p.frames, p.decision, p.scores, p.fitted, p.ids.numel(),
                              len(gen), p.timer, p.notes,
                              ("hit" if p.hit else "miss") if req.cache_visual else None)
        report["decoding"] = self.greedy.mode
        if self.greedy.fallback and self.greedy.fallback not in report["notes"]:
            report["notes"].append(self.greedy.fallback)
        if extra:
            report.update(extra)
        return Answer(text=text, report=report)

    @torch.inference_mode()   # as answer: no autograd graph (cached state is deep-copied)
    def answer_batch(self, videos: Sequence, questions, num_frames: int = 64, time_window=None,
                     decoder: str = "auto", batch_prefill: bool = True,
                     options: Optional[Sequence[dict]] = None, **kw) -> List[Answer]:
        """``answer`` for several videos (``questions``: one string for all, or one per video).
        ``options``: one dict of ``answer`` options per video, over ``kw`` (e.g. each question's
        ``router_question`` and its own ``scorer``).

        Every stage before the prefill runs per video, decoding the next video file in the
        background while the model works on the current one. With ``batch_prefill`` (the
        default) the prompts are then prefilled in one decoder batch and decoded together
        (vr_runtime.decode: right-padded, every answer the one it gets alone); each report's
        "prefill" and "generate" are the batch's. ``batch_prefill=False``: one ``answer`` after
        another (the original path)."""
        videos = list(videos)
        qs = [questions] * len(videos) if isinstance(questions, str) else list(questions)
        if len(qs) != len(videos):
            raise ValueError(f"questions: expected 1 or {len(videos)} questions, got {len(qs)}")
        per = [{}] * len(videos) if options is None else list(options)
        if len(per) != len(videos):
            raise ValueError(f"options: expected {len(videos)} dicts (one per video), got "
                             f"{len(per)}")
        spec = self.lm.frame_spec

        def start(v):
            if isinstance(v, (str, pathlib.Path)):
                from .video import prefetch_video
                return prefetch_video(str(v), num_frames=num_frames, time_window=time_window,
                                      size=spec.size[0], mean=spec.mean, std=spec.std,
                                      decoder=decoder)
            return v

        run = self._prepare if batch_prefill else self.answer
        done: list = []
        pending = start(videos[0]) if videos else None
        for i, q in enumerate(qs):
            cur = pending
            pending = start(videos[i + 1]) if i + 1 < len(videos) else None
            done.append(run(cur, q, num_frames=num_frames,
                            time_window=None if isinstance(cur, cf.Future) else time_window,
                            decoder=decoder, **{**kw, **per[i]}))
        if not batch_prefill or not done:
            return done
        timer = StageTimer(self.lm.device)
        gens = self.greedy.generate([p.embeds for p in done], [p.req.max_new_tokens for p in done],
                                    [p.position_ids for p in done], self._stop_ids, timer)
        for p in done:
            for stage in ("prefill", "generate"):
                p.timer.add(stage, timer.get(stage))
            if len(done) > 1:
                p.notes.append(f"prefilled and decoded in one batch of {len(done)} requests: "
                               f"prefill and generate are the batch's times")
        return [self._finish(p, g, len(done)) for p, g in zip(done, gens)]


__all__ = ["VideoRouter", "Answer", "Request", "Frames", "PolicyDecision", "POLICIES",
           "UNTRAINED_AUTO_POLICY", "SEMANTIC_CLASSES"]
