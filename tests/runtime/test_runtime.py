"""VideoRouter.answer end to end on the tiny model (CPU, random frames)."""
import json

import pytest
import torch

from vr_kernels import pooled_counts
from vr_runtime.planning import budget as B
from vr_runtime.routing.routers import Routers
from vr_runtime.planning.policies import get_planner
from vr_runtime.runtime import POLICIES, VideoRouter

Q = "Which color is the square in the video?"
FIELDS = ("policy", "policy_probability", "frame_indices", "frame_scores", "windows",
          "visual_tokens", "dense_visual_tokens", "budget", "text_tokens", "timings_s",
          "peak_memory_bytes", "device", "frame_times_s", "frame_tokens", "routers_trained",
          "notes", "num_frames_requested", "num_frames_used", "dtype", "model")
STAGES = ("frames", "vision", "router", "compress", "prefill", "ttft", "generate")


@pytest.mark.parametrize("policy", POLICIES)
def test_answer_every_policy(tiny_vr, frames, policy):
    T = 5
    res = tiny_vr.answer(frames(T, seed=3), Q, num_frames=T, max_length=1000, max_new_tokens=3,
                         policy=policy, allow_over_length=policy == "dense")
    r = json.loads(json.dumps(res.report))  # JSON-serialisable, and nothing lost on the way
    assert r == res.report
    assert isinstance(res.text, str)
    for f in FIELDS:
        assert f in r, f
    assert r["routers_trained"] is False and r["num_frames_used"] == T
    assert r["frame_indices"] == list(range(T)) and len(r["windows"]) == T
    plan = [tuple(w) if isinstance(w, list) else w for w in r["windows"]]
    assert r["frame_tokens"] == pooled_counts(plan)
    assert r["visual_tokens"] == sum(r["frame_tokens"]) and r["dense_visual_tokens"] == T * 256
    assert r["prompt_tokens"] <= r["text_tokens"] + r["visual_tokens"]
    t = r["timings_s"]
    assert set(STAGES) <= set(t) and all(v >= 0 for v in t.values())
    assert t["ttft"] == pytest.approx(t["vision"] + t["router"] + t["compress"] + t["prefill"], abs=1e-5)
    assert t["vision"] > 0 and t["prefill"] > 0
    assert r["generated_tokens"] <= 3
    if policy == "dense":
        assert r["windows"] == [1] * T
        assert any("exceeds max_length 1000" in n for n in r["notes"])  # 5 x 256 > 1000
    else:
        assert r["visual_tokens"] <= r["budget"]
    if policy == "auto":  # untrained routers must not pretend
        assert r["policy"] == "global" and any("untrained" in n for n in r["notes"])
        assert r["policy_probability"] is None
    if policy != "auto" and get_planner(policy).needs_relevance:   # the planner says so
        assert len(r["frame_scores"]) == T and t["router"] > 0
        assert r["relevant"] == [s > 0.5 for s in r["frame_scores"]]
        empty = "low" if policy == "fragment-literal" else "global"
        assert plan == B.plan_fragment(r["relevant"], r["budget"], empty=empty)
    else:
        assert r["frame_scores"] is None


def test_dense_over_max_length_is_refused_unless_allowed(tiny_vr, frames):
    # 5 x 256 visual tokens > 1000: dense has no budget, but max_length still bounds it
    with pytest.raises(B.BudgetError, match=r"over max_length of 1000: at most 3 frames fit.*"
                                            r"--allow-over-length"):
        tiny_vr.answer(frames(5, seed=3), Q, num_frames=5, max_length=1000, max_new_tokens=3,
                       policy="dense")
    r = tiny_vr.answer(frames(3, seed=3), Q, num_frames=3, max_length=1000, max_new_tokens=3,
                       policy="dense").report       # the frame count the line gave fits
    assert r["prompt_tokens"] + 3 <= 1000


def test_prompt_past_the_models_context_is_refused(tiny_vr, frames, monkeypatch):
    # the model's positions bound every policy, dense allowed over max_length or not
    monkeypatch.setattr(tiny_vr.lm.text_config, "max_position_embeddings", 1000)
    from vr_runtime.planning.request_plan import max_positions
    assert max_positions(tiny_vr.lm) == 1000
    with pytest.raises(B.BudgetError, match=r"over the model's context \(max_position_embeddings\)"
                                            r" of 1000: at most 3 frames fit"):
        tiny_vr.answer(frames(5, seed=3), Q, num_frames=5, max_length=4000, max_new_tokens=3,
                       policy="dense", allow_over_length=True)


