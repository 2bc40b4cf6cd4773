"""Long-prompt planners: at most the backbone's trained frame count in the prompt, the relevant
frames at full resolution, a coverage set spread in time, and the exact budget of every plan."""
import random

import pytest
import torch

from vr_kernels import pooled_counts
from vr_runtime.planning import budget as B
from vr_runtime.planning import long_prompt as L
from vr_runtime.planning import policies as P

GRID = (16, 16)
COUNTS = (16, 64, 256, 1024, 2048, 17, 63, 65, 255, 1023, 2047, 999)
Q = "What shape is the red object?"


def _needle(T, seed=0, runs=1, length=None):
    """Relevance of a short event (a run of frames, ~2 s of a 5-minute clip) or a few."""
    rnd = random.Random(f"{T}-{seed}")
    rel = [False] * T
    n = length or max(1, T // 150)
    for _ in range(runs):
        s = rnd.randrange(0, max(1, T - n))
        for t in range(s, min(T, s + n)):
            rel[t] = True
    return rel


def _text_for(kept):   # a prompt's text: a fixed part and one "FrameN:" line per kept frame
    return 60 + sum(5 + len(str(t + 1)) for t in kept)


@pytest.mark.parametrize("T", COUNTS)
@pytest.mark.parametrize("name", ["fragment-long", "fragment-long-16", "fragment-long-16-mid",
                                  "global-long-16"])
@pytest.mark.parametrize("max_length", [700, 1400, 4000, 12288])
def test_budget_is_exact_at_every_frame_count(T, name, max_length):
    planner, w = P.get_planner(name), P.Windows()
    rel = _needle(T, runs=2)
    gen, margin = 16, 100
    try:
        fitted = P.plan_fitted(planner, T, GRID, rel, w, _text_for, max_length, gen, margin)
    except B.BudgetError:
        assert max_length - gen - margin - _text_for([0]) < 16
        return
    used = B.plan_tokens(fitted.plan, GRID)
    kept = P.kept_frames(fitted.plan, GRID)
    avail = max_length - gen - margin
    assert fitted.text_tokens == _text_for(kept) and used + fitted.text_tokens <= avail
    assert used <= fitted.budget
    assert fitted.plan == planner.plan(T, fitted.budget, GRID, rel, w)
    # exact: one more budget token gives no plan that still fits with more tokens
    if fitted.budget < avail - _text_for(()):
        more = planner.plan(T, fitted.budget + 1, GRID, rel, w)
        grown = B.plan_tokens(more, GRID)
        assert grown == used or grown + _text_for(P.kept_frames(more, GRID)) > avail
    cap = 16 if "-16" in name else L.DEFAULT_PROMPT_FRAMES
    assert len(kept) <= cap


@pytest.mark.parametrize("T", COUNTS)
def test_frame_cap_time_order_and_relevant_frames_at_full_resolution(T):
    w = P.Windows(prompt_frames=16)
    rel = _needle(T)
    F1 = [t for t in range(T) if rel[t]]
    for b in (len(F1) * 256, len(F1) * 256 + 100, 5000, 12000, 10 ** 6):
        plan = P.get_planner("fragment-long").plan(T, b, GRID, rel, w)
        kept = P.kept_frames(plan, GRID)
        assert len(kept) <= 16 and B.plan_tokens(plan, GRID) <= b
        if T > 16:
            # relevant frames at s1 whenever they fit the cap and the budget
            assert all(plan[t] == 1 for t in F1)
            others = [t for t in kept if not rel[t]]
            assert all(plan[t] == 4 for t in others)
            assert len(others) == min(16 - len(F1), (b - 256 * len(F1)) // 16)
        else:
            assert plan == B.plan_fragment(rel, b, GRID)


def test_coverage_is_spread_evenly_in_time():
    T, w = 1024, P.Windows(prompt_frames=16)
    rel = [500 <= t < 506 for t in range(T)]
    plan = P.get_planner("fragment-long").plan(T, 12000, GRID, rel, w)
    cover = [t for t in P.kept_frames(plan, GRID) if not rel[t]]
    assert len(cover) == 10
    gaps = [b - a for a, b in zip(cover, cover[1:])]
    assert max(gaps) - min(gaps) <= 8 and cover[0] < 1024 // 10 and cover[-1] > 1024 * 9 // 10


def test_the_plan_is_deterministic():
    for T in (64, 1024, 2048):
        rel = _needle(T, runs=3)
        for name in ("fragment-long", "fragment-long-16-mid", "global-long-16"):
            a = P.get_planner(name).plan(T, 7000, GRID, rel, P.Windows())
            b = P.get_planner(name).plan(T, 7000, GRID, list(rel), P.Windows())
            assert a == b


def test_within_the_cap_it_is_the_papers_plan():
    for T in (1, 8, 16):
        rel = _needle(T)
        for b in (100, 1000, 5000):
            w = P.Windows(prompt_frames=16)
            assert P.get_planner("fragment-long").plan(T, b, GRID, rel, w) == \
                B.plan_fragment(rel, b, GRID)
            assert P.get_planner("global-long").plan(T, b, GRID, rel, w) == B.plan_global(T, b, GRID)


def test_neighbours_get_the_middle_window():
    T = 300
    rel = [100 <= t < 104 for t in range(T)]
    assert L.neighbours(rel) == [99, 104]
    plan = P.get_planner("fragment-long-16-mid").plan(T, 10 ** 5, GRID, rel, P.Windows())
    assert [plan[t] for t in (99, 100, 103, 104)] == [2, 1, 1, 2]
    assert len(P.kept_frames(plan, GRID)) == 16
    # the window from the request's windows wins over the planner's own
    plan = P.get_planner("fragment-long-16").plan(T, 10 ** 5, GRID, rel,
                                                  P.Windows(neighbour_window=(2, 4)))
    assert plan[99] == (2, 4) and plan[104] == (2, 4)


def test_no_relevant_frame_spreads_the_global_plan():
    T = 1024
    plan = P.get_planner("fragment-long-16").plan(T, 10 ** 5, GRID, [False] * T, P.Windows())
    kept = P.kept_frames(plan, GRID)
    assert kept == B.uniform_sample(range(T), 16) and all(plan[t] == 2 for t in kept)
    small = P.get_planner("global-long-16").plan(T, 64 * 5, GRID, None, P.Windows())
    assert len(P.kept_frames(small, GRID)) == 5


def test_too_many_relevant_frames_are_sampled_and_nothing_else_is_kept():
    T = 512
    rel = [t % 4 == 0 for t in range(T)]          # 128 relevant frames, cap 16
    plan = P.get_planner("fragment-long-16").plan(T, 10 ** 6, GRID, rel, P.Windows())
    kept = P.kept_frames(plan, GRID)
    assert kept == B.uniform_sample([t for t in range(T) if rel[t]], 16)
    assert all(plan[t] == 1 for t in kept)


def test_bad_cap_is_one_clear_line():
    with pytest.raises(ValueError, match=r"^prompt_frames: expected an int >= 1"):
        P.get_planner("fragment-long").plan(100, 1000, GRID, [False] * 100,
                                            P.Windows(prompt_frames=0))


def test_through_the_runtime_frames_keep_their_numbers_and_times(tiny_vr, frames):
    """The prompt a long plan makes: the kept frames in time order, each with its own sampled
    number, at most the cap, the relevant ones at full resolution."""
    from vr_runtime.routing.scorers import FixedRelevance
    T = 40
    rel = [t in (20, 21) for t in range(T)]
    res = tiny_vr.answer(frames(T, seed=3), Q, num_frames=T, max_length=4000, max_new_tokens=1,
                         policy="fragment-long-16", scorer=FixedRelevance(rel))
    r = res.report
    counts = r["frame_tokens"]
    kept = [t for t, c in enumerate(counts) if c]
    assert len(kept) == 16 and kept == sorted(kept)
    assert counts[20] == counts[21] == 256
    assert sum(counts) + r["text_tokens"] + 1 + 100 <= 4000
    ids, _ = tiny_vr.lm.build_prompt(Q, pooled_counts(r["windows"], tiny_vr.lm.grid))
    text = tiny_vr.lm.tokenizer.decode(ids)
    assert [f"Frame{t + 1}:" in text for t in range(T)] == [t in kept for t in range(T)]
    assert torch.equal(torch.tensor(pooled_counts(r["windows"], tiny_vr.lm.grid)),
                       torch.tensor(counts))
