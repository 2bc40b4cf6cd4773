"""Model loading, the tiny preset, chunked vision encoding, and the central equivalence: the
compressed path with every frame at window 1 is the plain Hugging Face forward."""
import json

import pytest
import torch

from vr_runtime.errors import DeviceError, ModelFilesError
from vr_runtime.backbones import backbone_from_config, load_backbone
from vr_runtime.backbones.prompt import build_video_prompt
from vr_runtime.reconstruct import reconstruct_embeds
from vr_runtime.backbones.tiny import SPECIAL_TOKENS, load_tiny_tokenizer


def _hf_image_features(model, pv):
    out = model.get_image_features(pixel_values=pv, vision_feature_layer=-1,
                                   vision_feature_select_strategy="default")
    return out if isinstance(out, torch.Tensor) else out.pooler_output  # 4.5x tensor / 5.x output


def test_tiny_shapes(tiny_lm):
    cfg = tiny_lm.model.config
    assert tiny_lm.grid == (16, 16)
    assert cfg.vision_config.patch_size in ([14, 14], (14, 14))
    assert cfg.text_config.num_hidden_layers >= 4
    assert tiny_lm.image_token_id == tiny_lm.tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>")
    assert tiny_lm.model.training is False


def test_tiny_tokenizer():
    tok = load_tiny_tokenizer()
    for t in SPECIAL_TOKENS:
        assert len(tok.encode(t, add_special_tokens=False)) == 1
    for w in (" red", " blue", " circle", " frame", " video", " yes", " no", " which", " appear"):
        assert len(tok.encode(w, add_special_tokens=False)) == 1, w
    text = "Which color is the star in Frame12? Answer: purple"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_tiny_weights_deterministic(tiny_lm):
    other = load_backbone("tiny")
    a, b = tiny_lm.model.state_dict(), other.model.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("chunk", [1, 2, 16])
def test_encode_frames_matches_hf(tiny_lm, frames, chunk):
    pv = frames(3, seed=chunk)
    with torch.no_grad():
        ref = _hf_image_features(tiny_lm.model, pv)
        Z = tiny_lm.encode_frames(pv, chunk_size=chunk)
    assert Z.shape == (3, 256, tiny_lm.hidden_size)
    torch.testing.assert_close(Z, ref, rtol=1e-5, atol=1e-6)


def test_compressed_path_window1_equals_hf_forward(tiny_lm, frames):
    """Prompt + pool_pack(window 1) into inputs_embeds == model(input_ids, pixel_values)."""
    lm = tiny_lm
    pv = frames(3, seed=7)
    plan = [1, 1, 1]
    ids, starts = build_video_prompt(lm.tokenizer, "Which color is the circle?", [256] * 3,
                                     lm.image_token_id)
    with torch.no_grad():
        ref = lm.model(input_ids=ids[None], pixel_values=pv).logits
        Z = lm.encode_frames(pv, chunk_size=2)
        embeds = reconstruct_embeds(lm.model, ids, Z, plan, lm.image_token_id, lm.grid,
                                    frame_starts=starts)
        ours = lm.model(inputs_embeds=embeds).logits
        # Negative control: the same path with two frames swapped must change the logits.
        swapped = reconstruct_embeds(lm.model, ids, Z[[1, 0, 2]], plan, lm.image_token_id, lm.grid)
        other = lm.model(inputs_embeds=swapped).logits
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    assert (other - ref).abs().max() > 1e-4


def test_load_backbone_errors(tmp_path):
    with pytest.raises(ModelFilesError, match="not a directory"):
        load_backbone(tmp_path / "nope")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "internvl"}))
    with pytest.raises(ModelFilesError, match="safetensors"):
        load_backbone(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "internvl_chat"}))
    with pytest.raises(ModelFilesError, match="internvl_chat"):
        load_backbone(tmp_path)
    with pytest.raises(ValueError, match="dtype"):
        load_backbone("tiny", dtype="int8")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_absent_is_device_error():
    with pytest.raises(DeviceError, match="CUDA"):
        load_backbone("tiny", device="cuda")


