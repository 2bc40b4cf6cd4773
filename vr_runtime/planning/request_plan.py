"""The plan stage of one request: its visual budget B_img (computed by
:func:`~vr_runtime.planning.budget.b_img`, refused early when hopeless), the policy's windows
per frame fitted exactly into ``max_length`` (or into the latency budget,
:mod:`vr_runtime.planning.latency`), and the refusal of a prompt longer than the model's
context. ``req`` is a :class:`vr_runtime.request.Request` (read, not imported: it sits a floor
above); ``lm`` the backbone."""
from __future__ import annotations

from typing import Optional, Sequence

from vr_kernels import pooled_counts

from . import budget
from .latency import fit_latency
from .policies import FittedPlan, get_planner, is_budgeted, plan_fitted
from .scales import budget_from_text


def frame_times(lm, times) -> dict:
    """``times=`` for a backbone whose prompt writes each unit's time (else nothing)."""
    return {"times": times} if lm.uses_frame_times and times is not None else {}


def check_budget(lm, req, num_frames: int) -> None:
    """Refuse a hopeless budget before any frame is decoded (``BudgetError``: one frame's line
    and one frame at the coarse window must fit ``max_length`` with the generation and the
    margin). The budget depends only on the question and the frame count."""
    if not is_budgeted(req.policy, req.route_to) or req.budget is not None or num_frames < 1:
        return
    n_text = req.text_tokens(lm, num_frames, kept=[0])
    budget.visual_budget(req.max_length, n_text, req.max_new_tokens, req.margin,
                         grid=lm.grid, coarsest=req.windows.other_window)


def scoring_budget(lm, req, T: int) -> int:
    """The budget a rank-based scorer plans for: the fixed one, or B_img with every frame's
    line counted (safe for any plan)."""
    if req.budget is not None:
        return req.budget
    return budget_from_text(req.text_tokens(lm, T), req.max_length, req.max_new_tokens,
                            req.margin)


def plan_request(lm, req, policy: str, T: int, relevant: Optional[Sequence[bool]] = None,
                 times=None, latency=None) -> FittedPlan:
    """Windows per frame for ``policy``, fitted exactly: the plan plus the prompt text it
    implies fits ``max_length - max_new_tokens - margin`` (a fixed ``req.budget`` instead
    bounds the visual tokens alone, as in the paper's controlled protocol). ``latency``: a
    :class:`~vr_runtime.planning.latency.LatencyContext`, for ``ttft_budget_s``."""
    planner = get_planner(policy)
    grid, w = lm.grid, req.windows

    def text_for(kept):
        return req.text_tokens(lm, T, kept, **frame_times(lm, times))

    fitted = plan_fitted(planner, T, grid, relevant, w, text_for, req.max_length,
                         req.max_new_tokens, req.margin, budget=req.budget)
    if req.ttft_budget_s is not None and planner.budgeted:
        fitted = fit_latency(latency, req, planner, T, relevant, fitted, text_for)
    if sum(pooled_counts(fitted.plan, grid)) == 0:
        raise budget.BudgetError(f"visual budget {fitted.budget} holds no frame under policy "
                                 f"{policy!r}; raise max_length or lower max_new_tokens")
    return fitted


def max_positions(lm) -> Optional[int]:
    """The backbone's context: its decoder's ``max_position_embeddings`` (None if unset)."""
    n = getattr(lm.text_config, "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def check_length(lm, req, policy: str, planner, T: int, fitted: FittedPlan) -> None:
    """Refuse, before the vision encoder runs, a prompt (plus its new tokens) longer than the
    model's context, and an unbudgeted (dense) one over ``max_length`` unless the request says
    ``allow_over_length``: the paper's Dense row has no budget, not no limit. The line gives
    the frame count that fits."""
    total = fitted.text_tokens + budget.plan_tokens(fitted.plan, lm.grid) + req.max_new_tokens
    limits = []
    if max_positions(lm) is not None:
        limits.append((max_positions(lm), "the model's context (max_position_embeddings)",
                       "use fewer frames (--frames)"))
    if not planner.budgeted and not req.allow_over_length:
        limits.append((req.max_length, "max_length",
                       "use fewer frames (--frames), raise --max-length, a budgeted policy, "
                       "or allow it explicitly (--allow-over-length)"))
    for limit, what, advice in limits:
        if total <= limit:
            continue
        fixed = req.text_tokens(lm, 0, kept=[])
        per_frame = max((total - req.max_new_tokens - fixed) / max(T, 1), 1.0)
        fit = max(int((limit - req.max_new_tokens - fixed) // per_frame), 0)
        raise budget.BudgetError(
            f"policy {policy!r} at {T} frames makes a prompt of "
            f"{total - req.max_new_tokens} tokens, which with {req.max_new_tokens} new tokens "
            f"is over {what} of {limit}: at most {fit} frames fit; {advice}")


__all__ = ["frame_times", "check_budget", "scoring_budget", "plan_request", "max_positions",
           "check_length"]