def test_forced_relevance_follows_algorithm1(tiny_vr, frames):
    rel = [False, True, False, False, True, False]
    res = tiny_vr.answer(frames(6, seed=4), Q, num_frames=6, max_length=900, max_new_tokens=1,
                         policy="fragment", relevant=rel)
    r = res.report
    assert r["windows"] == B.plan_fragment(rel, r["budget"]) and r["frame_scores"] is None
    assert r["windows"][1] == 1 and r["windows"][4] == 1
    none = tiny_vr.answer(frames(6, seed=4), Q, num_frames=6, max_new_tokens=1, policy="fragment",
                          relevant=[False] * 6).report
    assert none["windows"] == [2] * 6 and any("Global" in n for n in none["notes"])


def test_auto_with_trained_routers_uses_semantic_router(tiny_lm, frames):
    routers = Routers.from_backbone(tiny_lm, seed=2)
    with torch.no_grad():  # make the Semantic Router decisively pick class 1 (fragment)
        routers.semantic.fc2.bias.copy_(torch.tensor([-5.0, 5.0]))
    routers.trained = True
    vr = VideoRouter(tiny_lm, routers)
    r = vr.answer(frames(4, seed=5), Q, num_frames=4, max_new_tokens=1, policy="auto").report
    assert r["policy"] == "fragment" and r["routers_trained"] is True
    assert r["policy_probability"] > 0.99 and len(r["frame_scores"]) == 4
    assert not any("untrained" in n for n in r["notes"])


def test_generation_matches_full_recompute(tiny_vr, tiny_lm, frames):
    """Greedy decoding with the KV cache == argmax of a full forward per step."""
    from vr_runtime.backbones.prompt import build_video_prompt
    from vr_runtime.reconstruct import reconstruct_embeds
    lm = tiny_lm
    plan = [2, 1]
    ids, starts = build_video_prompt(lm.tokenizer, Q, pooled_counts(plan), lm.image_token_id)
    with torch.no_grad():
        Z = lm.encode_frames(frames(2, seed=6))
        embeds = reconstruct_embeds(lm.model, ids, Z, plan, lm.image_token_id, lm.grid, frame_starts=starts)
        vr = VideoRouter(lm, tiny_vr.routers)
        vr.stop_ids = set()  # compare a fixed number of steps
        got = vr.generate(embeds, 6)
        emb = lm.model.get_input_embeddings()
        seq, ref = embeds, []
        for _ in range(6):
            nxt = int(lm.model(inputs_embeds=seq).logits[0, -1].argmax())
            ref.append(nxt)
            seq = torch.cat([seq, emb(torch.tensor([[nxt]]))], 1)
    assert got == ref


def test_stops_at_stop_token(tiny_vr, tiny_lm, frames):
    """Decoding stops before a stop id: stopping on the 3rd greedy token leaves 2 tokens."""
    vr = VideoRouter(tiny_lm, tiny_vr.routers)
    assert tiny_lm.tokenizer.convert_tokens_to_ids("<|im_end|>") in vr.stop_ids
    pv = frames(2, seed=8)
    vr.stop_ids = set()
    free = vr.answer(pv, Q, num_frames=2, max_new_tokens=4, policy="global").report
    assert free["generated_tokens"] == 4
    with torch.no_grad():
        ids = vr.generate(_embeds(tiny_lm, pv), 4)
    vr.stop_ids = {ids[2]} if ids[2] not in ids[:2] else {ids[0]}
    stopped = vr.answer(pv, Q, num_frames=2, max_new_tokens=4, policy="global")
    expect = 2 if ids[2] not in ids[:2] else 0
    assert stopped.report["generated_tokens"] == expect
    assert stopped.text == tiny_lm.tokenizer.decode(ids[:expect], skip_special_tokens=True).strip()


def _embeds(lm, pv, plan=(2, 2)):
    from vr_runtime.backbones.prompt import build_video_prompt
    from vr_runtime.reconstruct import reconstruct_embeds
    ids, starts = build_video_prompt(lm.tokenizer, Q, pooled_counts(plan), lm.image_token_id)
    Z = lm.encode_frames(pv)
    return reconstruct_embeds(lm.model, ids, Z, list(plan), lm.image_token_id, lm.grid, frame_starts=starts)


def test_video_clip_input_and_notes(tiny_vr, frames):
    from vr_runtime.video.load import VideoClip
    T = 3
    clip = VideoClip(pixel_values=frames(T, seed=9), frame_indices=[5, 15, 25],
                     timestamps_s=[0.2, 0.6, 1.0], fps=25.0, total_frames=30, requested=8,
                     note="the video has 3 usable frames; 8 were asked for")
    r = tiny_vr.answer(clip, Q, num_frames=8, max_new_tokens=1, policy="uniform").report
    assert r["frame_indices"] == [5, 15, 25] and r["frame_times_s"] == [0.2, 0.6, 1.0]
    assert r["num_frames_requested"] == 8 and r["num_frames_used"] == 3
    assert any("8 were asked for" in n for n in r["notes"])


