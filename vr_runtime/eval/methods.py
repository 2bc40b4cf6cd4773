"""The paper's methods as a registry: a name -> the fields of the ``AnswerOptions`` the runner
builds for ``VideoRouter.answer`` (and, for ``data-ft``, which model answers). Adding a method is one :func:`register_method`
call; nothing branches on method names in the runtime.

| method | what it is | ``answer`` arguments |
|---|---|---|
| ``dense`` | every frame at full resolution, no budget | ``policy="dense"`` |
| ``budget`` | InternVL3* (paper: "dynamically samples frames according to the same context budget"): floor(B / tokens per frame) frames sampled from the video with InternVL's segment rule | ``policy="budget"``, ``num_frames=floor(B/frame tokens)`` |
| ``budget-resize`` | Qwen2.5-VL Budget (paper Appendix E): all F frames at the largest resolution of Qwen's ``smart_resize`` whose F x tokens per frame fit B (``qwen2_5_vl.budget_frame_size``), on a view of the same weights at that size | ``policy="budget"`` on :func:`resized_router` |
| ``budget-subset`` | as many full-resolution frames as fit, a uniform subset of the F already sampled | ``policy="budget"`` |
| ``uniform`` | one window for every frame, the finest that fits | ``policy="uniform"`` |
| ``global`` | Global policy only | ``policy="global"`` |
| ``fragment`` | Fragment policy only (Image Router) | ``policy="fragment"`` |
| ``auto`` | VideoRouter: the Semantic Router chooses | ``policy="auto"`` |
| ``clip`` | CLIP relevance pooling (Appendix D), token-matched: k = the Image Router's relevant count, CLIP picks which k | ``policy="fragment", scorer=TokenMatchedScorer(CLIPScorer)`` |
| ``clip-fill`` | CLIP top frames at s1 until the budget is full (not token-matched) | ``policy="fragment", scorer=CLIPScorer`` |
| ``no-image-router`` | ablation as the paper ran it: Uniform Pooling for every query | ``policy="uniform"`` |
| ``no-image-router-routed`` | Semantic Router decides, Fragment -> uniform pooling | ``policy="auto", route_to={"fragment": "uniform"}`` |
| ``auto-literal`` | VideoRouter, Algorithm 1's empty-fragment branch literal (all frames at s0) | ``policy="auto", route_to={"fragment": "fragment-literal"}`` |
| ``auto-long``, ``auto-long-16``, ``auto-long-16-mid`` | beyond the paper: VideoRouter with the long-prompt planners (at most the backbone's trained frame count, or 16, in the prompt; ``-mid``: the relevant frames' neighbours at s_g) | ``policy="auto", route_to={"fragment": "fragment-long", "global": "global-long"}`` (``-16``, ``-16-mid`` variants) |
| ``no-semantic-router`` | ablation: always Fragment | ``policy="fragment"`` |
| ``data-ft`` | "Data FT + Uniform Pooling": the backbone fine-tuned on the same QA data without routing, evaluated with uniform pooling | ``policy="uniform"`` on the ``--data-ft-model`` checkpoint |
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple


class MethodError(ValueError):
    """An unknown method, or one whose resources (--clip, --data-ft-model) were not given."""


@dataclass(frozen=True)
class Method:
    name: str
    policy: str
    description: str
    model: str = "main"                    # which model answers: "main" or a resource name
    route_to: Optional[Dict[str, str]] = None
    scorer: Optional[Callable] = None      # resources -> FrameScorer (e.g. CLIP)
    needs: Tuple[str, ...] = ()            # resources it needs: "clip", "data_ft_model"
    kwargs: Dict[str, object] = field(default_factory=dict)
    # InternVL3* as the paper ran it: sample floor(B / tokens per full-resolution frame) frames
    # from the video itself (InternVL's segment rule for that n), not a subset of the F sampled
    frames_from_budget: bool = False

    def num_frames(self, budget: Optional[int], frames: int, frame_tokens: int) -> int:
        """How many frames to sample from the video for this row (``frames`` unless the method
        samples by the context budget; at least 1, so a budget below one frame fails clearly
        in planning)."""
        if not self.frames_from_budget or budget is None:
            return frames
        return max(1, budget // frame_tokens)

    # Qwen2.5-VL Budget as the paper ran it: all F frames at the largest resolution (the
    # backbone's own resize rule) whose tokens fit B, on a view of the same weights
    resize_to_budget: bool = False

    def check_model(self, model) -> None:
        """Refuse, before any weights load, a method the model's family cannot run
        (budget-resize on InternVL3, whose tower takes 448x448 frames only)."""
        if self.resize_to_budget:
            from ..backbones import backbone_class_for
            cls, config = backbone_class_for(model)
            if not cls.resizes_frames:
                h, w = cls.spec_from_config(config).size
                raise MethodError(f"--methods: {self.name!r} cannot run on this model: backbone "
                                  f"{cls.family!r} ({model}) takes {h}x{w} frames only; it "
                                  f"needs a Qwen2.5-VL model (InternVL3's budget baseline is "
                                  f"`budget`)")

    def router_for(self, vr, budget: Optional[int], frames: int):
        """The VideoRouter that answers this row: ``vr`` itself, or for ``resize_to_budget`` its
        sibling at ``vr.lm.budget_frame_size(frames, budget)`` (:func:`resized_router`)."""
        if not self.resize_to_budget or budget is None:
            return vr
        return resized_router(vr, vr.lm.budget_frame_size(frames, budget))

    @property
    def budgeted(self) -> bool:
        """False: one row whatever the budget (dense). Asked of the planners it uses."""
        from ..planning.policies import is_budgeted
        return is_budgeted(self.policy, self.route_to)

    def answer_kwargs(self, resources: dict) -> dict:
        kw = {"policy": self.policy, **self.kwargs}
        if self.route_to:
            kw["route_to"] = dict(self.route_to)
        if self.scorer is not None:
            kw["scorer"] = self.scorer(resources)
        return kw


METHODS: Dict[str, Method] = {}

# base VideoRouter -> {(h, w): its sibling at that frame size}; dies with the base model
_RESIZED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def resized_router(vr, size: Tuple[int, int]):
    """A VideoRouter over ``vr.lm.at_resolution(*size)`` -- the same weights and routers, its
    own visual cache -- built once per (model, size); ``vr`` itself at its own frame size. The
    sibling decodes videos at ``size`` itself (its frame spec), so the runtime core never sees a
    second resolution."""
    size = (int(size[0]), int(size[1]))
    if size == tuple(vr.lm.frame_spec.size):
        return vr
    per = _RESIZED.setdefault(vr, {})
    if size not in per:
        from ..runtime import VideoRouter
        # no throw-away request at load: the base runtime already paid CUDA's first-call costs
        per[size] = VideoRouter(vr.lm.at_resolution(*size), routers=vr.routers,
                                visual_cache_size=vr.visual_cache.size, decoding=vr.greedy.mode,
                                warm_request=False)
    return per[size]

# What each resource is, for the error when it is missing.
RESOURCE_FLAGS = {"clip": "--clip PATH (a local CLIPModel / SiglipModel directory)",
                  "data_ft_model": "--data-ft-model PATH (the Data FT checkpoint, e.g. "
                                   "runs/tiny/data_ft/hf)"}


def register_method(name: str, policy: str, description: str, **kw) -> Method:
    if name in METHODS:
        raise MethodError(f"method {name!r} is already registered")
    METHODS[name] = m = Method(name, policy, description, **kw)
    return m


def get_method(name: str) -> Method:
    m = METHODS.get(name)
    if m is None:
        from ..errors import expected_one_of
        raise MethodError(f"--methods: unknown method {name!r}; "
                          f"{expected_one_of(name, METHODS, word='some')}")
    return m


def parse_methods(text: str, resources: dict) -> list:
    """``"dense,auto,clip"`` -> Methods, checked for their resources (before any model loads)."""
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    if not names:
        raise MethodError("--methods: empty; give a comma-separated list")
    if len(set(names)) != len(names):
        raise MethodError(f"--methods: {text!r} names a method twice")
    methods = [get_method(n) for n in names]
    for m in methods:
        for need in m.needs:
            if resources.get(need) is None:
                raise MethodError(f"--methods: {m.name!r} needs {RESOURCE_FLAGS[need]}")
    return methods


def _clip_scorer(resources):
    return resources["clip_scorer"]


def _clip_matched(resources):
    from ..routing.scorers import TokenMatchedScorer
    return TokenMatchedScorer(resources["clip_scorer"])


register_method("dense", "dense", "every frame at full resolution, no budget")
register_method("budget", "budget", "InternVL3*: floor(B / frame tokens) full-resolution frames "
                "sampled from the video by the context budget", frames_from_budget=True)
register_method("budget-resize", "budget", "Qwen2.5-VL Budget (paper Appendix E): all F frames "
                "at the largest Qwen smart_resize resolution whose tokens fit B",
                resize_to_budget=True)
register_method("budget-subset", "budget", "InternVL3* variant: as many full-resolution frames as "
                "fit, a uniform subset of the F frames sampled")
register_method("uniform", "uniform", "one window for every frame, the finest that fits")
register_method("global", "global", "Global policy only")
register_method("fragment", "fragment", "Fragment policy only (Image Router)")
register_method("auto", "auto", "VideoRouter: the Semantic Router picks Global or Fragment")
register_method("clip", "fragment", "CLIP relevance pooling (paper Appendix D), token-matched: "
                "as many frames at s1 as the Image Router marks relevant, CLIP picks which",
                scorer=_clip_matched, needs=("clip",))
register_method("clip-fill", "fragment", "CLIP relevance pooling filling the budget: top CLIP "
                "frames at s1 until B is full (not token-matched)",
                scorer=_clip_scorer, needs=("clip",))
register_method("no-image-router", "uniform", "ablation (paper Table 4): w/o Image Router = "
                "Uniform Pooling for every query")
register_method("no-image-router-routed", "auto", "variant: the Semantic Router decides, "
                "Fragment -> uniform pooling", route_to={"fragment": "uniform"})
register_method("auto-literal", "auto", "VideoRouter with Algorithm 1 read literally (no "
                "relevant frame: every frame at s0)", route_to={"fragment": "fragment-literal"})
# Beyond the paper: the long-prompt planners (planning/long_prompt.py) behind the Semantic
# Router, the cap from the request's windows (64 by default) or the tiny model's 16 frames.
_LONG = {"fragment": "fragment-long", "global": "global-long"}
register_method("auto-long", "auto", "VideoRouter with the long-prompt planners: at most the "
                "backbone's trained frame count in the prompt", route_to=_LONG)
register_method("auto-long-16", "auto", "VideoRouter with the long-prompt planners capped at "
                "16 frames (the tiny model's training length)",
                route_to={k: v + "-16" for k, v in _LONG.items()})
register_method("auto-long-16-mid", "auto", "auto-long-16 with the relevant frames' "
                "neighbours at the Global window", route_to={"fragment": "fragment-long-16-mid",
                                                             "global": "global-long-16"})
register_method("no-semantic-router", "fragment", "ablation: always Fragment")
register_method("data-ft", "uniform", "Data FT + Uniform Pooling (backbone fine-tuned on the "
                "QA data without routing)", model="data_ft_model", needs=("data_ft_model",))

DEFAULT_METHODS = ("dense,budget,uniform,global,fragment,auto,no-image-router,"
                   "no-semantic-router")

__all__ = ["Method", "METHODS", "MethodError", "register_method", "get_method", "parse_methods",
           "DEFAULT_METHODS", "resized_router"]
