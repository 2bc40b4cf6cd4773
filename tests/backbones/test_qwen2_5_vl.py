"""The Qwen2.5-VL backbone (vr_runtime/backbones/qwen2_5_vl.py) on the tiny-qwen2.5-vl preset:
the central equivalence with Hugging Face's own forward at window 1, the frame <-> temporal
patch mapping, M-RoPE positions for pooled and dropped frames, the shadow stack, cached
decoding, the shape presets and loading errors."""
import json
import pathlib
import random

import numpy as np
import pytest
import torch

from vr_kernels import pool_pack, pooled_counts
from vr_runtime.backbones.base import cache_kwargs, output_cache
from vr_runtime.backbones.qwen2_5_vl import (CLIP_MEAN, CLIP_STD, QWEN_SPECIAL_TOKENS,
                                             Qwen25VLBackbone, frame_patches, plan_grids)
from vr_runtime.errors import ModelFilesError

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "vr_runtime" / "configs"
QUESTION = "Which color is the star in the video?"


@pytest.fixture(scope="module")
def bb():
    torch.manual_seed(0)
    return Qwen25VLBackbone.tiny(device="cpu", dtype=torch.float32)


def _frames(T, seed):
    return torch.randn(T, 3, 448, 448, generator=torch.Generator().manual_seed(seed))


def _thw(grids):
    """HF image_grid_thw of images whose merged grids are ``grids`` [(gh, gw)]."""
    return torch.tensor([[1, 2 * gh, 2 * gw] for gh, gw in grids], dtype=torch.long)


def _hf_rope_index(bb, ids, grids):
    mm = (ids == bb.image_token_id).int()[None]
    pos, _ = bb.model.model.get_rope_index(ids[None], mm_token_type_ids=mm,
                                           image_grid_thw=_thw(grids) if grids else None)
    return pos


def _hf_forward_on_features(bb, ids, grids, feats):
    """HF's own forward on prompt ``ids`` [L] with precomputed image features ``feats`` (one
    [gh*gw, D] per kept frame, grids ``grids``): HF scatters them into the placeholders and
    derives M-RoPE from ``image_grid_thw`` itself. The features go in through the model's own
    ``get_image_features`` (patched for this call on this instance), the hook every release in
    the declared range calls from ``forward``: ``mm_encoder_outputs`` exists only from 5.18 on,
    and 5.17 swallows it in ``**kwargs`` and keeps the placeholders' own embeddings -- the wrong
    reference behind the failures on the GPU image (transformers 5.17), not the runtime."""
    from unittest import mock
    from transformers.modeling_outputs import BaseModelOutputWithPooling
    inner = bb.model.model
    dev = bb.device
    out = BaseModelOutputWithPooling(pooler_output=tuple(f.to(dev) for f in feats))
    with mock.patch.object(inner, "get_image_features", lambda *a, **k: out):
        return bb.model(input_ids=ids[None].to(dev), image_grid_thw=_thw(grids).to(dev),
                        pixel_values=torch.zeros(1, 1, device=dev),  # not read: features given
                        mm_token_type_ids=(ids == bb.image_token_id).int()[None].to(dev)).logits


def _compressed_embeds(bb, Z, plan, question=QUESTION, backend="torch"):
    """Prompt ids, inputs_embeds with pool_pack'ed frames, positions: the runtime's path."""
    counts = pooled_counts(plan, bb.grid)
    ids, starts = bb.build_prompt(question, counts)
    E = bb.embed_tokens(ids.to(bb.device))[None].clone()
    from vr_runtime.backbones.prompt import plan_dest
    pool_pack(Z, list(plan), bb.grid, out=E.view(-1, E.shape[-1]), dest=plan_dest(counts, starts),
              backend=backend)
    return ids, E, bb.position_ids(ids, plan, starts)


