"""The options of one ``VideoRouter.answer`` call, as one public, validated object.

:class:`AnswerOptions` is everything about a request but the video and the question (in the
spirit of vLLM's ``SamplingParams``): built and checked once in ``__post_init__`` -- every error
is one line naming the option and what to do -- and varied with ``dataclasses.replace`` (which
checks the variant again). The CLI, the serve engine, the eval runner, the lmms-eval model and
``bench/bench_e2e.py`` each build one and call ``vr.answer(video, question, options=opts)``;
``vr.answer(video, question, **kwargs)`` is the same call with ``AnswerOptions(**kwargs)``.

:class:`Request` is the runtime's checked call: the video, the question and the options
resolved (the frame scorer built, the Semantic Router's routes completed, the windows).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping, Optional, Sequence

from .planning.policies import SEMANTIC_CLASSES, Windows, get_planner, is_budgeted, policy_names
from .routing.scorers import CachedImageRouterScorer, FixedRelevance, FrameScorer, ImageRouterScorer


def _check_int(name: str, v, lo: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ValueError(f"{name}: expected an int >= {lo}, got {v!r}")


@dataclass(frozen=True)
class AnswerOptions:
    """How to answer (see ``VideoRouter.answer``). Defaults are the paper's settings.

    ``relevant`` (fixed Image Router decisions, one bool per sampled frame) or ``scorer`` (a
    :class:`~vr_runtime.routing.scorers.FrameScorer`); ``high``/``low``/``global_scale`` (s1, s0, s_g);
    ``budget`` (a fixed visual budget B_img instead of one derived from ``max_length``);
    ``frame_batch``/``router_pool`` (the default Image Router scorer's frames per call and window
    on Z_t); ``cache_visual`` (reuse frames, Z and the Image Router's question-independent state
    for the next question on the same video); ``route_to`` (Semantic Router class -> policy);
    ``decoder`` (the video library); ``seek`` ("exact": the sampled frames, the paper's
    setting; "keyframe": the keyframe nearest each sampled time, one decoded frame a sample,
    at most half a GOP away); ``ttft_budget_s`` (beyond the paper: the largest budget
    whose predicted TTFT fits); ``router_question`` (what the routers and scorers read when the
    question is a full LLM prompt); ``allow_over_length`` (an unbudgeted policy, dense, may
    exceed ``max_length``; never the model's context)."""
    num_frames: int = 64
    max_length: int = 12288
    max_new_tokens: int = 64
    policy: str = "auto"
    time_window: Optional[tuple] = None
    relevant: Optional[Sequence[bool]] = None
    scorer: Optional[FrameScorer] = None
    high: int = 1
    low: int = 4
    global_scale: int = 2
    margin: int = 100
    budget: Optional[int] = None
    chunk_size: int = 16
    frame_batch: Optional[int] = None
    system: Optional[str] = None
    router_pool: Optional[int] = None
    cache_visual: bool = False
    route_to: Optional[Mapping[str, str]] = None
    decoder: str = "auto"
    seek: str = "exact"
    ttft_budget_s: Optional[float] = None
    router_question: Optional[str] = None
    allow_over_length: bool = False

    def __post_init__(self):
        if self.policy not in policy_names():
            from .errors import expected_one_of
            raise ValueError(f"policy {self.policy!r}: "
                             f"{expected_one_of(self.policy, policy_names())}")
        for name, lo in (("num_frames", 1), ("max_length", 1), ("max_new_tokens", 0),
                         ("margin", 0), ("chunk_size", 1)):
            _check_int(name, getattr(self, name), lo)
        b = self.budget
        if b is not None and (not isinstance(b, int) or isinstance(b, bool) or b < 1):
            raise ValueError(f"budget: expected a visual-token budget >= 1 or None, got {b!r}")
        if self.relevant is not None and self.scorer is not None:
            raise ValueError("relevant and scorer: give one of them (relevant= is a fixed scorer)")
        if self.scorer is not None and (self.router_pool is not None
                                        or self.frame_batch is not None):
            raise ValueError("router_pool/frame_batch: configure the Image Router of the default "
                             "scorer; with scorer= set them on the scorer itself (e.g. "
                             "FixedRelevance(..., run_routers=True, router_pool=2))")
        if self.scorer is not None and not isinstance(self.scorer, FrameScorer):
            raise ValueError(f"scorer: expected a vr_runtime.routing.scorers.FrameScorer, got "
                             f"{type(self.scorer).__name__}")
        routes = self.routes
        for cls_name, target in routes.items():
            if cls_name not in SEMANTIC_CLASSES:
                raise ValueError(f"route_to: keys are Semantic Router classes {SEMANTIC_CLASSES}, "
                                 f"got {cls_name!r}")
            get_planner(target)
        rq = self.router_question
        if rq is not None and (not isinstance(rq, str) or not rq.strip()):
            raise ValueError("router_question: expected a non-empty string or None (None: the "
                             "routers read the question itself)")
        if self.seek not in ("exact", "keyframe"):   # vr_runtime.video.decoders.SEEKS
            raise ValueError(f"seek: expected exact or keyframe, got {self.seek!r}")
        if self.time_window is not None:
            object.__setattr__(self, "time_window", tuple(self.time_window))
        t = self.ttft_budget_s
        if t is not None:
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
                raise ValueError(f"ttft_budget_s: expected seconds > 0, got {t!r}")
            if not is_budgeted(self.policy, routes) or self.budget is not None:
                raise ValueError(f"ttft_budget_s: chooses the visual budget, so it does not go "
                                 f"with policy {self.policy!r} (no budget) or a fixed budget=")
            object.__setattr__(self, "ttft_budget_s", float(t))

    @property
    def routes(self) -> dict:
        """Semantic Router class -> planner, every class present (``route_to`` over identity)."""
        routes = dict(zip(SEMANTIC_CLASSES, SEMANTIC_CLASSES))
        routes.update(self.route_to or {})
        return routes

    @property
    def windows(self) -> Windows:
        return Windows(self.high, self.low, self.global_scale)

    def frame_scorer(self) -> FrameScorer:
        """The scorer a relevance policy runs: ``scorer``, fixed ``relevant`` decisions, or the
        paper's Image Router (cached across questions with ``cache_visual``)."""
        if self.relevant is not None:
            return FixedRelevance(self.relevant)
        if self.scorer is not None:
            return self.scorer
        cls = CachedImageRouterScorer if self.cache_visual else ImageRouterScorer
        return cls(frame_batch=self.frame_batch, router_pool=self.router_pool)

    @classmethod
    def field_names(cls) -> tuple:
        return tuple(f.name for f in fields(cls))


@dataclass(frozen=True)
class Request:
    """One checked call of ``VideoRouter.answer``: the video, the question, the options."""
    video: object
    question: str
    options: AnswerOptions
    scorer: FrameScorer            # resolved: options.frame_scorer()
    route_to: Mapping[str, str]    # Semantic Router class -> planner (every class)
    windows: Windows

    @classmethod
    def build(cls, video, question, options: AnswerOptions) -> "Request":
        if not isinstance(question, str) or not question.strip():
            raise ValueError("question: empty; ask a non-empty question about the video")
        return cls(video, question, options, options.frame_scorer(), options.routes,
                   options.windows)

    def __getattr__(self, name):
        # num_frames, max_length, policy, budget, ...: the options' own values
        if name != "options" and name in AnswerOptions.field_names():
            return getattr(self.options, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def routed_question(self) -> str:
        return self.options.router_question or self.question


__all__ = ["AnswerOptions", "Request"]
