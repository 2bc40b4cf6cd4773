"""The Image Router at many frames: a frame's score is a function of its own Z_t and the
question. Each frame runs [Z_t; Emb(q)] through the shadow stack as its own sequence (the
stack is causal within that sequence, positions restart at every frame), so the frames beside
it, however many, do not enter its score: at 1,024 frames it is the score at 64 frames, up to
float32 reordering when the frames are batched differently (1.4e-6 in the logit, measured on
the tiny model with its shipped routers)."""
import pytest
import torch

from vr_runtime.routing.routers import Routers

# float32 on CPU: the same frame in a batch of another size sums in another order
TOLERANCE = 1e-4   # on the logit


def _z(lm, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, lm.grid[0] * lm.grid[1], lm.hidden_size, generator=g)


def _question(lm):
    ids = lm.tokenizer("What shape is the red object?", return_tensors="pt").input_ids[0]
    return lm.model.get_input_embeddings()(ids).detach()


def _check(lm, pool):
    routers = Routers.from_backbone(lm, seed=1)
    Z, q, start = _z(lm, 1024), _question(lm), 480
    with torch.no_grad():
        long = routers.frame_logits(Z, q, router_pool=pool)
        short = routers.frame_logits(Z[start:start + 64], q, router_pool=pool)
        cached = routers.frame_logits_cached(routers.visual_cache(Z, router_pool=pool), q)
        one = routers.frame_logits(Z[start:start + 64], q, frame_batch=1, router_pool=pool)
    assert long.shape == (1024,) and long.std() > 0   # the scores do vary from frame to frame
    window = long[start:start + 64]
    assert (window - short).abs().max() <= TOLERANCE
    assert (cached[start:start + 64] - short).abs().max() <= TOLERANCE
    assert (one - short).abs().max() <= TOLERANCE


def test_a_frames_score_at_1024_frames_is_its_score_at_64(tiny_lm):
    _check(tiny_lm, pool=4)


@pytest.mark.parametrize("preset", ["tiny-qwen2.5-vl"])
def test_the_same_with_mrope_positions(preset):
    from vr_runtime.backbones import load_backbone
    _check(load_backbone(preset), pool=4)
