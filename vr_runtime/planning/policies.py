"""Allocation policies in one place, for the runtime, the training and the command line: their
names, the Semantic Router's classes, the Image Router's decision threshold, the planner
registry, and the exact fit of a plan and its prompt text into ``max_length``.

A policy is a planner: ``(num_frames, budget, grid, relevant, windows) -> one window per frame``
(0 = dropped; docs/CONTRACT.md section 2). ``auto`` is not a planner: the Semantic Router picks one of
:data:`SEMANTIC_CLASSES`. Adding a policy is one :func:`register_planner` call.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from . import budget, long_prompt
from .budget import BudgetError

AUTO = "auto"
SEMANTIC_CLASSES = ("global", "fragment")   # Semantic Router class 0 / 1 (paper: y_s)
UNTRAINED_AUTO_POLICY = "global"            # what `auto` does without trained routers
DEFAULT_THRESHOLD = 0.5                     # frame relevant iff sigmoid(logit) > threshold

Grid = Tuple[int, int]


@dataclass(frozen=True)
class Windows:
    """The paper's pooling windows (an int ``s`` is ``s x s``, a pair ``(sh, sw)``)."""
    relevant_window: object = 1   #: s_1: the Image Router's relevant frames (Fragment)
    other_window: object = 4      #: s_0: the other frames (Fragment); the coarsest window
    global_window: object = 2     #: s_g: every frame (Global)
    #: Long-prompt planners only (beyond the paper): the most frames in the prompt, the figure
    #: the backbone was trained on (None: the planner's own figure; ``long_prompt.py``).
    prompt_frames: Optional[int] = None
    #: Long-prompt planners only: the relevant frames' neighbours' middle window (None: none).
    neighbour_window: object = None


@dataclass(frozen=True)
class Planner:
    name: str
    plan: Callable[..., list]     # (T, budget, grid, relevant, windows) -> windows per frame
    needs_relevance: bool         # needs the frame scores (so Z) before planning
    budgeted: bool = True         # False: ignores the budget (dense)
    description: str = ""
    # what the plan is when no frame is relevant, for the report ("" : nothing to say)
    when_none_relevant: str = ""


PLANNERS: Dict[str, Planner] = {}


def register_planner(name: str, needs_relevance: bool = False, budgeted: bool = True,
                     description: str = "", when_none_relevant: str = ""):
    """Decorator: ``fn(num_frames, budget, grid, relevant, windows) -> plan`` becomes policy
    ``name`` for ``VideoRouter.answer(policy=name)``, the CLI and training."""
    def deco(fn):
        if name in PLANNERS or name == AUTO:
            raise ValueError(f"policy {name!r} is already registered")
        PLANNERS[name] = Planner(name, fn, needs_relevance, budgeted, description,
                                 when_none_relevant)
        return fn
    return deco


@register_planner("global", description="every frame pooled s_g x s_g (uniform subsampling "
                                         "when that does not fit)")
def _global(T, budget_, grid, relevant, w: Windows):
    return budget.plan_global(T, budget_, grid, w.global_window)


@register_planner("fragment", needs_relevance=True,
                  description="Algorithm 1: relevant frames at s1, the others at s0",
                  when_none_relevant="the Global plan was used")
def _fragment(T, budget_, grid, relevant, w: Windows):
    return budget.plan_fragment(relevant, budget_, grid, w.relevant_window,
                                w.other_window, w.global_window)


@register_planner("dense", budgeted=False, description="every frame at full resolution, no budget")
def _dense(T, budget_, grid, relevant, w: Windows):
    return budget.plan_dense(T)


@register_planner("budget", description="InternVL3*: as many full-resolution frames as fit")
def _budget(T, budget_, grid, relevant, w: Windows):
    return budget.plan_budget(T, budget_, grid)


@register_planner("uniform", description="one window for every frame, the finest that fits")
def _uniform(T, budget_, grid, relevant, w: Windows):
    return budget.plan_uniform(T, budget_, grid)


@register_planner("fragment-literal", needs_relevance=True,
                  description="Algorithm 1 read literally: with no relevant frame every frame "
                              "at s0 (the default `fragment` uses the Global plan instead)",
                  when_none_relevant="every frame at s0 (Algorithm 1 literally)")
def _fragment_literal(T, budget_, grid, relevant, w: Windows):
    return budget.plan_fragment(relevant, budget_, grid, w.relevant_window,
                                w.other_window, w.global_window, empty="low")


