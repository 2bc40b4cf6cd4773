import random

import pytest

from vr_kernels import pooled_counts
from vr_runtime import (BudgetError, plan_budget, plan_fragment, plan_global, plan_tokens,
                        plan_uniform, uniform_sample, visual_budget)


def test_visual_budget_formula():
    assert visual_budget(12288, 180, 64, 100) == 12288 - 180 - 64 - 100


def test_visual_budget_too_small_names_numbers():
    with pytest.raises(BudgetError) as e:
        visual_budget(300, 180, 64, 100)
    msg = str(e.value)
    for n in ("300", "180", "64", "100"):
        assert n in msg
    assert isinstance(e.value, ValueError)


def test_uniform_sample_positions():
    assert uniform_sample(list(range(10)), 3) == [1, 5, 8]
    assert uniform_sample(list("abcd"), 4) == list("abcd")
    assert uniform_sample(list("abcd"), 0) == []
    s = list(range(100, 164))
    got = uniform_sample(s, 7)
    assert got == [s[(i * 2 + 1) * 64 // 14] for i in range(7)]
    assert got == sorted(got)


def test_global_fits_and_falls_back():
    assert plan_global(64, 12288) == [2] * 64
    p = plan_global(64, 1000)  # 64 tokens per frame -> 15 frames
    assert plan_tokens(p) <= 1000 and sum(1 for w in p if w) == 15
    kept = [t for t, w in enumerate(p) if w]
    assert kept == uniform_sample(list(range(64)), 15)


@pytest.mark.parametrize("seed", range(30))
def test_fragment_properties(seed):
    rng = random.Random(seed)
    T = rng.randint(1, 128)
    rel = [rng.random() < rng.random() for _ in range(T)]
    B = rng.randint(16, 20000)
    p = plan_fragment(rel, B)
    assert len(p) == T
    assert plan_tokens(p) <= B
    assert p == plan_fragment(rel, B)  # deterministic
    F1 = [t for t in range(T) if rel[t]]
    F0 = [t for t in range(T) if not rel[t]]
    if not F1:
        assert p == plan_global(T, B)
        return
    for t in range(T):
        assert p[t] in (0, 1 if rel[t] else 4)
    if 256 * len(F1) <= B:  # Algorithm 1 must keep every relevant frame ...
        assert all(p[t] == 1 for t in F1)
        k = min(len(F0), (B - 256 * len(F1)) // 16)  # ... and as many background frames as fit
        assert sum(1 for t in F0 if p[t]) == k
    else:
        k = B // 256
        assert [t for t in F1 if p[t]] == uniform_sample(F1, k)
        assert all(p[t] == 0 for t in F0)


def test_fragment_custom_scales_counts_match_kernel():
    rel = [t % 5 == 0 for t in range(64)]
    p = plan_fragment(rel, 5000, relevant_window=2, other_window=(4, 8))
    assert plan_tokens(p) == sum(pooled_counts(p)) <= 5000


def test_budget_and_uniform_policies():
    B = visual_budget(12288, 180, 64)
    p = plan_budget(64, B)
    assert set(p) <= {0, 1} and plan_tokens(p) <= B and sum(p) == B // 256
    u = plan_uniform(64, B)
    assert u == [(1, 2)] * 64 and plan_tokens(u) == 8192  # the paper's Uniform Pooling row
    assert plan_uniform(8, 10**6) == [1] * 8
    with pytest.raises(BudgetError):
        plan_uniform(64, 10)


def test_plan_fragment_takes_the_window_names_only():
    rel = [True, False, False, True, False]
    assert plan_fragment(rel, 600, relevant_window=2, other_window=4, global_window=2) == \
        plan_fragment(rel, 600, (16, 16), 2, 4, 2)
    for old in ("high", "low", "global_scale", "hihg"):
        with pytest.raises(TypeError, match=old):
            plan_fragment(rel, 600, **{old: 2})
