"""Visual-token budget and per-frame window planning (docs/CONTRACT.md section 2, Algorithm 1).

Pure Python on host ints: a plan is a list with one window per frame (0 = dropped),
ready for ``vr_kernels.pool_pack``. Every plan's token total is <= the budget.
"""
from __future__ import annotations

from typing import Sequence, Tuple

from vr_kernels.windows import normalize_window, window_tokens

Grid = Tuple[int, int]


class BudgetError(ValueError):
    """The budget cannot hold what was asked for (raised before any GPU work)."""


def b_img(max_length: int, text_tokens: int, gen_tokens: int, margin: int = 100) -> int:
    """B_img = L_max - L_text - L_gen - eps: the one place the visual budget is computed (it
    may be below a frame's tokens, or below 0: callers refuse or clamp it)."""
    return int(max_length) - int(text_tokens) - int(gen_tokens) - int(margin)


def visual_budget(max_length: int, text_tokens: int, gen_tokens: int, margin: int = 100, *,
                  grid: Grid = (16, 16), coarsest=4) -> int:
    """B_img = L_max - L_text - L_gen - eps.

    Raises ``BudgetError`` when B cannot hold a single frame at the coarsest allowed window
    (``coarsest``, default the Fragment low scale 4: 16 tokens on a 16x16 grid)."""
    for name, v in (("max_length", max_length), ("text_tokens", text_tokens),
                    ("gen_tokens", gen_tokens), ("margin", margin)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{name}: expected an int >= 0, got {v!r}")
    budget = b_img(max_length, text_tokens, gen_tokens, margin)
    need = window_tokens(coarsest, grid)
    if budget < need:
        raise BudgetError(
            f"visual budget {budget} = max_length {max_length} - text_tokens {text_tokens} - "
            f"gen_tokens {gen_tokens} - margin {margin} cannot hold one frame at window {coarsest} "
            f"({need} tokens); raise --max-length or shorten the question / --max-new-tokens")
    return budget


def uniform_sample(items: Sequence, k: int) -> list:
    """UniformSample(S, k): k members of S in temporal order at floor((i + 0.5) * |S| / k)."""
    n = len(items)
    if k <= 0 or n == 0:
        return []
    if k >= n:
        return list(items)
    return [items[((2 * i + 1) * n) // (2 * k)] for i in range(k)]


def _check(num_frames: int, budget: int) -> None:
    if not isinstance(num_frames, int) or num_frames < 0:
        raise ValueError(f"num_frames: expected an int >= 0, got {num_frames!r}")
    if not isinstance(budget, int) or budget < 0:
        raise ValueError(f"budget: expected an int >= 0, got {budget!r}")


def _tokens(w, grid: Grid) -> int:
    n = window_tokens(w, grid)
    if n <= 0:
        raise ValueError(f"window {w!r} must be >= 1")
    return n


def plan_global(num_frames: int, budget: int, grid: Grid = (16, 16), window=2) -> list:
    """Every frame at ``window``; if that exceeds the budget, UniformSample k = floor(B /
    tokens)."""
    _check(num_frames, budget)
    normalize_window(window, "window")
    per = _tokens(window, grid)
    if num_frames * per <= budget:
        return [window] * num_frames
    k = budget // per
    keep = set(uniform_sample(range(num_frames), k))
    return [window if t in keep else 0 for t in range(num_frames)]


EMPTY_FRAGMENT = ("global", "low")   # what Algorithm 1 does with no relevant frame


def plan_fragment(relevant: Sequence[bool], budget: int, grid: Grid = (16, 16),
                  relevant_window=1, other_window=4, global_window=2,
                  empty: str = "global") -> list:
    """Algorithm 1: relevant frames at ``relevant_window`` (s_1), the others at
    ``other_window`` (s_0), under ``budget``.

    With no relevant frame: ``empty="global"`` (default) returns the Global plan
    (``global_window``, s_g); ``empty="low"`` is Algorithm 1 read literally (F_1 is empty, so
    every frame is in F_0 at ``other_window``, uniformly subsampled if even that exceeds the
    budget)."""
    if empty not in EMPTY_FRAGMENT:
        raise ValueError(f"empty: expected one of {EMPTY_FRAGMENT}, got {empty!r}")
    rel = [bool(r) for r in relevant]
    _check(len(rel), budget)
    T = len(rel)
    if not any(rel):
        return plan_global(T, budget, grid, global_window if empty == "global" else other_window)
    n1, n0 = _tokens(relevant_window, grid), _tokens(other_window, grid)
    F1 = [t for t in range(T) if rel[t]]
    F0 = [t for t in range(T) if not rel[t]]
    C1, C0 = len(F1) * n1, len(F0) * n0
    if C1 + C0 <= budget:
        keep = set(F1) | set(F0)
    elif C1 <= budget:
        keep = set(F1) | set(uniform_sample(F0, (budget - C1) // n0))
    else:
        keep = set(uniform_sample(F1, budget // n1))
    return [(relevant_window if rel[t] else other_window) if t in keep else 0
            for t in range(T)]


def plan_dense(num_frames: int) -> list:
    """Every frame at full resolution; no budget (the Dense baseline)."""
    _check(num_frames, 0)
    return [1] * num_frames


def plan_budget(num_frames: int, budget: int, grid: Grid = (16, 16)) -> list:
    """InternVL3*: as many full-resolution frames as the budget holds, uniformly sampled."""
    return plan_global(num_frames, budget, grid, window=1)


# Windows from finest to coarsest; the 1x2 step is the paper's Uniform Pooling row
# (64 frames x 128 tokens = 8,192 at budget 12,288).
UNIFORM_LADDER = (1, (1, 2), 2, (2, 4), 4, (4, 8), 8, (8, 16), 16)


def plan_uniform(num_frames: int, budget: int, grid: Grid = (16, 16),
                 ladder: Sequence = UNIFORM_LADDER) -> list:
    """One fixed window for every frame: the finest on ``ladder`` whose total fits.

    Raises ``BudgetError`` if even the coarsest window does not fit all frames."""
    _check(num_frames, budget)
    for w in ladder:
        if num_frames * _tokens(w, grid) <= budget:
            return [w] * num_frames
    raise BudgetError(f"uniform policy: {num_frames} frames do not fit budget {budget} even at "
                      f"window {ladder[-1]!r}; use fewer frames or a larger budget")


def plan_tokens(plan: Sequence, grid: Grid = (16, 16)) -> int:
    return sum(window_tokens(w, grid) for w in plan)