def register_long_planners(suffix: str = "", prompt_frames: Optional[int] = None,
                           neighbour_window=None) -> None:
    """The long-prompt planners (``long_prompt.py``, beyond the paper) as ``fragment-long`` and
    ``global-long`` plus ``suffix``: their cap is ``Windows.prompt_frames``, else
    ``prompt_frames``, else ``long_prompt.DEFAULT_PROMPT_FRAMES``; the neighbours' window is
    ``Windows.neighbour_window``, else ``neighbour_window``."""
    def frag(T, budget_, grid, relevant, w: Windows):
        nb = w.neighbour_window if w.neighbour_window is not None else neighbour_window
        return long_prompt.plan_fragment_long(
            relevant, budget_, grid, w.relevant_window, w.other_window, w.global_window,
            long_prompt.prompt_frames_of(w, prompt_frames), nb)

    def glob(T, budget_, grid, relevant, w: Windows):
        return long_prompt.plan_global_long(T, budget_, grid, w.global_window,
                                            long_prompt.prompt_frames_of(w, prompt_frames))

    cap = prompt_frames or "the backbone's trained"
    register_planner(f"fragment-long{suffix}", needs_relevance=True,
                     description=f"beyond the paper: Algorithm 1 within {cap} frames (relevant "
                                 f"at s1, a coverage set spread in time at s0)",
                     when_none_relevant="the Global plan over frames spread in time was used")(frag)
    if neighbour_window is not None:
        return   # the Global plan has no relevant frames, so no neighbours: global-long's own
    register_planner(f"global-long{suffix}",
                     description=f"beyond the paper: the Global plan over {cap} frames spread "
                                 f"in time")(glob)


# The cap from the request's windows (the backbone's figure); the shipped tiny model's own
# figure, 16 frames (every tiny_stage*.json trains on 16), by name until a request can say so;
# and the variants that give the relevant frames' neighbours the Global window (s_g = 2).
register_long_planners()
register_long_planners("-16", prompt_frames=16)
register_long_planners("-mid", neighbour_window=2)
register_long_planners("-16-mid", prompt_frames=16, neighbour_window=2)


def policy_names() -> Tuple[str, ...]:
    """Every value ``policy=`` accepts: ``auto`` and the registered planners."""
    return (AUTO,) + tuple(PLANNERS)


def check_policy(name: str) -> str:
    """``--policy``/``policy=``, checked before anything loads: one line naming the choices."""
    if name not in policy_names():
        from ..errors import expected_one_of
        raise ValueError(f"--policy {name!r}: {expected_one_of(name, policy_names())}")
    return name


def get_planner(name: str) -> Planner:
    p = PLANNERS.get(name)
    if p is None:
        from ..errors import expected_one_of
        raise ValueError(f"policy {name!r}: {expected_one_of(name, policy_names())}")
    return p


def is_budgeted(policy: str, route_to: Optional[Mapping[str, str]] = None) -> bool:
    """Whether ``policy`` works under a visual budget, asked of the planners themselves (never
    of their names): a planner says so; ``auto`` does when every planner it may route to does
    (``route_to``: class -> planner, default each class's own planner)."""
    if policy == AUTO:
        routes = dict(zip(SEMANTIC_CLASSES, SEMANTIC_CLASSES))
        routes.update(route_to or {})
        return all(get_planner(p).budgeted for p in routes.values())
    return get_planner(policy).budgeted


# ----------------------------------------------------------------------------- decisions
def policy_from_logits(logits) -> Tuple[str, float]:
    """Semantic Router logits [2] (a tensor) -> (policy name, its softmax probability)."""
    probs = logits.float().reshape(-1).softmax(-1)
    cls = int(probs.argmax())
    return SEMANTIC_CLASSES[cls], float(probs[cls])


def relevant_from_probs(probs: Sequence[float], threshold: float = DEFAULT_THRESHOLD) -> List[bool]:
    return [float(p) > threshold for p in probs]


def relevant_from_logits(logits, threshold: float = DEFAULT_THRESHOLD):
    """sigmoid(logit) > threshold, decided on the logits (no sigmoid round-off near 0/1)."""
    return logits > math.log(threshold / (1.0 - threshold))


