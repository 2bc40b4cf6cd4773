"""Qwen2.5-VL at a reduced frame resolution (the paper's "Qwen2.5-VL Budget" baseline, Appendix
E): the budget rule (`budget_frame_size`) against brute force, and the backbone view
(`Qwen25VLBackbone.at_resolution`) against Hugging Face's own forward at that size."""
import math
import random

import numpy as np
import pytest
import torch

from vr_kernels import pooled_counts
from vr_runtime.backbones.base import Backbone
from vr_runtime.backbones.internvl3 import InternVL3Backbone
from vr_runtime.backbones.qwen2_5_vl import (CLIP_MEAN, CLIP_STD, QWEN_MIN_PIXELS,
                                             Qwen25VLBackbone, budget_frame_size, frame_patches)

QUESTION = "Which color is the star in the video?"


def _hf_smart_resize(*a, **kw):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
    return smart_resize(*a, **kw)


def _brute_by_cap(frames, budget, size, factor=28, min_pixels=QWEN_MIN_PIXELS):
    """Every pixel cap m (min_pixels..H*W, step 1) through transformers' own smart_resize: the
    fitting size with the most tokens (None if none fits)."""
    H, W = size
    best = None
    for m in range(min_pixels, H * W + 1):
        h, w = _hf_smart_resize(H, W, factor=factor, min_pixels=min_pixels, max_pixels=m)
        n = (h // factor) * (w // factor)
        if frames * n <= budget and (best is None or n > best[0]):
            best = (n, (h, w))
    return None if best is None else best[1]


# ----------------------------------------------------------------------------- the rule
@pytest.mark.parametrize("frames,budget,size", [
    (64, 12288, (448, 448)),   # the paper's setting: 13x13 tokens a frame
    (64, 9680, (448, 448)),
    (64, 16384, (448, 448)),   # the dense count fits: full resolution
    (16, 1000, (448, 448)),
    (64, 5000, (252, 448)),    # 16:9
    (32, 3000, (448, 336)),
    (8, 700, (196, 420)),
])
def test_budget_frame_size_equals_brute_force_over_caps(frames, budget, size):
    got = budget_frame_size(frames, budget, size=size)
    assert got == _brute_by_cap(frames, budget, size)
    h, w = got
    assert h % 28 == 0 and w % 28 == 0 and h <= size[0] + 14 and w <= size[1] + 14
    assert frames * (h // 28) * (w // 28) <= budget


def test_budget_frame_size_square_equals_largest_fitting_side():
    """Square frames (ours today): the largest side s (a multiple of 28, at most 448) with
    T * (s/28)^2 <= B, over many (T, B)."""
    rng = random.Random(0)
    cases = [(64, 12288), (64, 256), (4, 512)] + [(rng.randint(1, 128), rng.randint(256, 20000))
                                                  for _ in range(300)]
    for T, B in cases:
        fits = [s for s in range(56, 449, 28) if T * (s // 28) ** 2 <= B]
        if not fits:
            with pytest.raises(ValueError, match="cannot hold"):
                budget_frame_size(T, B)
            continue
        assert budget_frame_size(T, B) == (max(fits), max(fits)), (T, B)
    assert budget_frame_size(64, 12288) == (364, 364)   # 64 x 169 = 10,816 tokens


def test_budget_frame_size_checks_its_arguments():
    with pytest.raises(ValueError, match=r"budget: 100 visual tokens cannot hold 64 frames"):
        budget_frame_size(64, 100)            # Qwen's min_pixels: 2x2 tokens a frame at least
    for bad in (0, -1, 2.5, True, None):
        with pytest.raises(ValueError, match="frames: expected an int >= 1"):
            budget_frame_size(bad, 1000)
        with pytest.raises(ValueError, match="budget: expected an int >= 1"):
            budget_frame_size(4, bad)


# ----------------------------------------------------------------------------- the view
@pytest.fixture(scope="module")
def bb():
    torch.manual_seed(0)
    return Qwen25VLBackbone.tiny(device="cpu", dtype=torch.float32)


def _thw(grids):
    return torch.tensor([[1, 2 * gh, 2 * gw] for gh, gw in grids], dtype=torch.long)


def test_view_shares_the_weights_and_follows_the_size(bb):
    v = bb.at_resolution(308, 364)
    assert v.model is bb.model and v.tokenizer is bb.tokenizer and v._swap is bb._swap
    assert v.grid == (11, 13) and v.frame_spec.size == (308, 364)
    assert (v.frame_spec.mean, v.frame_spec.std) == (CLIP_MEAN, CLIP_STD)
    assert bb.grid == (16, 16) and bb.frame_spec.size == (448, 448)   # the original unchanged
    assert bb.at_resolution(448, 448) is bb
    assert v.budget_frame_size(64, 12288) == bb.budget_frame_size(64, 12288) == (364, 364)
    for h, w in [(300, 308), (0, 28), (308, 14), (308.0, 308), (True, 28)]:
        with pytest.raises(ValueError, match="positive multiples of 28"):
            bb.at_resolution(h, w)
    with pytest.raises(ValueError, match=r"frames of 308x364, got \(448, 448\)"):
        next(v.vision_features(torch.zeros(1, 3, 448, 448)))


def test_internvl3_cannot_resize():
    """InternVL3's tower is fixed at 448: the base class refuses, with a line that says so."""
    assert InternVL3Backbone.at_resolution is Backbone.at_resolution
    assert InternVL3Backbone.budget_frame_size is Backbone.budget_frame_size

    class Fake:   # the base methods need only these three
        family, name = "internvl3", "tiny"
        frame_spec = InternVL3Backbone.spec_from_config({})
    with pytest.raises(ValueError, match=r"'internvl3' \(tiny\) cannot run at 308x308: its "
                                         r"vision tower takes 448x448 frames only"):
        Backbone.at_resolution(Fake(), 308, 308)
    with pytest.raises(ValueError, match="no reduced-resolution budget rule"):
        Backbone.budget_frame_size(Fake(), 64, 12288)


def test_frame_patches_match_image_processor_at_the_reduced_size():
    """At a smart_resize size, our patches are still Qwen2VLImageProcessor's for that image."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    imgs = (np.random.RandomState(4).rand(2, 308, 364, 3) * 255).astype(np.uint8)
    ref = Qwen2VLImageProcessorPil()(images=list(imgs), return_tensors="pt", do_resize=False)
    assert ref["image_grid_thw"].tolist() == [[1, 22, 26]] * 2
    mean, std = torch.tensor(CLIP_MEAN)[:, None, None], torch.tensor(CLIP_STD)[:, None, None]
    pv = (torch.from_numpy(imgs).permute(0, 3, 1, 2).float() / 255 - mean) / std
    torch.testing.assert_close(frame_patches(pv), ref["pixel_values"].float(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("size", [(308, 308), (224, 364)])
def test_view_equals_hf_forward_at_that_size(bb, size):
    """The view's whole path (encode_frames -> pool_pack at window 1 into inputs_embeds, prompt
    counts, M-RoPE positions) == HF's model(input_ids, pixel_values, image_grid_thw) called
    directly on the same frames at that size (window attention included: 11 and 13 merged
    tokens are not multiples of the 4x4 window)."""
    from vr_kernels import pool_pack
    from vr_runtime.backbones.prompt import plan_dest
    v = bb.at_resolution(*size)
    gh, gw = size[0] // 28, size[1] // 28
    T = 3
    pv = torch.randn(T, 3, *size, generator=torch.Generator().manual_seed(sum(size)))
    with torch.no_grad():
        Z = v.encode_frames(pv, chunk_size=2)
        ref_z = bb.model.get_image_features(pixel_values=frame_patches(pv),
                                            image_grid_thw=_thw([(gh, gw)] * T)).pooler_output
        assert Z.shape == (T, gh * gw, bb.hidden_size)
        torch.testing.assert_close(Z, torch.stack(list(ref_z)), rtol=1e-5, atol=1e-6)
        counts = pooled_counts([1] * T, v.grid)
        assert counts == [gh * gw] * T
        ids, starts = v.build_prompt(QUESTION, counts)
        E = v.embed_tokens(ids)[None].clone()
        pool_pack(Z, [1] * T, v.grid, out=E.view(-1, E.shape[-1]), dest=plan_dest(counts, starts),
                  backend="torch")
        pos = v.position_ids(ids, [1] * T, starts)
        ours = v.forward(inputs_embeds=E, position_ids=pos, logits_to_keep=0).logits
        mm = (ids == bb.image_token_id).int()[None]
        ref = bb.model(input_ids=ids[None], pixel_values=frame_patches(pv),
                       image_grid_thw=_thw([(gh, gw)] * T), mm_token_type_ids=mm).logits
        hf_pos, _ = bb.model.model.get_rope_index(ids[None], mm_token_type_ids=mm,
                                                  image_grid_thw=_thw([(gh, gw)] * T))
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(pos, hf_pos)
    kw = v.reference_inputs(ids, pv)   # the view's own reference helper follows the size too
    assert kw["image_grid_thw"].tolist() == [[1, 2 * gh, 2 * gw]] * T


def test_pooled_positions_on_the_view_match_rope_index(bb):
    """Pooled and dropped frames on the view's 11x11 grid: positions as HF's get_rope_index
    for images of the pooled grids."""
    v = bb.at_resolution(308, 308)
    plan = [2, 0, (1, 3), 4]
    counts = pooled_counts(plan, v.grid)
    ids, starts = v.build_prompt(QUESTION, counts)
    grids = [(math.ceil(11 / a), math.ceil(11 / b)) for a, b in [(2, 2), (1, 3), (4, 4)]]
    assert [g[0] * g[1] for g in grids] == [c for c in counts if c]
    mm = (ids == bb.image_token_id).int()[None]
    hf, _ = bb.model.model.get_rope_index(ids[None], mm_token_type_ids=mm,
                                          image_grid_thw=_thw(grids))
    assert torch.equal(v.position_ids(ids, plan, starts), hf)


def test_videorouter_on_the_view_answers_at_the_budget(bb):
    """A VideoRouter over the view (routers shared) answers the budget policy on frames of the
    view's size: every frame kept, T x (h/28)(w/28) visual tokens, as the rule says."""
    from vr_runtime.eval.methods import resized_router
    from vr_runtime.runtime import VideoRouter
    base = VideoRouter(bb, warmup_frames=0)
    T, B = 4, 512
    size = bb.budget_frame_size(T, B)
    assert size == (308, 308)
    sib = resized_router(base, size)
    assert resized_router(base, size) is sib and resized_router(base, (448, 448)) is base
    assert sib.lm.model is bb.model and sib.routers is base.routers
    frames = torch.randn(T, 3, *size, generator=torch.Generator().manual_seed(1))
    res = sib.answer(frames, QUESTION, policy="budget", budget=B, max_length=B + 400,
                     max_new_tokens=1)
    assert res.report["visual_tokens"] == T * 11 * 11 == 484
    assert len(res.report["frame_indices"]) == T
    with pytest.raises(ValueError,
                       match=r"frames are \(448, 448\), the model expects \(308, 308\)"):
        sib.answer(torch.zeros(T, 3, 448, 448), QUESTION, policy="budget", budget=B,
                   max_length=B + 400, max_new_tokens=1)

