"""Plans for long prompts (beyond the paper): at most ``prompt_frames`` frames in the prompt.

The paper's planners keep every sampled frame they can afford: at 1,024 sampled frames
Algorithm 1 keeps the few relevant frames at s_1 and hundreds of others at s_0, a prompt of
hundreds of frames that no backbone here was trained on (InternVL3 saw at most 64 frames, the
shipped tiny model 16). These plans cap the frame count instead:

- ``T <= prompt_frames``: the paper's own plan (Algorithm 1, or the Global plan), unchanged;
- otherwise the relevant frames at s_1 (as many as the cap and the budget hold, sampled
  uniformly among them as Algorithm 1 samples them), optionally their immediate neighbours at a
  middle window, and a *coverage set* of the other frames spread evenly in time at s_0, so
  that the prompt holds at most ``prompt_frames`` frames; with no relevant frame,
  ``prompt_frames`` frames spread evenly in time at s_g.

A plan is one window per sampled frame (0 = dropped), so the kept frames stay in time order
with their own frame numbers and timestamps. Every plan's tokens are <= the budget; the exact
fit into ``max_length`` is ``policies.plan_fitted``'s, as for every planner. Pure Python.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from .budget import _check, _tokens, plan_fragment, plan_global, uniform_sample

Grid = Tuple[int, int]

# The figure when the backbone gives none: InternVL3's training videos had at most 64 frames,
# the paper's sampled count.
DEFAULT_PROMPT_FRAMES = 64


def check_prompt_frames(n) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"prompt_frames: expected an int >= 1 (the most frames the backbone "
                         f"was trained on), got {n!r}")
    return n


def neighbours(relevant: Sequence[bool]) -> List[int]:
    """The frames just before and just after each run of relevant frames, in time order."""
    T = len(relevant)
    out = set()
    for t in range(T):
        if relevant[t]:
            continue
        if (t > 0 and relevant[t - 1]) or (t + 1 < T and relevant[t + 1]):
            out.add(t)
    return sorted(out)


def plan_global_long(num_frames: int, budget: int, grid: Grid = (16, 16), global_window=2,
                     prompt_frames: int = DEFAULT_PROMPT_FRAMES) -> list:
    """The Global plan over ``prompt_frames`` frames spread evenly in time (the plain Global
    plan when ``num_frames`` is within the cap)."""
    _check(num_frames, budget)
    M = check_prompt_frames(prompt_frames)
    if num_frames <= M:
        return plan_global(num_frames, budget, grid, global_window)
    picked = uniform_sample(range(num_frames), M)
    sub = plan_global(M, budget, grid, global_window)
    plan = [0] * num_frames
    for t, w in zip(picked, sub):
        plan[t] = w
    return plan


def plan_fragment_long(relevant: Sequence[bool], budget: int, grid: Grid = (16, 16),
                       relevant_window=1, other_window=4, global_window=2,
                       prompt_frames: int = DEFAULT_PROMPT_FRAMES,
                       neighbour_window=None) -> list:
    """Algorithm 1 within ``prompt_frames`` frames (see the module's docstring).

    Slots and tokens go first to the relevant frames (s_1), then to their neighbours
    (``neighbour_window``; None: no middle window, the neighbours compete as coverage), then
    to the coverage set (s_0), each group sampled uniformly in time when it does not fit."""
    rel = [bool(r) for r in relevant]
    T = len(rel)
    _check(T, budget)
    M = check_prompt_frames(prompt_frames)
    if T <= M or not any(rel):
        if T <= M:
            return plan_fragment(rel, budget, grid, relevant_window, other_window, global_window)
        return plan_global_long(T, budget, grid, global_window, M)
    plan = [0] * T
    left, slots = budget, M
    groups = [([t for t in range(T) if rel[t]], relevant_window)]
    near = neighbours(rel) if neighbour_window is not None else []
    if near:
        groups.append((near, neighbour_window))
    taken = set(groups[0][0]) | set(near)
    groups.append(([t for t in range(T) if t not in taken], other_window))
    for frames, window in groups:
        n = _tokens(window, grid)
        k = min(len(frames), slots, left // n)
        for t in uniform_sample(frames, k):
            plan[t] = window
        left -= k * n
        slots -= k
        if k < len(frames) and frames is groups[0][0]:
            # Algorithm 1's "sample critical" branch: the relevant frames did not all fit, so
            # nothing else is kept (no coverage frame displaces a relevant one)
            break
    return plan


def prompt_frames_of(windows, default: Optional[int] = None) -> int:
    """The cap a request's windows give (``Windows.prompt_frames``), else ``default``, else
    :data:`DEFAULT_PROMPT_FRAMES`."""
    n = getattr(windows, "prompt_frames", None)
    if n is None:
        n = default if default is not None else DEFAULT_PROMPT_FRAMES
    return check_prompt_frames(n)


__all__ = ["DEFAULT_PROMPT_FRAMES", "plan_fragment_long", "plan_global_long", "neighbours",
           "prompt_frames_of", "check_prompt_frames"]
