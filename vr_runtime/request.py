"""The options of one ``VideoRouter.answer`` call, as one public, validated object.

:class:`AnswerOptions` is everything about a request but the video and the question (in the
spirit of vLLM's ``SamplingParams``): built and checked once in ``__post_init__`` -- every error
is one line naming the option and what to do -- and varied with ``dataclasses.replace`` (which
checks the variant again). The CLI, the serve engine, the eval runner, the lmms-eval model and
``bench/scripts/bench_e2e.py`` each build one and call
``vr.answer(video, question, options=opts)``;
``vr.answer(video, question, **kwargs)`` is the same call with ``AnswerOptions(**kwargs)``.

:class:`Request` is the runtime's checked call: the video, the question and the options
resolved (the frame scorer built, the Semantic Router's routes completed, the windows).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Mapping, Optional, Sequence, Tuple, Union

from .backbones.trained_frames import trained_frames_of
from .planning import scales as scale_rules
from .planning.policies import (SEMANTIC_CLASSES, Windows, get_planner, is_budgeted,
                                policy_names)
from .routing.scorers import CachedImageRouterScorer, FixedRelevance, FrameScorer, ImageRouterScorer
from .video.sampling import MAX_FRAMES, MIN_FRAMES, NUM_FRAMES, Sampling


def _check_int(name: str, v, lo: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ValueError(f"{name}: expected an int >= {lo}, got {v!r}")


@dataclass(frozen=True)
class AnswerOptions:
    """How to answer (see ``VideoRouter.answer``). Defaults are the paper's settings; each
    field is documented where it is declared."""
    #: Frames sampled uniformly from the video (or its ``time_window``).
    num_frames: int = NUM_FRAMES
    #: L_max: the prompt plus the new tokens must fit it (the visual budget is derived from it).
    max_length: int = 12288
    #: The most tokens generated (greedy).
    max_new_tokens: int = 64
    #: ``auto`` (the Semantic Router picks a planner) or a registered planner's name.
    policy: str = "auto"
    #: (start_s, end_s): sample only this part of a video file.
    time_window: Optional[tuple] = None
    #: Sample by rate instead (Qwen2.5-VL/Qwen3-VL's ``fps``, as vLLM's ``mm_processor_kwargs``
    #: pass it): ``fps`` frames a second of the video (or its ``time_window``), evenly spread,
    #: at least ``min_frames`` and at most ``max_frames``; ``num_frames`` is then unused.
    #: None: the paper's ``num_frames`` segment sampling.
    fps: Optional[float] = None
    #: The fewest frames ``fps`` sampling takes (Qwen's processors: 4).
    min_frames: int = MIN_FRAMES
    #: The most frames ``fps`` sampling takes (Qwen's processors: 768).
    max_frames: int = MAX_FRAMES
    #: Fixed Image Router decisions, one bool per sampled frame (a :class:`FixedRelevance`).
    relevant: Optional[Sequence[bool]] = None
    #: A :class:`~vr_runtime.routing.scorers.FrameScorer` that decides the relevant frames.
    scorer: Optional[FrameScorer] = None
    #: s_1: the window that pools the relevant frames of a Fragment plan (1 = full resolution).
    relevant_window: int = 1
    #: s_0: the window that pools the other frames of a Fragment plan (the coarsest window).
    other_window: int = 4
    #: s_g: the window that pools every frame of a Global plan.
    global_window: int = 2
    #: The three windows at once as ``(s_g, s_1, s_0)`` (or ``"2,1,4"``), or ``"auto"``: the
    #: budget study's rule (:mod:`vr_runtime.planning.scales`), resolved once per request by
    #: ``Request.build`` from the request's visual budget on the backbone's grid. None: the
    #: per-window fields above.
    scales: Union[None, str, Tuple[int, int, int]] = None
    #: epsilon: tokens of ``max_length`` kept free besides the prompt and the new tokens.
    margin: int = 100
    #: A fixed visual budget B_img instead of the one derived from ``max_length``.
    budget: Optional[int] = None
    #: Frames per vision-tower call.
    chunk_size: int = 16
    #: The default Image Router scorer's frames per call.
    frame_batch: Optional[int] = None
    #: A system prompt.
    system: Optional[str] = None
    #: The default Image Router scorer's pooling window on Z_t.
    router_pool: Optional[int] = None
    #: Keep the decoded frames, Z and the Image Router's question-independent state of the
    #: video for the next question on the same video.
    cache_visual: bool = False
    #: Semantic Router class -> the planner it runs (default: each class's own planner).
    route_to: Optional[Mapping[str, str]] = None
    #: The video library (``auto`` picks one).
    decoder: str = "auto"
    #: ``exact``: the sampled frames (the paper's setting); ``keyframe``: the keyframe nearest
    #: each sampled time, one decoded frame a sample, at most half a GOP away.
    seek: str = "exact"
    #: Beyond the paper: the largest visual budget whose predicted TTFT fits these seconds.
    ttft_budget_s: Optional[float] = None
    #: What the routers and scorers read when the question is a full LLM prompt.
    router_question: Optional[str] = None
    #: Let an unbudgeted policy (dense) exceed ``max_length`` (never the model's context).
    allow_over_length: bool = False
    #: Beyond the paper: ``"auto"`` sends both Semantic Router classes to the long-prompt
    #: planners (planning/long_prompt.py: the relevant frames at full resolution plus a
    #: coverage set spread in time, at most the backbone's trained frame count in the prompt,
    #: backbones.trained_frames); an int caps the prompt at that many frames; None: the
    #: paper's planners.
    long_prompt: Union[None, str, int] = None
    #: With ``long_prompt``: the relevant frames' neighbours' window (None: no middle window).
    neighbour_window: Optional[int] = None

    def __post_init__(self):
        if self.policy not in policy_names():
            from .errors import expected_one_of
            raise ValueError(f"policy {self.policy!r}: "
                             f"{expected_one_of(self.policy, policy_names())}")
        for name, lo in (("num_frames", 1), ("max_length", 1), ("max_new_tokens", 0),
                         ("margin", 0), ("chunk_size", 1), ("min_frames", 1),
                         ("max_frames", 1)):
            _check_int(name, getattr(self, name), lo)
        self._check_rate()
        lp = self.long_prompt
        if lp is not None and lp != "auto" and (not isinstance(lp, int) or isinstance(lp, bool)
                                                or lp < 1):
            raise ValueError(f"long_prompt: expected 'auto', a frame count >= 1 or None, got "
                             f"{lp!r}")
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
        self._check_scales()
        t = self.ttft_budget_s
        if t is not None:
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
                raise ValueError(f"ttft_budget_s: expected seconds > 0, got {t!r}")
            if not is_budgeted(self.policy, routes) or self.budget is not None:
                raise ValueError(f"ttft_budget_s: chooses the visual budget, so it does not go "
                                 f"with policy {self.policy!r} (no budget) or a fixed budget=")
            object.__setattr__(self, "ttft_budget_s", float(t))

    def _check_rate(self) -> None:
        f = self.fps
        if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float))
                              or not 0 < f < float("inf")):
            raise ValueError(f"fps: expected frames a second > 0 (e.g. 2), got {f!r}")
        if self.min_frames > self.max_frames:
            raise ValueError(f"min_frames {self.min_frames} is above max_frames "
                             f"{self.max_frames}; lower --min-frames or raise --max-frames")

    def _check_scales(self) -> None:
        """``scales``: parsed once; a triple is written into the per-window fields (which must
        then be their defaults or the same windows), ``"auto"`` waits for the request."""
        if self.scales is None:
            return
        parsed = scale_rules.parse_scales(self.scales, name="scales")
        object.__setattr__(self, "scales", parsed)
        given = (self.global_window, self.relevant_window, self.other_window)
        if given != scale_rules.PAPER_SCALES and given != parsed:
            raise ValueError(f"scales {scale_rules.label(parsed)}: also given "
                             f"global_window/relevant_window/other_window {given}; give one of "
                             f"them")
        if parsed == scale_rules.AUTO:
            return
        for name, w in zip(("global_window", "relevant_window", "other_window"), parsed):
            object.__setattr__(self, name, w)

    @property
    def routes(self) -> dict:
        """Semantic Router class -> planner, every class present (``route_to`` over identity)."""
        routes = dict(zip(SEMANTIC_CLASSES, SEMANTIC_CLASSES))
        if self.long_prompt is not None:
            routes.update({"fragment": "fragment-long", "global": "global-long"})
        routes.update(self.route_to or {})
        return routes

    @property
    def windows(self) -> Windows:
        """The fixed windows; ``scales="auto"`` has none before a request (``Request.windows``)."""
        if self.scales == scale_rules.AUTO:
            raise ValueError("scales 'auto': the windows depend on the request's visual budget; "
                             "read them from the Request (VideoRouter.request(...).windows)")
        return Windows(relevant_window=self.relevant_window, other_window=self.other_window,
                       global_window=self.global_window, neighbour_window=self.neighbour_window)

    def frame_scorer(self) -> FrameScorer:
        """The scorer a relevance policy runs: ``scorer``, fixed ``relevant`` decisions, or the
        paper's Image Router (cached across questions with ``cache_visual``)."""
        if self.relevant is not None:
            return FixedRelevance(self.relevant)
        if self.scorer is not None:
            return self.scorer
        cls = CachedImageRouterScorer if self.cache_visual else ImageRouterScorer
        return cls(frame_batch=self.frame_batch, router_pool=self.router_pool)

    @property
    def sampling(self) -> Sampling:
        """Which frames of a video file to read, and how (the video package's terms)."""
        return Sampling(self.num_frames, self.time_window, self.fps, self.min_frames,
                        self.max_frames, self.decoder, self.seek)

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
    windows: Windows               # resolved: options.windows, or scales="auto"'s for this request
    # (T, kept, times) -> the prompt's text tokens (text_tokens): each distinct count once
    _text_counts: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def build(cls, video, question, options: AnswerOptions, lm=None) -> "Request":
        """Check the question and resolve the options. ``lm`` (the backbone) resolves
        ``scales="auto"`` (its grid, and the prompt's text for the visual budget)."""
        if not isinstance(question, str) or not question.strip():
            raise ValueError("question: empty; ask a non-empty question about the video")
        auto = options.scales == scale_rules.AUTO
        req = cls(video, question, options, options.frame_scorer(), options.routes,
                  None if auto else options.windows)
        if auto:
            if lm is None:
                raise ValueError("scales 'auto': resolving it needs the backbone "
                                 "(Request.build(..., lm=vr.lm), as VideoRouter.request does)")
            object.__setattr__(req, "windows", req._auto_windows(lm))
        if options.long_prompt is not None:
            cap = options.long_prompt if options.long_prompt != "auto" else \
                (trained_frames_of(lm) if lm is not None else None)
            object.__setattr__(req, "windows", dataclasses.replace(
                req.windows, prompt_frames=cap, neighbour_window=options.neighbour_window))
        return req

    def _auto_windows(self, lm) -> Windows:
        """``scales="auto"``: the budget study's windows at this request's visual budget B_img
        (a fixed ``budget``, or what ``max_length`` leaves for ``num_frames`` frames' prompt),
        as :func:`vr_runtime.planning.scales.request_budget` counts it, from this request's
        memoised text count."""
        o = self.options
        b = o.budget
        if b is None:
            b = scale_rules.budget_from_text(self.text_tokens(lm, o.num_frames), o.max_length,
                                             o.max_new_tokens, o.margin)
        s_g, s_1, s_0 = scale_rules.auto_scales(b, int(lm.grid[0]) * int(lm.grid[1]))
        return Windows(relevant_window=s_1, other_window=s_0, global_window=s_g)

    def text_tokens(self, lm, T: int, kept: Optional[Sequence[int]] = None, **times) -> int:
        """``lm.text_tokens`` of this request's prompt (its question and system prompt) for
        ``T`` frames with the lines of ``kept`` (default: all) and ``times`` (a backbone that
        writes each unit's time): counted once per request for each distinct (T, kept, times),
        though the budget check, the plan, the length check and the scorer's budget each ask."""
        key = (int(T), None if kept is None else tuple(kept),
               tuple(times.get("times") or ()) if times else None)
        n = self._text_counts.get(key)
        if n is None:
            n = self._text_counts[key] = lm.text_tokens(self.question, T, self.system,
                                                        kept=kept, **times)
        return n

    def __getattr__(self, name):
        # num_frames, max_length, policy, budget, ...: the options' own values
        if name != "options" and name in AnswerOptions.field_names():
            return getattr(self.options, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def sampling(self) -> Sampling:
        return self.options.sampling

    @property
    def routed_question(self) -> str:
        return self.options.router_question or self.question


__all__ = ["AnswerOptions", "Request"]