def topk_relevant(scores: Sequence[float], budget_: int, grid: Grid, w: Windows) -> List[bool]:
    """The highest-scoring frames that Algorithm 1 can keep at ``w.relevant_window`` with every
    other frame at ``w.other_window`` (at least one; ties broken by temporal order): relevance
    from a score ranking with no calibrated threshold (the CLIP baseline, paper Appendix D)."""
    T = len(scores)
    n1 = budget.window_tokens(w.relevant_window, grid)
    n0 = budget.window_tokens(w.other_window, grid)
    k = 1 if n1 == n0 else max(1, min(T, (budget_ - T * n0) // (n1 - n0)))
    order = sorted(range(T), key=lambda t: (-float(scores[t]), t))[:k]
    keep = set(order)
    return [t in keep for t in range(T)]


def topk_of(scores: Sequence[float], k: int) -> List[bool]:
    """The ``k`` highest-scoring frames (ties broken by temporal order) marked relevant."""
    keep = set(sorted(range(len(scores)), key=lambda t: (-float(scores[t]), t))[:max(k, 0)])
    return [t in keep for t in range(len(scores))]


def kept_frames(plan: Sequence, grid: Grid) -> List[int]:
    """Indices of the frames a plan keeps (a window with at least one token)."""
    return [t for t, w in enumerate(plan) if budget.window_tokens(w, grid) > 0]


# ----------------------------------------------------------------------------- exact budget
@dataclass(frozen=True)
class FittedPlan:
    plan: list                # one window per frame
    budget: Optional[int]     # visual budget B_img the plan was made under (None: dense)
    text_tokens: int          # non-visual prompt tokens with the kept frames' lines
    notes: tuple = ()         # what the report should say about how the plan was chosen


def fit_plan(plan_for: Callable[[int], list], text_for: Callable[[Sequence[int]], int],
             num_frames: int, max_length: int, gen_tokens: int, margin: int, grid: Grid,
             coarsest=4) -> FittedPlan:
    """The plan for the largest visual budget whose plan *plus the text it implies* fits
    ``max_length - gen_tokens - margin``.

    L_text depends on the plan (a dropped frame's "FrameN:" line is not in the prompt), so the
    budget is searched: from the safe one (every frame's line counted) up to the one with no
    frame line at all, by bisection on whether plan + its own text fit. A plan's text only
    shrinks as frames drop, so the result wastes at most about one frame's tokens, where the
    all-lines budget wasted every dropped frame's line (6,123 of 16,000 tokens used at 1,200
    frames). ``plan_for(budget)`` may raise ``BudgetError`` (e.g. uniform): that budget does not
    fit. Raises ``BudgetError`` (the four numbers) when no frame fits at ``coarsest``."""
    memo: Dict[tuple, int] = {}

    def text(kept) -> int:
        key = tuple(kept)
        if key not in memo:
            memo[key] = text_for(key)
        return memo[key]

    avail = max_length - gen_tokens - margin
    if num_frames > 0:
        # One frame's line must fit with one frame at the coarsest window (docs/CONTRACT.md section 2's error).
        budget.visual_budget(max_length, text([0]), gen_tokens, margin, grid=grid,
                             coarsest=coarsest)
    safe = avail - text(range(num_frames))
    hi = avail - text(())

    def attempt(b: int):
        if b < 0:
            return None
        try:
            plan = plan_for(b)
        except BudgetError:
            return None
        kept = kept_frames(plan, grid)
        used = budget.plan_tokens(plan, grid)
        t = text(kept)
        return FittedPlan(plan, b, t) if used + t <= avail else None

    best = attempt(safe)
    lo = max(safe, 0) if best is not None else -1
    while lo < hi:  # invariant: attempt(lo) fits (or lo = -1), attempt(hi + 1) is not tried
        mid = (lo + hi + 1) // 2
        got = attempt(mid)
        if got is not None:
            best, lo = got, mid
        else:
            hi = mid - 1
    if best is None:
        raise BudgetError(f"max_length {max_length} holds no frame: text {text(range(num_frames))} "
                          f"+ gen_tokens {gen_tokens} + margin {margin}; raise --max-length or "
                          f"use fewer frames")
    return best


def plan_fitted(planner: "Planner", num_frames: int, grid: Grid,
                relevant: Optional[Sequence[bool]], windows: Windows,
                text_for: Callable[[Sequence[int]], int], max_length: int, gen_tokens: int,
                margin: int, budget: Optional[int] = None) -> FittedPlan:
    """``planner``'s plan of ``num_frames`` frames, fitted as inference fits it (the runtime and
    Stage 3 training both call this, so training sees the plans inference makes): an unbudgeted
    planner's plan as it is; a fixed ``budget`` bounds the visual tokens alone (the paper's
    controlled protocol); otherwise ``fit_plan``, the largest budget whose plan plus its own
    text fits ``max_length - gen_tokens - margin``."""
    def plan_for(b):
        return planner.plan(num_frames, b, grid, relevant, windows)

    if not planner.budgeted or budget is not None:
        b = budget if planner.budgeted else None
        plan = plan_for(b)
        return FittedPlan(plan, b, text_for(kept_frames(plan, grid)))
    return fit_plan(plan_for, text_for, num_frames, max_length, gen_tokens, margin, grid,
                    coarsest=windows.other_window)


__all__ = ["AUTO", "SEMANTIC_CLASSES", "UNTRAINED_AUTO_POLICY", "DEFAULT_THRESHOLD", "Windows",
           "Planner", "PLANNERS", "register_planner", "register_long_planners", "policy_names",
           "get_planner",
           "policy_from_logits", "relevant_from_probs", "relevant_from_logits", "topk_relevant",
           "topk_of",
           "FittedPlan", "fit_plan", "plan_fitted", "kept_frames"]
