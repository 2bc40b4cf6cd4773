"""The FrameScorer seam: every implementation drives the same fragment planner."""
import pytest
import torch
import torch.nn.functional as F

from vr_runtime.planning import budget as B
from vr_runtime.routing.scorers import (CachedImageRouterScorer, CLIPScorer, FixedRelevance,
                                ImageRouterScorer)

Q = "Which color is the square in the video?"


@pytest.fixture(scope="module")
def tiny_clip_dir(tmp_path_factory):
    """A tiny random CLIPModel + the tiny tokenizer saved as a local checkpoint directory
    (nothing downloaded): the same stand-in `videorouter eval --clip` tests use."""
    from vr_runtime.eval.synthetic import make_random_clip
    return make_random_clip(tmp_path_factory.mktemp("clip"))


def test_clip_scorer_similarities_and_topk(tiny_vr, tiny_clip_dir):
    clip = CLIPScorer.from_pretrained(tiny_clip_dir)
    g = torch.Generator().manual_seed(3)
    rgb = torch.rand(6, 3, 448, 448, generator=g)                  # frames in [0, 1]
    spec = tiny_vr.lm.frame_spec
    pv = (rgb - torch.tensor(spec.mean).view(1, 3, 1, 1)) / torch.tensor(spec.std).view(1, 3, 1, 1)
    sims = clip.similarities(pv, spec, Q)
    # Reference: CLIP's own features on the [0, 1] frames resized and normalised for CLIP.
    with torch.no_grad():
        x = F.interpolate(rgb, size=(64, 64), mode="bicubic", antialias=True).clamp(0, 1)
        x = (x - clip.mean) / clip.std
        img = clip.model.get_image_features(pixel_values=x)
        img = getattr(img, "pooler_output", img)
        ids = clip.tokenizer([Q], return_tensors="pt", padding=True)
        txt = clip.model.get_text_features(**ids)
        txt = getattr(txt, "pooler_output", txt)
        ref = F.normalize(img, dim=-1) @ F.normalize(txt, dim=-1)[0]
    torch.testing.assert_close(sims, ref, rtol=1e-4, atol=1e-5)

    budget = 6 * 16 + 2 * 240                                        # room for two full frames
    res = tiny_vr.answer(pv, Q, num_frames=6, max_new_tokens=1, policy="fragment",
                         budget=budget, scorer=clip)
    r = res.report
    top2 = sorted(sorted(range(6), key=lambda t: -float(ref[t]))[:2])
    assert r["scorer"] == "clip" and [t for t in range(6) if r["relevant"][t]] == top2
    assert r["windows"] == B.plan_fragment(r["relevant"], budget)
    assert r["frame_scores"] == pytest.approx(ref.tolist(), abs=1e-5)
    assert not any("untrained" in n for n in r["notes"])  # CLIP does not use the routers


def test_clip_dir_errors(tmp_path):
    from vr_runtime.errors import ModelFilesError
    with pytest.raises(ModelFilesError, match="no config.json"):
        CLIPScorer.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ModelFilesError, match="expected clip or siglip"):
        CLIPScorer.from_pretrained(tmp_path)


def test_router_scorers_agree_and_fixed_is_fixed(tiny_vr, frames):
    pv = frames(4, seed=21)
    a = tiny_vr.answer(pv, Q, num_frames=4, max_new_tokens=1, policy="fragment",
                       scorer=ImageRouterScorer()).report
    b = tiny_vr.answer(pv, Q, num_frames=4, max_new_tokens=1, policy="fragment",
                       scorer=CachedImageRouterScorer(), cache_visual=True).report
    assert a["scorer"] == "image-router" and b["scorer"] == "image-router-cached"
    assert b["frame_scores"] == pytest.approx(a["frame_scores"], abs=1e-5)
    assert a["relevant"] == [s > tiny_vr.routers.config.threshold for s in a["frame_scores"]]
    rel = [False, True, True, False]
    c = tiny_vr.answer(pv, Q, num_frames=4, max_new_tokens=1, policy="fragment",
                       scorer=FixedRelevance(rel)).report
    assert c["relevant"] == rel and c["frame_scores"] is None and c["timings_s"]["router"] < \
        a["timings_s"]["router"]
    with pytest.raises(ValueError, match="give one of them"):
        tiny_vr.answer(pv, Q, num_frames=4, relevant=rel, scorer=ImageRouterScorer())
    with pytest.raises(ValueError, match="FrameScorer"):
        tiny_vr.answer(pv, Q, num_frames=4, scorer="clip")


def test_route_to_sends_a_semantic_class_to_another_planner(tiny_lm, frames):
    """The no-Image-Router ablation: the Semantic Router decides, Fragment plans uniformly."""
    from vr_runtime.routing.routers import Routers
    from vr_runtime.runtime import VideoRouter
    routers = Routers.from_backbone(tiny_lm, seed=4)
    with torch.no_grad():   # make the Semantic Router say Fragment whatever the question
        routers.semantic.fc2.bias.copy_(torch.tensor([-50.0, 50.0]))
    routers.trained = True
    vr = VideoRouter(tiny_lm, routers)
    r = vr.answer(frames(4, seed=5), Q, num_frames=4, max_new_tokens=1, max_length=2000,
                  route_to={"fragment": "uniform"}).report
    assert r["policy"] == "uniform" and r["policy_probability"] > 0.99
    assert len(set(map(str, r["windows"]))) == 1 and r["frame_scores"] is None
    with pytest.raises(ValueError, match="route_to"):
        vr.answer(frames(1), Q, num_frames=1, route_to={"maybe": "global"})
