"""The paper's baseline and ablation rows as the paper ran them (issue 27): CLIP token-matched to
VideoRouter, Algorithm 1's literal empty-fragment branch, `no-image-router` = Uniform Pooling,
InternVL3* sampling its frame count from the context budget."""
import pytest
import torch

from vr_runtime.planning import budget as B
from vr_runtime.eval.methods import get_method
from vr_runtime.planning.policies import topk_of
from vr_runtime.routing.scorers import CLIPScorer, FixedRelevance, TokenMatchedScorer

Q = "Which color is the square in the video?"


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    from vr_runtime.eval.synthetic import make_random_clip
    return CLIPScorer.from_pretrained(make_random_clip(tmp_path_factory.mktemp("clip")))


def test_clip_is_token_matched_to_the_image_router(tiny_vr, clip, frames):
    """`clip` keeps as many frames at s1 as the Image Router marks (here 2 of 6, fixed), CLIP
    choosing which; `clip-fill` fills the budget (all 6 fit at s1 here)."""
    video = frames(T=6, seed=1)
    counter = FixedRelevance([True, False, False, True, False, False])
    kw = dict(policy="fragment", budget=6 * 256, max_new_tokens=1, max_length=4096)
    matched = tiny_vr.answer(video, Q, scorer=TokenMatchedScorer(clip, counter=counter), **kw)
    fill = tiny_vr.answer(video, Q, scorer=clip, **kw)
    routed = tiny_vr.answer(video, Q, relevant=counter.relevant, **kw)
    r = matched.report
    assert sum(r["relevant"]) == 2
    assert r["relevant"] == topk_of(r["frame_scores"], 2)         # CLIP's top 2
    assert r["visual_tokens"] == routed.report["visual_tokens"]    # same tokens as VideoRouter
    assert sum(fill.report["relevant"]) == 6                        # budget-filling variant
    # the eval methods: `clip` is the token-matched one, `clip-fill` the old one
    res = {"clip_scorer": clip}
    assert isinstance(get_method("clip").answer_kwargs(res)["scorer"], TokenMatchedScorer)
    assert get_method("clip-fill").answer_kwargs(res)["scorer"] is clip


def test_algorithm1_literal_empty_branch():
    none = [False] * 64
    assert B.plan_fragment(none, 12288) == [2] * 64                       # default: Global
    literal = B.plan_fragment(none, 12288, empty="low")
    assert literal == [4] * 64 and B.plan_tokens(literal) == 1024          # every frame at s0
    # over budget: s0 frames uniformly subsampled, never above the budget
    assert B.plan_tokens(B.plan_fragment(none, 100, empty="low")) <= 100
    with pytest.raises(ValueError, match="empty"):
        B.plan_fragment(none, 12288, empty="s0")


def test_fragment_literal_policy_reports_the_empty_branch(tiny_vr, frames):
    kw = dict(budget=4 * 256, max_new_tokens=1, max_length=4096, relevant=[False] * 4)
    lit = tiny_vr.answer(frames(T=4), Q, policy="fragment-literal", **kw).report
    glo = tiny_vr.answer(frames(T=4), Q, policy="fragment", **kw).report
    assert lit["windows"] == [4] * 4 and lit["no_relevant_frame"]
    assert any("every frame at s0" in n for n in lit["notes"])
    assert glo["windows"] == [2] * 4 and glo["no_relevant_frame"]
    assert get_method("auto-literal").answer_kwargs({}) == {
        "policy": "auto", "route_to": {"fragment": "fragment-literal"}}


def test_no_image_router_is_uniform_pooling_for_every_query():
    assert get_method("no-image-router").answer_kwargs({}) == {"policy": "uniform"}
    assert get_method("no-image-router-routed").route_to == {"fragment": "uniform"}


def test_internvl3_star_samples_its_frames_by_the_context():
    m, sub = get_method("budget"), get_method("budget-subset")
    assert m.num_frames(12288, 64, 256) == 48 and m.num_frames(9528, 64, 256) == 37
    assert m.num_frames(100, 64, 256) == 1          # below one frame: planning says so
    assert m.num_frames(None, 64, 256) == 64        # no budget: the frames asked for
    assert sub.num_frames(12288, 64, 256) == 64
