"""Amortised questions (VideoRouter(prefix_cache=True)): questions on one video with the same
plan reuse the KV cache of the prompt up to the end of its visual tokens, and get the tokens of
the plain path; another plan, or another prompt before the frames, does not reuse it. Both tiny
backbones (1-D positions; Qwen2.5-VL's M-RoPE)."""
import pytest
import torch

from vr_runtime.routing.routers import Routers
from vr_runtime.runtime import VideoRouter

QS = ["What shape is the red object?", "Which color is the big square in the middle?",
      "What shape is the red object?"]


@pytest.fixture(scope="module", params=["tiny", "tiny-qwen2.5-vl"])
def pair(request):
    """(plain runtime, runtime with the prefix cache) over one backbone."""
    from vr_runtime.backbones import load_backbone
    torch.manual_seed(0)
    lm = load_backbone(request.param, device="cpu", dtype=torch.float32)
    return (VideoRouter(lm, Routers.from_backbone(lm), warmup_frames=0),
            VideoRouter(lm, Routers.from_backbone(lm), warmup_frames=0, prefix_cache=True))


def _ask(vr, video, q, **kw):
    ids = []
    res = vr.answer(video, q, on_token=ids.append, **kw)
    return ids, res.report


def _first_logits(vr, monkeypatch):
    """The last prefill pass's last-row logits of each answer (the first token's)."""
    seen = []
    orig = vr.lm.forward

    def forward(**k):
        out = orig(**k)
        if k.get("inputs_embeds") is not None:
            seen.append(out.logits[0, -1].clone())
        return out
    monkeypatch.setattr(vr.lm, "forward", forward)
    return seen


def test_same_plan_reuses_the_visual_prefix(pair, monkeypatch):
    plain, cached = pair
    video = torch.randn(4, 3, 448, 448, generator=torch.Generator().manual_seed(1))
    kw = dict(num_frames=4, max_new_tokens=6, policy="global")
    cached.clear_visual_cache()
    statuses, first = [], []
    for q in QS:
        seen = _first_logits(plain, monkeypatch)
        want, _ = _ask(plain, video, q, **kw)                       # one full prefill
        got, rep = _ask(cached, video, q, cache_visual=True, **kw)
        monkeypatch.undo()
        assert got == want and len(got) > 0
        # the first token's logits: the plain prefill's (close: two passes instead of one)
        torch.testing.assert_close(seen[-1], seen[0], rtol=1e-4, atol=1e-4)
        first.append(seen[-1])
        statuses.append(rep["prefix_cache"]["status"])
        P = rep["prefix_cache"]["tokens"]
        ids, _ = cached.lm.build_prompt(q, rep["frame_tokens"])
        last_visual = int((ids == cached.lm.image_token_id).nonzero()[-1])
        assert P == last_visual + 1 and P < rep["prompt_tokens"]
    assert statuses == ["miss", "hit", "hit"]
    assert torch.equal(first[0], first[2])   # a hit computes exactly what the miss did
    assert any("visual prefix cache hit" in n for n in rep["notes"])


def test_another_plan_or_prompt_head_is_a_miss(pair):
    plain, cached = pair
    video = torch.randn(3, 3, 448, 448, generator=torch.Generator().manual_seed(2))
    kw = dict(num_frames=3, max_new_tokens=4, cache_visual=True)
    cached.clear_visual_cache()
    runs = [dict(policy="global"), dict(policy="global", global_window=4),   # another plan
            dict(policy="global", global_window=4, system="Answer briefly."),  # another head
            dict(policy="global", global_window=4, system="Answer briefly.")]
    got = []
    for q, o in zip(QS + QS[:1], runs):
        ids, rep = _ask(cached, video, q, **kw, **o)
        want, _ = _ask(plain, video, q, **{**kw, "cache_visual": False}, **o)
        assert ids == want
        got.append(rep["prefix_cache"]["status"])
    assert got == ["miss", "miss", "miss", "hit"]
    # without cache_visual there is no video entry to keep a prefix in
    _, rep = _ask(cached, video, QS[0], num_frames=3, max_new_tokens=2, policy="global")
    assert rep["prefix_cache"] is None


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tiny", "tiny-qwen2.5-vl"])
def test_prefix_cache_cuda(name):
    """CUDA (bench/gpu_run.sh, stage tests): the same tokens with the prefix reused."""
    from vr_runtime.backbones import load_backbone
    torch.manual_seed(0)
    lm = load_backbone(name, device="cuda", dtype=torch.float32)
    plain = VideoRouter(lm, Routers.from_backbone(lm), warmup_frames=0)
    cached = VideoRouter(lm, Routers.from_backbone(lm), warmup_frames=0, prefix_cache=True)
    video = torch.randn(4, 3, 448, 448, generator=torch.Generator().manual_seed(1))
    kw = dict(num_frames=4, max_new_tokens=6, policy="global")
    statuses = []
    for q in QS:
        want, _ = _ask(plain, video, q, **kw)
        got, rep = _ask(cached, video, q, cache_visual=True, **kw)
        assert got == want
        statuses.append(rep["prefix_cache"]["status"])
    assert statuses == ["miss", "hit", "hit"]
