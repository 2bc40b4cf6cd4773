"""The policy module: registry, decision rule, and the exact fit of a plan and its own text."""
import math
import random

import pytest
import torch

from vr_kernels import pooled_counts
from vr_runtime.planning import budget as B
from vr_runtime.planning import policies as P
from vr_runtime.planning.request_plan import plan_request

Q = "Which color is the square in the video?"


def test_registry_names_and_one_registration_adds_a_policy(tiny_vr, frames):
    assert P.policy_names()[:6] == ("auto", "global", "fragment", "dense", "budget", "uniform")
    with pytest.raises(ValueError, match="already registered"):
        P.register_planner("global")(lambda *a: [])

    @P.register_planner("every-other", description="test policy: even frames 2x2, odd dropped")
    def every_other(T, budget, grid, relevant, w):
        return [2 if t % 2 == 0 else 0 for t in range(T)]
    try:
        r = tiny_vr.answer(frames(5, seed=1), Q, num_frames=5, max_length=2000, max_new_tokens=1,
                           policy="every-other").report
        assert r["policy"] == "every-other" and r["windows"] == [2, 0, 2, 0, 2]
        assert r["frame_tokens"] == [64, 0, 64, 0, 64]
    finally:
        del P.PLANNERS["every-other"]
    with pytest.raises(ValueError, match="policy 'every-other'"):
        tiny_vr.answer(frames(2), Q, num_frames=2, policy="every-other")


def test_relevant_from_logits_is_sigmoid_above_threshold():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1000, generator=g) * 4
    for th in (0.1, 0.5, 0.73, 0.99):
        want = torch.sigmoid(logits) > th
        got = P.relevant_from_logits(logits, th)
        # Away from the boundary the two agree exactly (float rounding at the boundary aside).
        far = (torch.sigmoid(logits) - th).abs() > 1e-6
        assert torch.equal(got[far], want[far])
        assert P.relevant_from_probs(torch.sigmoid(logits).tolist(), th) == want.tolist()


def test_policy_from_logits():
    name, p = P.policy_from_logits(torch.tensor([0.2, 1.5]))
    assert name == "fragment" and p == pytest.approx(math.exp(1.5) / (math.exp(0.2) + math.exp(1.5)))
    assert P.policy_from_logits(torch.tensor([[3.0, -1.0]]))[0] == "global"


def test_topk_relevant_fills_the_budget():
    w = P.Windows()
    scores = [0.1, 0.9, 0.3, 0.8, 0.2, 0.95]
    # 6 frames at 16 = 96; each promotion to 256 costs 240: 600 holds two promotions.
    rel = P.topk_relevant(scores, 600, (16, 16), w)
    assert rel == [False, False, False, False, False, True] or sum(rel) == 2
    assert rel == [False, True, False, False, False, True]
    assert sum(P.topk_relevant(scores, 10, (16, 16), w)) == 1      # at least one
    assert all(P.topk_relevant(scores, 10 ** 6, (16, 16), w))


def _line_cost(t):  # "FrameN: <img></img>\n": longer labels for more digits, like a BPE
    return 5 + len(str(t + 1))


@pytest.mark.parametrize("seed", range(25))
def test_fit_plan_fits_and_wastes_at_most_one_frame(seed):
    rnd = random.Random(seed)
    T = rnd.choice([1, 3, 16, 64, 200, 1200])
    grid = (16, 16)
    w = P.Windows()
    policy = rnd.choice(["global", "fragment", "budget", "uniform"])
    rel = [rnd.random() < 0.3 for _ in range(T)]
    base = rnd.randint(20, 200)
    max_length = rnd.randint(600, 40000)
    gen, margin = rnd.choice([0, 64]), 100
    planner = P.get_planner(policy)

    def text_for(kept):
        return base + sum(_line_cost(t) for t in kept)

    try:
        fitted = P.fit_plan(lambda b: planner.plan(T, b, grid, rel, w), text_for, T, max_length,
                            gen, margin, grid, coarsest=w.other_window)
    except B.BudgetError:
        # No frame fits at the coarse window, or uniform (which never drops frames) cannot fit
        # every frame even at its coarsest window.
        assert max_length - gen - margin - text_for([0]) < 16 or (
            policy == "uniform" and T + text_for(range(T)) > max_length - gen - margin)
        return
    used = sum(pooled_counts(fitted.plan, grid))
    kept = [t for t, c in enumerate(pooled_counts(fitted.plan, grid)) if c]
    assert fitted.text_tokens == text_for(kept)
    assert used + fitted.text_tokens + gen + margin <= max_length          # it fits
    assert fitted.plan == planner.plan(T, fitted.budget, grid, rel, w)     # it is that planner's plan
    if len(kept) < T:  # something was left out: at most one frame's tokens (+ its line) unused
        largest = max(B.window_tokens(x, grid) for x in (w.relevant_window, 1, w.global_window))
        slack = max_length - gen - margin - used - fitted.text_tokens
        assert slack < largest + _line_cost(T - 1), (policy, T, slack)


def test_exact_budget_uses_the_context_at_1200_frames(tiny_vr):
    """1,200 sampled frames at max_length 16,000: the budget that counted every frame's line
    used only ~6K of the 16K tokens; the fitted plan plus its text fills max_length but for
    less than one frame (64 tokens at 2x2 + its line)."""
    T, L = 1200, 16000
    req = tiny_vr.request(torch.zeros(1), Q, num_frames=T, max_length=L, max_new_tokens=64,
                          policy="global")
    fitted = plan_request(tiny_vr.lm, req, "global", T)
    used = sum(pooled_counts(fitted.plan, tiny_vr.lm.grid))
    n_text = fitted.text_tokens
    ids, _ = tiny_vr.lm.build_prompt(Q, pooled_counts(fitted.plan, tiny_vr.lm.grid))
    assert ids.numel() == used + n_text                        # the real prompt has that length
    assert ids.numel() + 64 + 100 <= L
    assert L - 64 - 100 - ids.numel() < 64 + 12
    all_lines = tiny_vr.lm.text_tokens(Q, T)
    assert used > L - 164 - all_lines + 4000                   # far more than the old budget


def test_hopeless_budget_fails_before_decoding(tiny_vr, monkeypatch):
    import vr_runtime.video.load as V

    def boom(*a, **k):
        raise AssertionError("decoded a video for a budget that cannot hold one frame")
    monkeypatch.setattr(V, "load_video", boom)
    with pytest.raises(B.BudgetError, match="cannot hold one frame"):
        tiny_vr.answer("/nonexistent/clip.mp4", Q, num_frames=64, max_length=150,
                       max_new_tokens=8)
