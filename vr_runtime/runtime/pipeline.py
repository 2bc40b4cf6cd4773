"""VideoRouter: the inference path of the paper (Sections 3.1-3.2, Algorithm 1) over a backbone,
as a short sequence of stages, each a function in the package of its stage::

    request   AnswerOptions -> Request (vr_runtime.request): every argument checked once;
              ``fps``: the file opened now, its duration gives the frame count
    budget    planning.request_plan.check_budget: a hopeless B_img fails before any decoding
    frames    video.frames: the video opened (checked, indexed, sampled), nothing decoded yet
              -> Frames (its routing units)
    policy    routing.policy.decide_policy: the Semantic Router on the question (``auto``)
    vision    backbones.encode.encode_stream: frames decoded on every core while the tower
              encodes the chunk before -> Z [T, H*W, D] (pixels dropped once encoded)
    score     a FrameScorer (routing.scorers: Image Router, cached, fixed, CLIP) -> FrameScores
    plan      planning.request_plan.plan_request: the policy's windows fitted exactly into
              max_length -> FittedPlan; check_length refuses a prompt over the context
    compress  reconstruct.compress: the prompt, the kept frames pool_packed into inputs_embeds
    prefill   generate: one decoder pass (last-row logits, KV cache)   TTFT = vision + router +
    generate  greedy decoding with the cache                               compress + prefill
    report    report.build_report (+ planning.latency.latency_report with ttft_budget_s)

When the plan does not depend on Z (every policy but ``fragment``), it is made before the vision
stage and only the frames it keeps are decoded and encoded. The frames stage (opening a video
input, ``fps`` sampling) is :mod:`.inputs`, what loading runs (routers, warm-ups) :mod:`.loading`,
the visual cache :mod:`.cache`, the batch path :mod:`.batch`; option scoring (labels, evaluation)
is in :mod:`vr_runtime.eval.option_scoring`. Everything specific to a model family is behind
``self.lm``, a :class:`~vr_runtime.backbones.Backbone`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch

from ..backbones import Backbone, backbone_from_config, load_backbone
from ..backbones.compiled import CompileOptions
from ..backbones.encode import VisionEncoder, encode_stream
from ..generate import GreedyDecoder
from ..planning import request_plan as plans
from ..planning.latency import LatencyContext, LatencyState, latency_report
from ..planning.policies import FittedPlan, get_planner, kept_frames
from ..reconstruct import build_prompt, compress
from ..report import build_report, dropped_note
from ..request import AnswerOptions, Request
from ..routing.policy import PolicyDecision, decide_policy
from ..routing.routers import RouterConfig, Routers, embed_question
from ..routing.scorers import FrameScores, ScoringInput
from ..telemetry.timing import StageTimer
from ..video.frames import Frames
from .inputs import request_frames, with_rate
from .loading import (compile_warmup, kernel_warmup, preset_routers, router_runner, routers_for,
                      throwaway_answer)
from .batch import batch_options, generate_batch, prepare_each
from .cache import VisualCache, VisualEntry, visual_prefix
from .prepared import Packing, Prepared


@dataclass
class Answer:
    text: str
    report: dict = field(default_factory=dict)


class VideoRouter:
    def __init__(self, lm: Backbone, routers: Optional[Routers] = None,
                 visual_cache_size: int = 1, warmup_frames: int = 256, decoding: str = "auto",
                 warm_request: Optional[bool] = None, prefix_cache: bool = False,
                 compile: Optional[CompileOptions] = None):
        """``decoding``: how tokens after the first are generated (vr_runtime.generate): "auto"
        (the eager dynamic cache; "graph", CUDA graphs over a static KV cache, is opt-in until
        measured on a GPU), "dynamic", "static", "compiled" or "graph" -- the same greedy
        tokens in every mode (compiled ones to floating-point reordering); a compiled step is
        compiled at load. ``warm_request``: answer one throw-away request at load
        (:meth:`warm_up_request`); None = on CUDA only. ``prefix_cache``: with
        ``cache_visual``, keep the KV cache of the prompt up to the end of its visual tokens in
        the video's cache entry, and prefill only the rest for a later question with the same
        plan and prompt up to there. Off by default: a TTFT measured with it is amortised.
        ``compile``: the vision tower's and the Image Router's fixed chunks and compile modes
        (:class:`~vr_runtime.backbones.compiled.CompileOptions`; default ``auto``, the
        device's); a compiled stage is compiled here, at load (``self.compile_warmup``)."""
        self.lm = lm
        self.prefix_cache = bool(prefix_cache)
        self.greedy = GreedyDecoder(lm, decoding)   # checks ``decoding`` before any warm-up
        self.compile = compile or CompileOptions()
        self.vision = VisionEncoder(lm, self.compile.vision_chunk, self.compile.vision)
        self.kernel_warmup = kernel_warmup(lm, warmup_frames)   # pool_pack compiled now
        self.routers = routers if routers is not None else Routers.from_backbone(lm)
        self.routers.eval()
        self.routers.runner = router_runner(self.routers, lm.grid, self.compile)
        self.compile_warmup = compile_warmup(self)
        self._last_question_emb: Optional[tuple] = None   # (question, Emb(q))
        self.stop_ids = lm.stop_token_ids()
        self.visual_cache = VisualCache(visual_cache_size)
        # ttft_budget_s: the cost model of this backbone on this device, built (and probed) on
        # the first request that asks, then corrected by every answer (planning.latency)
        self.latency = LatencyState()
        if warm_request is None:
            warm_request = torch.device(lm.device).type == "cuda"
        self.request_warmup = self.warm_up_request() if warm_request else \
            {"skipped": "warm_request is off (the default off CUDA)"}

    @torch.inference_mode()
    def warm_up_request(self, num_frames: int = 8, max_new_tokens: int = 2) -> dict:
        """Answer one throw-away question on random frames through every stage a request runs
        (vision, both routers, pool_pack, prefill, decode steps), then forget it: what the
        kernel warm-up cannot reach (CUDA's lazy module loading, the GEMM and attention kernel
        choices, the shadow stack's first call) is paid at load, not by the first user."""
        return throwaway_answer(self, num_frames, max_new_tokens)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(cls, path_or_name="tiny", routers=None, device="cpu", dtype=None,
                        attn_implementation=None, router_config: Optional[RouterConfig] = None,
                        **kw):
        """``path_or_name``: a local checkpoint directory, a cached Hub id or a preset.
        ``routers``: a safetensors path, a :class:`Routers`, or None; for ``"tiny"`` with None
        the shipped ``assets/tiny/routers.safetensors`` loads."""
        lm = load_backbone(path_or_name, device=device, dtype=dtype,
                           attn_implementation=attn_implementation)
        routers = preset_routers(path_or_name, routers)
        return cls(lm, routers_for(lm, routers, router_config), **kw)

    @classmethod
    def from_config(cls, config, device="cpu", dtype=None, seed: int = 0, routers=None,
                    attn_implementation=None, router_config: Optional[RouterConfig] = None, **kw):
        """Random weights of a shape preset (``vr_runtime.backbones.backbone_from_config``)."""
        lm = backbone_from_config(config, device=device, dtype=dtype, seed=seed,
                                  attn_implementation=attn_implementation)
        return cls(lm, routers_for(lm, routers, router_config), **kw)

    @property
    def routers_trained(self) -> bool:
        return bool(getattr(self.routers, "trained", False))

    @property
    def latency_context(self) -> LatencyContext:
        return LatencyContext(self.lm, self.routers, self.latency, self.question_embeddings)

    def clear_visual_cache(self) -> None:
        self.visual_cache.clear()

    def has_frames(self, video, num_frames: int, time_window=None, decoder="auto",
                   seek="exact") -> bool:
        """Whether the visual cache holds Z of ``video`` at these settings (answering it then
        decodes nothing). A read of the cache only; safe from another thread."""
        return self.visual_cache.has_z(video, num_frames, time_window, decoder, seek)

    def question_embeddings(self, question: str) -> torch.Tensor:
        """Emb(q) [Lq, D]: what both routers read. The Semantic Router and the scorer of one
        answer ask for the same question, so the last one is kept."""
        last = self._last_question_emb
        if last is not None and last[0] == question:
            return last[1]
        emb = embed_question(self.lm.model, self.lm.tokenizer, question)
        self._last_question_emb = (question, emb)   # one tuple: a reader sees a whole pair
        return emb

    # ------------------------------------------------------------------ request and frames
    def request(self, video, question, options: Optional[AnswerOptions] = None,
                **kwargs) -> Request:
        """Check a call of :meth:`answer` (before any decoding) -> :class:`Request`.
        ``options`` or ``kwargs`` (the fields of :class:`~vr_runtime.request.AnswerOptions`);
        ``scales="auto"`` is resolved here, on this backbone."""
        if options is None:
            options = AnswerOptions(**kwargs)
        elif kwargs:
            raise ValueError(f"options: give an AnswerOptions or keywords, not both (got "
                             f"{', '.join(sorted(kwargs))} besides options=)")
        elif not isinstance(options, AnswerOptions):
            raise ValueError(f"options: expected a vr_runtime.AnswerOptions, got "
                             f"{type(options).__name__}")
        return Request.build(video, question, options, lm=self.lm)

    def load_frames(self, req: Request, timer: StageTimer,
                    state: Optional[VisualEntry] = None) -> Frames:
        """The request's frames, opened (timed as "frames"; nothing is decoded before the
        vision stage streams it), or the video cache's (``state``); as routing units."""
        return request_frames(self.lm, req, timer, state)

    # ------------------------------------------------------------------ vision and scores
    def encode(self, frames: Frames, req: Request, timer: StageTimer,
               state: Optional[VisualEntry], keep: Optional[Sequence[int]] = None,
               retain: bool = False) -> torch.Tensor:
        """Z of the ``keep`` units (all when None), streamed (backbones.encode). With a video
        cache, Z of every unit is computed once and kept (a later question may keep other
        frames). ``retain``: keep the pixels too (a scorer that reads them)."""
        if state is None:
            return encode_stream(self.lm, frames, keep, req.chunk_size, timer, retain, self.vision)
        if state.Z is None:
            state.Z = encode_stream(self.lm, frames, None, req.chunk_size, timer, retain,
                                    self.vision)
        else:
            timer.add("vision", 0.0)
        return state.Z if keep is None else state.Z[list(keep)]

    def score_frames(self, req: Request, frames: Frames, Z, timer: StageTimer,
                     state: Optional[VisualEntry], budget: int) -> FrameScores:
        pixels = None
        if req.scorer.needs_pixels:   # every unit's pixels, kept by the vision stage or now
            t0 = time.perf_counter()
            pixels = frames.all_pixels(req.chunk_size)
            timer.add("frames_wait", time.perf_counter() - t0)
        inp = ScoringInput(req.routed_question, pixels, Z, budget, req.windows,
                           None if state is None else state.scorer_state,
                           routers=self.routers, grid=self.lm.grid,
                           frame_spec=self.lm.frame_spec, embed=self.question_embeddings,
                           num_frames=frames.T)
        with timer.stage("router"):
            return req.scorer.score(inp)

    # ------------------------------------------------------------------ the pipeline
    @torch.inference_mode()
    def answer(self, video, question: str, options: Optional[AnswerOptions] = None, *,
               on_token=None, **kwargs) -> Answer:
        """Answer ``question`` about ``video`` (path | VideoClip | Future | [T,3,H,W] tensor).

        ``options``: an :class:`~vr_runtime.request.AnswerOptions` (frames, context, policy,
        scorer, windows, budget, cache, ...); or its fields as keywords, e.g.
        ``answer(video, q, num_frames=16, policy="global")``. ``on_token``: called with each
        generated id as it is decided (streaming; the answer is the same)."""
        req = self.request(video, question, options, **kwargs)             # request
        p = self.prepare(req)           # frames, policy, vision, score, plan, compress
        gen = self.generate(p.embeds, req.max_new_tokens, p.timer, p.position_ids,
                            on_token, prefix=p.prefix and p.prefix.cache)  # prefill, generate
        return self.finish(p, gen)                                         # report

    @torch.inference_mode()
    def generate(self, embeds: torch.Tensor, max_new_tokens: int,
                 timer: Optional[StageTimer] = None, position_ids: Optional[torch.Tensor] = None,
                 on_token=None, prefix=None) -> List[int]:
        """Prefill ``embeds`` [1, L, D] (last-row logits, KV cache), then greedy decoding until
        a stop id or ``max_new_tokens`` (``self.greedy``: dynamic, static or graph-captured
        steps, the same tokens) -> the new ids (the stop id excluded); "prefill" and "generate"
        go to ``timer``; ``on_token(id)`` is called with each new id; ``prefix``: the visual
        prefix's PrefixCache (``prefix_cache``)."""
        each = None if on_token is None else (lambda row, i: on_token(i))
        return self.greedy.generate([embeds], [max_new_tokens], [position_ids], self.stop_ids,
                                    timer, each, prefix=prefix)[0]

    def prepare(self, req: Request, pack: bool = True) -> Prepared:
        """Every stage of :meth:`answer` before the prefill. ``pack=False`` (answer_batch):
        the prompt is built but its frames are not pooled yet (``Prepared.packing``)."""
        req = with_rate(self.lm, req)
        T_req = int(req.video.shape[0]) if isinstance(req.video, torch.Tensor) else req.num_frames
        plans.check_budget(self.lm, req, T_req)    # a hopeless budget fails before decoding
        timer = StageTimer(self.lm.device, resident=True)   # CPU: this request's resident peak
        state = self.visual_cache.state(req)
        frames = self.load_frames(req, timer, state)                                 # frames
        decision = decide_policy(req, self.routers, self.question_embeddings, timer)  # policy
        p = Prepared(req, timer, frames, decision, get_planner(decision.policy),
                     list(frames.notes), hit=bool(state and state.hit))
        if p.hit:
            p.notes.append("visual cache hit: the frames' Z and the Image Router's "
                           "question-independent state were reused from an earlier question")
        p.notes += decision.notes
        Z = None
        if p.planner.needs_relevance:   # vision first when the scorer reads Z, then score
            Z = self.encode(frames, req, timer, state, retain=req.scorer.needs_pixels) \
                if req.scorer.needs_z else None                                     # vision
            p.scores = self.score_frames(req, frames, Z, timer, state,
                                         plans.scoring_budget(self.lm, req, frames.T))  # score
            p.notes += p.scores.notes
        p.fitted = self._plan(p)                                                     # plan
        keep = kept_frames(p.fitted.plan, self.lm.grid)
        if Z is None:   # plan-first policies decode and encode only the frames they keep
            Z = self.encode(frames, req, timer, state, None if state is not None else keep)
        self._compress(p, Z, keep, state, pack)                                    # compress
        return p

    def _plan(self, p: Prepared) -> FittedPlan:
        """The plan stage and its notes (what was dropped, and why)."""
        req, policy, planner = p.req, p.decision.policy, p.planner
        relevant = p.scores.relevant if p.scores else None
        fitted = plans.plan_request(self.lm, req, policy, p.frames.T, relevant,
                                    p.frames.times_s, self.latency_context)
        plans.check_length(self.lm, req, policy, planner, p.frames.T, fitted)
        if p.scores is not None and not any(p.scores.relevant) and planner.when_none_relevant:
            p.notes.append("no frame was relevant: " + planner.when_none_relevant)
        p.notes += fitted.notes
        dropped = dropped_note(fitted.plan, self.lm.grid, fitted.budget, policy, relevant)
        if dropped and planner.budgeted:
            p.notes.append(dropped)
        return fitted

    def _compress(self, p: Prepared, Z: torch.Tensor, keep: List[int],
                  state: Optional[VisualEntry], pack: bool) -> None:
        """The prompt and its embeddings (or, for a batch, what its one pool_pack needs)."""
        req, plan = p.req, p.fitted.plan
        # Z holds every frame (a relevance policy's, or the video cache's) or only the kept
        # ones; pool_pack skips a frame whose window is 0, so no kept row is copied out of Z
        z_plan = list(plan) if Z.shape[0] == p.frames.T else [plan[t] for t in keep]
        if pack:
            p.ids, p.embeds, p.position_ids = compress(self.lm, req, plan, Z, keep, p.timer,
                                                       p.frames.times_s, z_plan)
        else:
            with p.timer.stage("compress"):
                p.ids, starts, _, p.position_ids = build_prompt(self.lm, req, plan, keep,
                                                                p.frames.times_s)
            p.packing = Packing(Z, z_plan, starts)
        del Z   # the pooled rows are in embeds (or the batch's packing): Z is not kept here
        if not p.planner.budgeted and p.ids.numel() + req.max_new_tokens > req.max_length:
            p.notes.append(f"{p.decision.policy} has no budget: its prompt of {p.ids.numel()} "
                           f"tokens plus {req.max_new_tokens} new tokens exceeds max_length "
                           f"{req.max_length}")
        if self.prefix_cache and state is not None and pack:
            p.prefix = visual_prefix(state, plan, p.ids, p.position_ids,
                                     self.lm.image_token_id)
        if p.prefix is not None and p.prefix.hit:
            p.notes.append(f"visual prefix cache hit: the KV cache of the prompt's first "
                           f"{p.prefix.cache.length} tokens (up to the end of the visual "
                           f"tokens) was reused from an earlier question; prefill ran on the "
                           f"rest")

    def finish(self, p: Prepared, gen: List[int], batch: int = 1) -> Answer:
        """The report stage: the answer's text and report from the generated ids (``batch``:
        how many requests were decoded together)."""
        req = p.req
        p.embeds = None
        text = self.lm.tokenizer.decode(gen, skip_special_tokens=True).strip()
        extra = None
        if req.ttft_budget_s is not None:
            # a reused prefix's prefill is not the model's prefill: not observed
            reused = p.prefix is not None and p.prefix.hit
            extra = latency_report(self.latency_context, req, p.planner, p.frames.T, p.fitted,
                                   p.timer, observe=batch == 1 and not reused)
        report = build_report(self.lm, self.routers, p, len(gen))
        report["decoding"] = self.greedy.mode
        if self.prefix_cache:
            report["prefix_cache"] = None if p.prefix is None else \
                {"status": p.prefix.status, "tokens": p.prefix.cache.length}
        if self.greedy.fallback and self.greedy.fallback not in report["notes"]:
            report["notes"].append(self.greedy.fallback)
        if extra:
            report.update(extra)
        return Answer(text=text, report=report)

    @torch.inference_mode()   # as answer: no autograd graph (cached state is deep-copied)
    def answer_batch(self, videos: Sequence, questions, options=None, *,
                     batch_prefill: bool = True, **kwargs) -> List[Answer]:
        """``answer`` for several videos (``questions``: one string for all, or one per video).
        ``options``: one :class:`~vr_runtime.request.AnswerOptions` for every video, or one per
        video (an AnswerOptions, or a dict of its fields over ``kwargs``); ``kwargs``:
        AnswerOptions fields for all. With ``batch_prefill`` (the default) the prompts are
        prefilled in one decoder batch and decoded together (vr_runtime.generate: every answer
        the one it gets alone); each report's "prefill" and "generate" are the batch's.
        ``batch_prefill=False``: one ``answer`` after another."""
        videos = list(videos)
        qs, opts = batch_options(videos, questions, options, kwargs)
        if not self.lm.pads_exactly:   # a recurrent LLM: padding would enter a shorter state
            batch_prefill = False
        done = prepare_each(self, videos, qs, opts, batch_prefill)
        if not batch_prefill or not done:
            return done
        return generate_batch(self, done)


__all__ = ["VideoRouter", "Answer", "Prepared", "PolicyDecision"]
