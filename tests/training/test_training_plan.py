"""Stage 3 training plans match what the runtime decides at inference: a random L_max from
``train_max_length`` (tight budgets drop frames exactly as Algorithm 1 does) and, with
``false_positive_prob``, one irrelevant frame promoted to relevant."""
import pytest
import torch

from vr_runtime.planning.budget import plan_fragment
from vr_runtime.planning.request_plan import plan_request
from vr_runtime.runtime import VideoRouter
from vr_runtime.training.config import load_config
from stage_helpers import stage3_trainee as _trainee

T, TEXT = 16, 138
Q = "What shape is the red object?"


def _ex(relevant):
    return {"policy": 1, "question": Q,
            "labels": torch.tensor([float(t in relevant) for t in range(T)])}


def test_tight_training_budget_drops_frames_like_the_runtime(tiny_lm):
    rel = sorted(torch.randperm(T)[:3].tolist())
    mask = [t in rel for t in range(T)]
    L = 800 + TEXT + 64 + 100                     # 3 x 256 full frames + a few at 16 tokens
    tr = _trainee(tiny_lm, train_max_length=[L, L], false_positive_prob=0.0)
    ex = _ex(rel)
    plan, fragment = tr.training_plan(torch.tensor([0.0, 1.0]), torch.zeros(T), ex)
    assert fragment
    # The runtime's own plan stage on the same question, frame count and L_max.
    vr = VideoRouter(tiny_lm, tr.routers)
    req = vr.request(torch.zeros(T, 3, 448, 448), Q, num_frames=T, max_length=L, policy="fragment",
                     relevant=mask)
    fitted = plan_request(vr.lm, req, "fragment", T, mask)
    assert plan == fitted.plan
    assert plan == plan_fragment(mask, fitted.budget, tr.grid, relevant_window=1, other_window=4)
    low = sum(w == 4 for w in plan)
    assert [t for t in range(T) if plan[t] == 1] == rel and 0 < low < T - 3  # Algorithm 1 drops


def test_false_positive_adds_one_full_resolution_frame(tiny_lm):
    torch.manual_seed(0)
    rel = sorted(torch.randperm(T)[:2].tolist())
    tr = _trainee(tiny_lm, train_max_length=[], false_positive_prob=1.0)
    ex = _ex(rel)
    before = ex["labels"].clone()
    seen = set()
    for _ in range(20):
        plan, _ = tr.training_plan(torch.tensor([0.0, 1.0]), torch.zeros(T), ex)
        full = [t for t in range(T) if plan[t] == 1]
        assert set(rel) < set(full) and len(full) == len(rel) + 1
        seen |= set(full) - set(rel)
    assert len(seen) > 1                          # a random frame, not a fixed one
    assert torch.equal(ex["labels"], before)      # the example's labels (L_img) are untouched


def test_global_plans_get_no_false_positive(tiny_lm):
    tr = _trainee(tiny_lm, train_max_length=[], false_positive_prob=1.0)
    ex = {"policy": 0, "labels": None, "question": Q}
    plan, fragment = tr.training_plan(torch.tensor([1.0, 0.0]), torch.zeros(T), ex)
    assert not fragment and plan == [2] * T


def test_plan_policy_uniform_is_the_data_ft_control(tiny_lm):
    """plan_policy="uniform" (Data FT + Uniform Pooling): every plan is the uniform planner's,
    fitted like the runtime's, whatever the routers or the labels say."""
    from vr_runtime.training.config import ConfigError
    L = 1400
    tr = _trainee(tiny_lm, plan_policy="uniform", train_max_length=[L, L])
    vr = VideoRouter(tiny_lm, tr.routers)
    req = vr.request(torch.zeros(T, 3, 448, 448), Q, num_frames=T, max_length=L, policy="uniform")
    want = plan_request(vr.lm, req, "uniform", T).plan
    for pol, rel in (([0.0, 1.0], [3, 4]), ([1.0, 0.0], [])):
        plan, fragment = tr.training_plan(torch.tensor(pol), torch.randn(T), _ex(rel))
        assert plan == want and not fragment
    assert len(set(want)) == 1 and want[0] not in (0, 1)       # one pooled window, all frames
    try:
        load_config("tiny_data_ft", plan_policy="fragment")
    except ConfigError as e:
        assert "plan_policy" in str(e)
    else:
        raise AssertionError("plan_policy='fragment' (needs frame scores) must be refused")
    assert load_config("tiny_data_ft").plan_policy == "uniform"