def test_answer_errors(tiny_vr, frames):
    pv = frames(3, seed=10)
    with pytest.raises(ValueError, match="policy"):
        tiny_vr.answer(pv, Q, policy="best")
    with pytest.raises(ValueError, match="question"):
        tiny_vr.answer(pv, "  ")
    with pytest.raises(ValueError, match="relevant"):
        tiny_vr.answer(pv, Q, policy="fragment", relevant=[True])
    with pytest.raises(B.BudgetError, match="max_length"):
        tiny_vr.answer(pv, Q, policy="global", max_length=150)
    with pytest.raises(ValueError, match="frames"):
        tiny_vr.answer(torch.zeros(2, 3, 224, 224), Q)


def test_from_config(small_config, frames):
    vr = VideoRouter.from_config(small_config(hidden=96), seed=1)
    r = vr.answer(frames(2, seed=12), Q, num_frames=2, max_new_tokens=2, policy="dense").report
    assert r["visual_tokens"] == 512 and r["model"] == "config" and r["routers_trained"] is False


def test_router_pool_option(tiny_vr, frames):
    r = tiny_vr.answer(frames(3, seed=13), Q, num_frames=3, max_new_tokens=1, policy="fragment",
                       router_pool=2).report
    assert r["router_pool"] == 2 and len(r["frame_scores"]) == 3
    assert any("router_pool=2" in n for n in r["notes"])


def test_cache_visual_reuses_and_matches(tiny_lm, tiny_vr, frames):
    vr = VideoRouter(tiny_lm, tiny_vr.routers)
    pv = frames(4, seed=14)
    kw = dict(num_frames=4, max_new_tokens=2, policy="fragment")
    plain = vr.answer(pv, Q, **kw).report
    first = vr.answer(pv, Q, cache_visual=True, **kw)
    second = vr.answer(pv, "Does a green ring appear?", cache_visual=True, **kw).report
    again = vr.answer(pv, Q, cache_visual=True, **kw)
    assert first.report["visual_cache"] == "miss" and second["visual_cache"] == "hit"
    assert again.report["visual_cache"] == "hit" and second["timings_s"]["vision"] == 0.0
    assert any("cache hit" in n for n in second["notes"])
    for r in (first.report, again.report):  # same decisions and answer as without the cache
        assert r["windows"] == plain["windows"]
        assert r["frame_scores"] == pytest.approx(plain["frame_scores"], abs=1e-5)
    assert again.text == first.text
    pv.add_(0.0)  # an in-place change (version bump) invalidates the entry
    assert vr.answer(pv, Q, cache_visual=True, **kw).report["visual_cache"] == "miss"
    other = vr.answer(frames(4, seed=15), Q, cache_visual=True, num_frames=4, max_new_tokens=1,
                      policy="global").report
    assert other["visual_cache"] == "miss" and other["windows"] == [2] * 4
    vr.clear_visual_cache()
    assert not len(vr.visual_cache)


def test_answer_batch_paths_and_tensors(tiny_vr, frames):
    import pathlib
    sample = pathlib.Path(__file__).resolve().parents[2] / "vr_runtime" / "assets" / "sample.mp4"
    if not sample.is_file():
        pytest.skip("bundled sample video not present")
    pv = frames(4, seed=16)
    kw = dict(num_frames=4, max_new_tokens=1, policy="global")
    res = tiny_vr.answer_batch([str(sample), pv, str(sample)], Q, **kw)
    single = tiny_vr.answer(str(sample), Q, **kw).report
    assert len(res) == 3
    assert res[1].report["windows"] == [2] * 4 and res[1].report["frame_times_s"] is None
    for r in (res[0].report, res[2].report):  # a prefetched path == a path decoded in place
        assert r["frame_indices"] == single["frame_indices"] and r["windows"] == single["windows"]
        assert r["frame_times_s"] == single["frame_times_s"]
    assert res[0].text == res[2].text
    with pytest.raises(ValueError, match="questions"):
        tiny_vr.answer_batch([pv, pv], [Q], **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("policy", ["fragment", "dense"])
def test_answer_cuda_reports_memory(frames, policy):
    vr = VideoRouter.from_pretrained("tiny", device="cuda", dtype="bf16")
    r = vr.answer(frames(8, seed=18), Q, num_frames=8, max_new_tokens=4, policy=policy).report
    assert r["device"].startswith("cuda") and r["dtype"] == "bfloat16"
    assert r["peak_memory_bytes"] and r["peak_memory_bytes"] > 0
    assert r["timings_s"]["prefill"] > 0 and json.dumps(r)