# ----------------------------------------------------------------------------- preset
def test_tiny_preset(bb):
    cfg = bb.model.config
    assert bb.grid == (16, 16) and bb.frame_spec.size == (448, 448)
    assert bb.frame_spec.mean == CLIP_MEAN and bb.frame_spec.std == CLIP_STD
    vc, tc = cfg.vision_config, cfg.text_config
    assert (vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size) == (14, 2, 2)
    assert list(vc.fullatt_block_indexes) == [1] and vc.depth == 2 and vc.window_size == 112
    head_dim = tc.hidden_size // tc.num_attention_heads
    assert sum(tc.rope_parameters["mrope_section"]) == head_dim // 2
    assert tc.num_hidden_layers == 4 and vc.out_hidden_size == tc.hidden_size
    tok = bb.tokenizer
    for t in QWEN_SPECIAL_TOKENS + ("<|im_start|>", "<|im_end|>"):
        assert len(tok.encode(t, add_special_tokens=False)) == 1, t
    assert bb.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>") == cfg.image_token_id
    assert cfg.video_token_id == tok.convert_tokens_to_ids("<|video_pad|>")
    assert tc.vocab_size == len(tok) and bb.model.training is False
    assert tok.convert_tokens_to_ids("<|im_end|>") in bb.stop_token_ids()
    from transformers import AutoModel
    with torch.device("meta"):
        assert type(AutoModel.from_config(tc)).__name__ == "Qwen2_5_VLTextModel"
    other = Qwen25VLBackbone.tiny()
    a, b = bb.model.state_dict(), other.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_prompt_layout(bb):
    ids, starts = bb.build_prompt(QUESTION, [3, 0, 2])
    text = bb.tokenizer.decode(ids)
    assert "Frame1: <|vision_start|>" + "<|image_pad|>" * 3 + "<|vision_end|>\nFrame3: " in text
    assert "Frame2" not in text and text.endswith("<|im_start|>assistant\n")
    assert [int(ids[s - 1]) for s in starts] == [bb.tokenizer.convert_tokens_to_ids("<|vision_start|>")] * 2


