"""policies.plan_fitted: the one fitting both the runtime's plan stage and Stage 3 training use."""
import vr_runtime.planning.policies as P
from vr_runtime.planning.budget import plan_tokens


def _text_for(kept):
    return 40 + 6 * len(tuple(kept))


def test_three_ways_a_plan_is_fitted():
    T, grid, w = 12, (16, 16), P.Windows()
    rel = [t % 3 == 0 for t in range(T)]
    frag = P.get_planner("fragment")
    # budgeted, no fixed budget: exactly fit_plan's answer
    got = P.plan_fitted(frag, T, grid, rel, w, _text_for, 2000, 16, 64)
    want = P.fit_plan(lambda b: frag.plan(T, b, grid, rel, w), _text_for, T, 2000, 16, 64, grid,
                      coarsest=w.other_window)
    assert got == want and plan_tokens(got.plan, grid) + got.text_tokens <= 2000 - 16 - 64
    # a fixed budget bounds the visual tokens alone, whatever max_length says
    fixed = P.plan_fitted(frag, T, grid, rel, w, _text_for, 10, 16, 64, budget=1000)
    assert fixed.budget == 1000 and fixed.plan == frag.plan(T, 1000, grid, rel, w)
    assert fixed.text_tokens == _text_for(P.kept_frames(fixed.plan, grid))
    # an unbudgeted planner (dense) plans without a budget, even when one is given
    dense = P.plan_fitted(P.get_planner("dense"), T, grid, None, w, _text_for, 10, 16, 64,
                          budget=1000)
    assert dense.budget is None and plan_tokens(dense.plan, grid) == T * 256