def test_backbone_from_config(small_config, frames):
    lm = backbone_from_config(small_config(hidden=96), device="cpu", dtype="fp32", seed=3)
    tok = lm.tokenizer
    assert lm.image_token_id == tok.convert_tokens_to_ids("<IMG_CONTEXT>")
    assert lm.model.config.text_config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert lm.hidden_size == 96 and lm.grid == (16, 16)
    again = backbone_from_config(small_config(hidden=96), seed=3)
    w1 = lm.model.get_input_embeddings().weight
    assert torch.equal(w1, again.model.get_input_embeddings().weight)
    assert 0.015 < float(w1.detach().std()) < 0.025  # N(0, 0.02), not uninitialised memory
    with torch.no_grad():
        Z = lm.encode_frames(frames(2), chunk_size=1)
    assert Z.shape == (2, 256, 96) and torch.isfinite(Z).all()
    with pytest.raises(ValueError, match="vocab_size"):
        backbone_from_config(small_config(vocab=100))


def test_flash_attention_only_when_transformers_accepts_it(monkeypatch, small_config):
    import sys
    import types

    import transformers.utils

    import vr_runtime.backbones.internvl3 as M
    import vr_runtime.backbones.devices as DV
    cuda = torch.device("cuda")  # only inspected, nothing is allocated
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setattr(transformers.utils, "is_flash_attn_2_available", lambda: False)
    assert DV.pick_attn_implementation(None, cuda, torch.bfloat16) == "sdpa"
    monkeypatch.setattr(transformers.utils, "is_flash_attn_2_available", lambda: True)
    assert DV.pick_attn_implementation(None, cuda, torch.bfloat16) == "flash_attention_2"
    assert DV.pick_attn_implementation(None, cuda, torch.float32) == "sdpa"
    assert DV.pick_attn_implementation("eager", cuda, torch.bfloat16) == "eager"
    # Chosen automatically but refused when the model is built: backbone_from_config uses sdpa.
    monkeypatch.delitem(sys.modules, "flash_attn")
    monkeypatch.setattr(M, "pick_attn_implementation", lambda *a: "flash_attention_2")
    lm = backbone_from_config(small_config(hidden=96), device="cpu", dtype="fp32")
    assert lm.model.config._attn_implementation == "sdpa"


def test_load_hf_directory_round_trip(tiny_lm, tmp_path, frames):
    """An InternVL3-*-hf style directory (save_pretrained of the tiny model) loads with
    local_files_only + safetensors and gives the same model, tokenizer and prompt."""
    tiny_lm.model.save_pretrained(tmp_path, safe_serialization=True)
    tiny_lm.tokenizer.save_pretrained(tmp_path)
    assert list(tmp_path.glob("*.safetensors"))
    lm = load_backbone(tmp_path, device="cpu", dtype="fp32")
    assert lm.name == tmp_path.name and lm.image_token_id == tiny_lm.image_token_id
    a, b = tiny_lm.model.state_dict(), lm.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    counts = [64, 0, 256]
    ids1, _ = build_video_prompt(tiny_lm.tokenizer, "Which shape is blue?", counts, lm.image_token_id)
    ids2, _ = build_video_prompt(lm.tokenizer, "Which shape is blue?", counts, lm.image_token_id)
    assert torch.equal(ids1, ids2)
    lm16 = load_backbone(tmp_path, dtype="bf16")
    assert lm16.dtype == torch.bfloat16 and next(lm16.model.parameters()).dtype == torch.bfloat16


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_window1_equals_hf_forward_cuda(frames, dtype):
    """On CUDA the same equivalence through the Triton pool_pack (bf16: rounding-level)."""
    lm = load_backbone("tiny", device="cuda", dtype=dtype)
    pv = frames(3, seed=17)
    ids, starts = build_video_prompt(lm.tokenizer, "Which color is the circle?", [256] * 3,
                                     lm.image_token_id)
    with torch.inference_mode():
        ref = lm.model(input_ids=ids[None].cuda(), pixel_values=pv.cuda()).logits.float()
        Z = lm.encode_frames(pv, chunk_size=2)
        embeds = reconstruct_embeds(lm.model, ids, Z, [1, 1, 1], lm.image_token_id, lm.grid,
                                    frame_starts=starts)
        ours = lm.model(inputs_embeds=embeds).logits.float()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(ours, ref, rtol=tol, atol=tol)