# ----------------------------------------------------------------------------- frames
def test_frame_patches_match_image_processor(bb):
    """A frame is a still image: our patches are Qwen2VLImageProcessor's for that image
    (temporal patch = the frame repeated), grid_thw [1, 32, 32]."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    imgs = (np.random.RandomState(3).rand(2, 448, 448, 3) * 255).astype(np.uint8)
    proc = Qwen2VLImageProcessorPil()
    ref = proc(images=list(imgs), return_tensors="pt", do_resize=False)
    assert ref["image_grid_thw"].tolist() == [[1, 32, 32]] * 2
    mean, std = torch.tensor(CLIP_MEAN)[:, None, None], torch.tensor(CLIP_STD)[:, None, None]
    pv = (torch.from_numpy(imgs).permute(0, 3, 1, 2).float() / 255 - mean) / std
    ours = frame_patches(pv)
    assert ours.shape == ref["pixel_values"].shape == (2048, 3 * 2 * 14 * 14)
    torch.testing.assert_close(ours, ref["pixel_values"].float(), rtol=0, atol=1e-5)
    # both temporal slices of every patch are the frame itself
    p = ours.view(-1, 3, 2, 14, 14)
    assert torch.equal(p[:, :, 0], p[:, :, 1])


@pytest.mark.parametrize("chunk", [1, 2])
def test_encode_frames_matches_get_image_features(bb, chunk):
    pv = _frames(3, seed=chunk)
    with torch.no_grad():
        Z = bb.encode_frames(pv, chunk_size=chunk)
        ref = bb.model.get_image_features(pixel_values=frame_patches(pv),
                                          image_grid_thw=_thw([(16, 16)] * 3)).pooler_output
    assert Z.shape == (3, 256, bb.hidden_size)
    torch.testing.assert_close(Z, torch.stack(list(ref)), rtol=1e-5, atol=1e-6)


def test_vision_split_and_projector_grad(bb):
    """vision_tower() (frozen) and projector() (merger) partition the tower's parameters;
    project(vision_features) is encode_frames and trains the merger only."""
    visual = {id(p) for p in bb.model.model.visual.parameters()}
    frozen = {id(p) for p in bb.vision_tower().parameters()}
    proj = {id(p) for p in bb.projector().parameters()}
    assert frozen and proj and not frozen & proj and frozen | proj == visual
    pv = _frames(2, seed=11)
    with torch.no_grad():  # the feature cache: the frozen tower runs without a graph
        (_, v), = list(bb.vision_features(pv))
    assert v.shape == (2, 256, 4 * bb.model.config.vision_config.hidden_size)
    Z = bb.project(v)
    assert Z.requires_grad and not v.requires_grad
    Z.square().sum().backward()
    assert all(p.grad is not None for p in bb.projector().parameters())
    assert all(p.grad is None for p in bb.vision_tower().parameters())
    bb.model.zero_grad(set_to_none=True)
    with torch.no_grad():
        torch.testing.assert_close(Z.detach(), bb.encode_frames(pv), rtol=1e-6, atol=1e-7)


def test_z_is_row_major_on_the_merged_grid(bb):
    """With the tower's blocks made the identity, token k of Z_t depends only on the 28x28
    pixels of merged cell (k // 16, k % 16): patchify, window order and the merger agree."""
    import copy
    model = copy.deepcopy(bb.model)
    with torch.no_grad():
        for blk in model.model.visual.blocks:
            for lin in (blk.attn.proj, blk.mlp.down_proj):
                lin.weight.zero_()
                lin.bias.zero_()
    ident = Qwen25VLBackbone(model, bb.tokenizer, bb.device, bb.dtype, "identity-blocks")
    pv = _frames(1, seed=5)
    with torch.no_grad():
        base = ident.encode_frames(pv)
        for r, c in [(0, 0), (0, 15), (3, 11), (9, 4), (15, 15)]:
            bumped = pv.clone()
            bumped[:, :, 28 * r:28 * r + 28, 28 * c:28 * c + 28] += 1.0
            changed = (ident.encode_frames(bumped) - base).abs().amax(-1)[0] > 0
            assert changed.nonzero().flatten().tolist() == [16 * r + c], (r, c)


# ----------------------------------------------------------------------------- equivalence
def test_window1_equals_hf_forward(bb):
    """THE equivalence: encode_frames -> pool_pack(window 1) into inputs_embeds + our M-RoPE
    positions == model(input_ids, pixel_values, image_grid_thw) on the same frames."""
    T = 3
    pv = _frames(T, seed=7)
    with torch.no_grad():
        Z = bb.encode_frames(pv, chunk_size=2)
        ids, E, pos = _compressed_embeds(bb, Z, [1] * T)
        ours = bb.forward(inputs_embeds=E, position_ids=pos, logits_to_keep=0).logits
        inputs = bb.reference_inputs(ids, pv)
        assert inputs["image_grid_thw"].tolist() == [[1, 32, 32]] * T
        ref = bb.model(**inputs).logits
    assert ours.shape == ref.shape == (1, ids.numel(), bb.model.config.text_config.vocab_size)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(pos, _hf_rope_index(bb, ids, [(16, 16)] * T))


def test_pooled_plan_equals_hf_forward_on_pooled_features(bb):
    """A mixed plan (dropped, square, non-square windows): our path equals HF's own forward
    given the same pooled features as the image features (:func:`_hf_forward_on_features`) with
    each kept frame's pooled grid in ``image_grid_thw``: HF scatters them and derives M-RoPE."""
    from vr_kernels.reference import pool_pack_reference
    plan = [2, 0, (1, 4), 1, (3, 5)]
    with torch.no_grad():
        Z = bb.encode_frames(_frames(len(plan), seed=23))
        ids, E, pos = _compressed_embeds(bb, Z, plan)
        ours = bb.forward(inputs_embeds=E, position_ids=pos, logits_to_keep=0).logits
        kept = [(t, g) for t, g in enumerate(plan_grids(plan, bb.grid)) if g is not None]
        feats = [pool_pack_reference(Z[t:t + 1], [plan[t]], bb.grid) for t, _ in kept]
        ref = _hf_forward_on_features(bb, ids, [g for _, g in kept], feats)
        plain = bb.model(input_ids=ids[None], position_ids=pos).logits
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    # the reference really holds the features (not the placeholders' own embeddings)
    assert not torch.allclose(ref, plain, rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_window1_equals_hf_forward_cuda(dtype):
    """On CUDA (Triton pool_pack, positions on the device): the same equivalence, and a mixed
    plan against HF given the pooled features (bf16: rounding-level)."""
    from vr_kernels.reference import pool_pack_reference
    cb = Qwen25VLBackbone.tiny(device="cuda", dtype=dtype)
    pv = _frames(3, seed=29)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    with torch.inference_mode():
        Z = cb.encode_frames(pv, chunk_size=2)
        ids, E, pos = _compressed_embeds(cb, Z, [1] * 3, backend="auto")
        assert pos.device.type == "cuda"
        ours = cb.forward(inputs_embeds=E, position_ids=pos, logits_to_keep=0).logits.float()
        ref = cb.model(**cb.reference_inputs(ids, pv)).logits.float()
        torch.testing.assert_close(ours, ref, rtol=tol, atol=tol)
        plan = [2, 0, (1, 4)]
        ids, E, pos = _compressed_embeds(cb, Z, plan, backend="auto")
        ours = cb.forward(inputs_embeds=E, position_ids=pos, logits_to_keep=0).logits.float()
        kept = [(t, g) for t, g in enumerate(plan_grids(plan, cb.grid)) if g is not None]
        feats = [pool_pack_reference(Z[t:t + 1], [plan[t]], cb.grid) for t, _ in kept]
        ref = _hf_forward_on_features(cb, ids, [g for _, g in kept], feats).float()
        torch.testing.assert_close(ours, ref, rtol=tol, atol=tol)


# ----------------------------------------------------------------------------- positions
WINDOWS = [0, 1, 2, 3, 4, 5, 16, (2, 1), (1, 4), (3, 5), (16, 1), (8, 16)]


@pytest.mark.parametrize("seed", range(4))
def test_positions_pooled_plans_match_rope_index_and_are_unique(bb, seed):
    rng = random.Random(seed)
    T = rng.choice([1, 4, 7])
    plan = [rng.choice(WINDOWS) for _ in range(T)]
    if seed == 0:
        plan = [0] * T  # every frame dropped: text only
    ids, starts = bb.build_prompt(QUESTION, pooled_counts(plan, bb.grid))
    pos = bb.position_ids(ids, plan, starts)
    assert pos.shape == (3, 1, ids.numel()) and pos.dtype == torch.long
    kept = [g for g in plan_grids(plan, bb.grid) if g is not None]
    # placed exactly as HF places an image of each pooled grid
    assert torch.equal(pos, _hf_rope_index(bb, ids, kept))
    triples = pos[:, 0].T.tolist()
    assert len(set(map(tuple, triples))) == len(triples), plan
    is_img = ids == bb.image_token_id
    text = pos[:, 0, ~is_img]
    assert torch.equal(text[0], text[1]) and torch.equal(text[1], text[2])
    assert bool((text[0].diff() > 0).all())  # text advances, never reuses a position
    for s, (gh, gw) in zip(starts, kept):
        blk = pos[:, 0, s:s + gh * gw]
        assert bool((blk[0] == blk[0, 0]).all())
        assert blk[1].view(gh, gw)[:, 0].tolist() == list(range(int(blk[0, 0]), int(blk[0, 0]) + gh))
        assert blk[2].view(gh, gw)[0].tolist() == list(range(int(blk[0, 0]), int(blk[0, 0]) + gw))


def test_position_ids_check_their_arguments(bb):
    plan = [1, 0, 2]
    ids, starts = bb.build_prompt(QUESTION, pooled_counts(plan, bb.grid))
    with pytest.raises(ValueError, match="frame_starts"):
        bb.position_ids(ids, plan, starts[:1])
    with pytest.raises(ValueError, match="placeholders"):
        bb.position_ids(ids, plan, [starts[0], starts[1] - 1])
    with pytest.raises(ValueError, match="rows but the plan"):
        bb.position_ids(ids, [1, 1, 2], starts + [0])
    with pytest.raises(ValueError, match=r"plan\[1\]"):
        bb.position_ids(ids, [1, -1, 2], starts)


def test_router_positions(bb):
    pos = bb.router_position_ids((8, 4), 5, batch=3)
    assert pos.shape == (3, 3, 32 + 5)
    p = pos[:, 0]
    assert bool((p[0, :32] == 0).all())
    assert p[1, :32].view(8, 4)[:, 0].tolist() == list(range(8))
    assert p[2, :32].view(8, 4)[0].tolist() == list(range(4))
    assert p[:, 32:].tolist() == [list(range(8, 13))] * 3
    assert torch.equal(pos[:, 0], pos[:, 2])


# ----------------------------------------------------------------------------- shadow stack
def _layer_output(decoder, k, x, pos):
    """The backbone decoder's residual stream after its first k layers (a forward hook)."""
    got = {}

    def hook(_m, _i, out):
        got["h"] = out[0] if isinstance(out, tuple) else out
    h = decoder.layers[k - 1].register_forward_hook(hook)
    try:
        decoder(inputs_embeds=x, position_ids=pos, use_cache=False)
    finally:
        h.remove()
    return got["h"]


@pytest.mark.parametrize("k", [2, 4])
def test_shadow_stack_is_the_first_layers_with_mrope(bb, k):
    from vr_runtime.routing.routers import RouterConfig, Routers, ShadowStack
    dec = bb.decoder()
    shadow = ShadowStack(bb.text_config, k, source=dec).eval()
    with torch.no_grad():
        Z = bb.encode_frames(_frames(2, seed=13))
        q = bb.embed_tokens(bb.tokenizer(QUESTION, add_special_tokens=False,
                                         return_tensors="pt")["input_ids"][0])
        Zp = pool_pack(Z, [2, 2], bb.grid, backend="torch").view(2, 64, -1)
        x = torch.cat([Zp, q[None].expand(2, -1, -1)], 1)
        pos = bb.router_position_ids((8, 8), q.shape[0], batch=2)
        ref = _layer_output(dec, k, x, pos)
        got = shadow(x, position_ids=pos)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        # M-RoPE matters: 1-D positions give other features
        assert (shadow(x) - ref).abs().max() > 1e-3
        # the visual-cache split (prefix over Z_t, then the question) is the same computation
        Hz, cache = shadow.prefix(x[:, :64], position_ids=pos[:, :, :64])
        Hq = shadow.extend(x[:, 64:], cache, position_ids=pos[:, :, 64:])
        torch.testing.assert_close(torch.cat([Hz, Hq], 1), ref, rtol=1e-5, atol=1e-5)
        routers = Routers(RouterConfig(num_layers=k).resolved(bb.hidden_size), bb.text_config,
                          source=dec).eval()
        torch.testing.assert_close(routers.shadow(x, position_ids=pos), ref, rtol=1e-5, atol=1e-5)
        assert routers.image(routers.shadow(x, position_ids=pos)).shape == (2,)
        assert routers.policy_logits(q).shape == (1, 2)


# ----------------------------------------------------------------------------- decoding
def test_cached_decode_equals_full_forward(bb):
    """Prefill with explicit M-RoPE positions, then cached steps at next_position: the same
    logits as one full forward over prompt + generated tokens (mixed, dropped, non-square)."""
    plan = [1, 0, (4, 2), 3]
    with torch.no_grad():
        Z = bb.encode_frames(_frames(len(plan), seed=17))
        ids, E, pos = _compressed_embeds(bb, Z, plan)
        gen = torch.tensor([[41, 7, 300]])
        L = ids.numel()
        p0 = bb.next_position(pos, L)
        assert p0 == int(pos.max()) + 1
        full_pos = torch.cat([pos] + [bb.step_position_ids(p0 + i) for i in range(3)], -1)
        full = bb.forward(inputs_embeds=torch.cat([E, bb.embed_tokens(gen)], 1),
                          position_ids=full_pos, logits_to_keep=4).logits
        out = bb.forward(inputs_embeds=E, position_ids=pos)
        steps = [out.logits[:, -1]]
        cache = output_cache(out)
        for i in range(2):
            out = bb.forward(inputs_embeds=bb.embed_tokens(gen[:, i:i + 1]),
                             position_ids=bb.step_position_ids(p0 + i), past_key_values=cache)
            cache = output_cache(out)
            steps.append(out.logits[:, -1])
        torch.testing.assert_close(torch.stack(steps, 1), full[:, :3], rtol=1e-5, atol=1e-5)


def test_decode_step_equals_hf_generation_positions(bb):
    """At window 1 our decode step (next_position) equals HF's own cached step, which derives
    positions from its rope_deltas."""
    T = 2
    pv = _frames(T, seed=19)
    with torch.no_grad():
        Z = bb.encode_frames(pv)
        ids, E, pos = _compressed_embeds(bb, Z, [1] * T)
        hf = bb.model(**bb.reference_inputs(ids, pv), use_cache=True)
        nxt = torch.tensor([[42]])
        hf_step = bb.model(input_ids=nxt, use_cache=True, mm_token_type_ids=torch.zeros_like(nxt),
                           **cache_kwargs(bb.model, output_cache(hf))).logits[:, -1]
        bb.model.model.rope_deltas = None
        out = bb.forward(inputs_embeds=E, position_ids=pos)
        ours = bb.forward(inputs_embeds=bb.embed_tokens(nxt), past_key_values=output_cache(out),
                          position_ids=bb.step_position_ids(bb.next_position(pos, ids.numel())))
    torch.testing.assert_close(ours.logits[:, -1], hf_step, rtol=1e-5, atol=1e-5)
    # a text-only prompt without positions gets 1-D positions, not HF's stale rope_deltas
    with torch.no_grad():
        a = bb.forward(input_ids=nxt).logits
        bb.model.model.rope_deltas = torch.tensor([[1000]])
        b = bb.forward(input_ids=nxt).logits
        bb.model.model.rope_deltas = None
    torch.testing.assert_close(a, b, rtol=0, atol=0)


# ----------------------------------------------------------------------------- presets, loading
@pytest.mark.parametrize("name,params,fields", [
    ("7b", 8_292_166_656, dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                               num_key_value_heads=4, intermediate_size=18944, vocab_size=152064)),
    ("3b", 3_754_622_976, dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16,
                               num_key_value_heads=2, intermediate_size=11008, vocab_size=151936)),
])
def test_shape_presets(name, params, fields):
    """Public config.json values; parameter count on the meta device = the published size."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    d = json.loads((CONFIGS / f"qwen2_5_vl_{name}.json").read_text())
    d.pop("_comment")
    cfg = Qwen2_5_VLConfig.from_dict(d)
    tc, vc = cfg.text_config, cfg.vision_config
    assert {k: getattr(tc, k) for k in fields} == fields
    assert tc.rope_parameters["mrope_section"] == [16, 24, 24]
    assert (vc.depth, vc.hidden_size, vc.out_hidden_size, list(vc.fullatt_block_indexes),
            vc.window_size, vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size) == \
        (32, 1280, tc.hidden_size, [7, 15, 23, 31], 112, 14, 2, 2)
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration._from_config(cfg)
    assert sum(p.numel() for p in model.parameters()) == params


def test_from_config_pairs_the_tiny_tokenizer():
    d = json.loads((CONFIGS / "qwen2_5_vl_7b.json").read_text())
    d.update(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
             intermediate_size=96, vocab_size=2048,
             rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]})
    d["vision_config"].update(depth=1, hidden_size=32, num_heads=2, intermediate_size=48,
                              out_hidden_size=64, fullatt_block_indexes=[0])
    b = Qwen25VLBackbone.from_config(d, seed=1)
    tok = b.tokenizer
    assert b.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>")
    assert b.model.config.text_config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        Z = b.encode_frames(_frames(2, seed=2))
        _, E, pos = _compressed_embeds(b, Z, [2, 1])
        assert torch.isfinite(b.forward(inputs_embeds=E, position_ids=pos).logits).all()
    d["vocab_size"] = 100
    with pytest.raises(ValueError, match="vocab_size"):
        Qwen25VLBackbone.from_config(d)
    # the nested layout (text_config) too, with a vocabulary larger than the tokenizer
    from vr_runtime.backbones.qwen2_5_vl import special_ids, tiny_config_dict
    nested = tiny_config_dict(4096, {k: 0 for k in special_ids(tok)})
    n = Qwen25VLBackbone.from_config(nested, name="nested")
    assert n.model.config.text_config.vocab_size == 4096 and n.name == "nested"
    assert n.image_token_id == b.image_token_id
    assert n.model.config.text_config.pad_token_id == tok.convert_tokens_to_ids("<|endoftext|>")


def test_load_local_dir_and_bad_dirs(bb, tmp_path):
    good = tmp_path / "Qwen2.5-VL-tiny-Instruct"
    bb.model.save_pretrained(str(good))
    bb.tokenizer.save_pretrained(str(good))
    loaded = Qwen25VLBackbone.load(good)
    ids = torch.tensor([[5, 60, 70, 2]])
    with torch.no_grad():
        torch.testing.assert_close(loaded.forward(input_ids=ids).logits,
                                   bb.forward(input_ids=ids).logits, rtol=0, atol=0)
    assert loaded.image_token_id == bb.image_token_id and loaded.name == good.name

    def one_line(path, match):
        with pytest.raises(ModelFilesError, match=match) as e:
            Qwen25VLBackbone.load(path)
        assert "\n" not in str(e.value)
    one_line(tmp_path / "nope", "not a directory")
    (tmp_path / "empty").mkdir()
    one_line(tmp_path / "empty", r"missing config.json, \*.safetensors, tokenizer")
    from safetensors.torch import load_file, save_file
    state = load_file(str(good / "model.safetensors"))
    cut = sorted(k for k in state if "merger" in k)[0]
    save_file({k: v for k, v in state.items() if k != cut}, str(good / "model.safetensors"),
              metadata={"format": "pt"})
    one_line(good, "lack 1 weight")
    save_file(state, str(good / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((good / "config.json").read_text())
    (good / "config.json").write_text(json.dumps(dict(cfg, model_type="internvl")))
    one_line(good, "model_type 'internvl', expected 'qwen2_5_vl'")
    (good / "config.json").write_text("{not json")
    one_line(good, "unreadable config.json")
