"""Stage 3's ``train_budget_fraction`` (for the synthetic task v2's 8-64 frames): each example's
plan gets a fixed visual budget of a fraction of its own dense tokens, the plan the runtime makes
with ``answer(budget=...)`` (routing-eval measures at a quarter)."""
import pytest
import torch

from vr_runtime.planning.budget import plan_fragment, plan_global
from vr_runtime.planning.request_plan import plan_request
from vr_runtime.runtime import VideoRouter
from vr_runtime.training.config import ConfigError, load_config
from stage_helpers import stage3_trainee

Q = "What shape is the red object?"


def _trainee(lm, **over):
    return stage3_trainee(lm, **{"false_positive_prob": 0.0, **over})


@pytest.mark.parametrize("T", [8, 16, 64])
def test_a_quarter_of_dense_plans_as_the_runtime_does_with_that_budget(tiny_lm, T):
    rel = list(range(1, 1 + max(1, T // 8)))
    mask = [t in rel for t in range(T)]
    tr = _trainee(tiny_lm, train_budget_fraction=[0.25, 0.25])
    ex = {"policy": 1, "question": Q, "labels": torch.tensor([float(m) for m in mask])}
    plan, fragment = tr.training_plan(torch.tensor([0.0, 1.0]), torch.zeros(T), ex)
    budget = T * 256 // 4
    assert fragment and plan == plan_fragment(mask, budget, tr.grid, relevant_window=1, other_window=4)
    vr = VideoRouter(tiny_lm, tr.routers)
    req = vr.request(torch.zeros(T, 3, 448, 448), Q, num_frames=T, policy="fragment",
                     relevant=mask, budget=budget)
    assert plan == plan_request(vr.lm, req, "fragment", T, mask).plan
    gplan, gfrag = tr.training_plan(torch.tensor([1.0, 0.0]), torch.zeros(T),
                                    {"policy": 0, "question": Q})
    assert not gfrag and gplan == plan_global(T, budget, tr.grid, window=2)
    assert sum(256 // (w * w) for w in gplan if w) <= budget


def test_the_fraction_is_drawn_from_its_range(tiny_lm):
    T = 16
    tr = _trainee(tiny_lm, train_budget_fraction=[0.1, 0.5])
    torch.manual_seed(0)
    kept = set()
    for _ in range(20):
        plan, _ = tr.training_plan(torch.tensor([1.0, 0.0]), torch.zeros(T),
                                   {"policy": 0, "question": Q})
        kept.add(sum(1 for w in plan if w))
    assert len(kept) > 1     # different budgets keep different numbers of frames


@pytest.mark.parametrize("over,msg", [
    ({"train_budget_fraction": [0.0, 0.5]}, "train_budget_fraction"),
    ({"train_budget_fraction": [0.5, 0.2]}, "train_budget_fraction"),
    ({"train_budget_fraction": [0.2]}, "train_budget_fraction"),
    ({"train_budget_fraction": [0.2, 0.3], "train_max_length": [1000, 2000]}, "set one")])
def test_bad_fractions_are_refused(over, msg):
    with pytest.raises(ConfigError, match=msg):
        load_config("tiny_stage3", **over)
