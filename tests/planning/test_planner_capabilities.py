"""Planners answer for themselves: whether a policy is budgeted or needs relevance comes from
its registration, never from its name, so a planner registered from outside the package gets
the same treatment as the built-in ones (runtime checks, the report, eval's rows)."""
import pytest

from vr_runtime.planning import policies
from vr_runtime.eval.methods import Method
from vr_runtime.planning.policies import PLANNERS, is_budgeted, register_planner


@pytest.fixture
def toy_planners():
    """Two planners registered the way a user would, removed afterwards."""
    @register_planner("toy-full", budgeted=False, description="every frame at s1, no budget")
    def _full(T, budget, grid, relevant, w):
        return [w.relevant_window] * T

    @register_planner("toy-relevance", needs_relevance=True, description="relevant at s1")
    def _rel(T, budget, grid, relevant, w):
        return [w.relevant_window if r else w.other_window for r in relevant]
    yield
    PLANNERS.pop("toy-full")
    PLANNERS.pop("toy-relevance")


def test_budgeted_is_asked_of_the_planner(toy_planners):
    assert is_budgeted("dense") is False and is_budgeted("global") is True
    assert is_budgeted("toy-full") is False and is_budgeted("toy-relevance") is True
    assert is_budgeted(policies.AUTO) is True
    assert is_budgeted(policies.AUTO, {"fragment": "toy-full"}) is False
    with pytest.raises(ValueError, match="did you mean"):
        is_budgeted("fragmnt")


def test_eval_rows_follow_the_planner(toy_planners):
    assert Method("d", "dense", "").budgeted is False
    assert Method("t", "toy-full", "").budgeted is False
    assert Method("r", "toy-relevance", "").budgeted is True
    assert Method("a", "auto", "", route_to={"global": "toy-full"}).budgeted is False


def test_runtime_refuses_a_latency_budget_for_an_unbudgeted_planner(toy_planners, tiny_vr):
    with pytest.raises(ValueError, match="'toy-full' \\(no budget\\)"):
        tiny_vr.request("v.mp4", "q?", num_frames=4, policy="toy-full", ttft_budget_s=1.0)
    req = tiny_vr.request("v.mp4", "q?", num_frames=4, policy="toy-relevance", ttft_budget_s=1.0)
    assert req.policy == "toy-relevance"


def test_the_empty_relevance_note_comes_from_the_planner(toy_planners, tiny_vr, frames):
    """With no relevant frame, the report says what *this* planner did: the Global plan
    (fragment), every frame at s0 (fragment-literal), nothing for a planner that says nothing."""
    from vr_runtime.routing.scorers import FixedRelevance
    video = frames(T=3)
    notes = {}
    for policy in ("fragment", "fragment-literal", "toy-relevance"):
        res = tiny_vr.answer(video, "What shape is the red object?", num_frames=3,
                             max_new_tokens=1, policy=policy,
                             scorer=FixedRelevance([False, False, False]))
        notes[policy] = [n for n in res.report["notes"] if n.startswith("no frame was relevant")]
    assert notes == {"fragment": ["no frame was relevant: the Global plan was used"],
                     "fragment-literal": ["no frame was relevant: every frame at s0 "
                                          "(Algorithm 1 literally)"],
                     "toy-relevance": []}
