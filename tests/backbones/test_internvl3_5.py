"""InternVL3.5 (InternVL3's layout over a Qwen3 LLM, `InternVL3_5-*-HF`) through the InternVL3
backbone: a random checkpoint of that layout against Hugging Face's own forward and generate at
window 1, the shadow stack over Qwen3 layers, every policy at scales 1,1,1, a saved directory,
and the 1B / 2B / 8B shape presets."""
import json
import pathlib

import pytest
import torch

from vr_runtime.backbones.internvl3 import InternVL3Backbone
from vr_runtime.backbones.prompt import build_video_prompt
from vr_runtime.reconstruct import reconstruct_embeds

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "vr_runtime" / "configs"
Q = "Which color is the circle?"


def tiny_qwen3_config() -> dict:
    """The 1B preset's layout at tiny widths: InternViT (2 layers of 64) and Qwen3 (4 layers of
    128, 4 heads of head_dim 64 -- not hidden / heads, as in Qwen3-0.6B -- with q/k norms)."""
    d = json.loads((CONFIGS / "internvl3_5_1b.json").read_text())
    d.pop("_comment")
    d["vision_config"].update(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=128)
    d["text_config"].update(hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=64, intermediate_size=256,
                            vocab_size=2048)
    return d


@pytest.fixture(scope="module")
def bb():
    return InternVL3Backbone.from_config(tiny_qwen3_config(), dtype=torch.float32, seed=2,
                                         name="tiny-internvl3.5")


def _frames(T, seed):
    return torch.randn(T, 3, 448, 448, generator=torch.Generator().manual_seed(seed))


def test_layout_is_internvl_over_qwen3(bb):
    assert type(bb.decoder()).__name__ == "Qwen3Model" and bb.grid == (16, 16)
    assert bb.text_config.head_dim == 64 != bb.hidden_size // bb.text_config.num_attention_heads


def test_window1_equals_hf_forward_and_generate(bb):
    pv = _frames(3, seed=4)
    ids, starts = build_video_prompt(bb.tokenizer, Q, [256] * 3, bb.image_token_id)
    with torch.no_grad():
        ref = bb.model(input_ids=ids[None], pixel_values=pv).logits
        Z = bb.encode_frames(pv, chunk_size=2)
        E = reconstruct_embeds(bb.model, ids, Z, [1, 1, 1], bb.image_token_id, bb.grid,
                               frame_starts=starts)
        torch.testing.assert_close(bb.forward(inputs_embeds=E, logits_to_keep=0).logits, ref,
                                   rtol=1e-5, atol=1e-5)
        n = 6
        gen = bb.model.generate(input_ids=ids[None], pixel_values=pv, max_new_tokens=n,
                                do_sample=False, eos_token_id=sorted(bb.stop_token_ids()),
                                pad_token_id=0)[0, ids.numel():].tolist()
        from vr_runtime.runtime import VideoRouter
        mine = VideoRouter(bb, warmup_frames=0).generate(E, n)
    stops = bb.stop_token_ids()
    gen = gen[:next((i for i, t in enumerate(gen) if t in stops), n)]
    assert mine == gen and mine


@pytest.mark.parametrize("k", [2, 4])
def test_shadow_stack_copies_qwen3_layers(bb, k):
    """The shadow stack's features after k layers equal the LLM's hidden states there."""
    from vr_runtime.routing.routers import RouterConfig, Routers
    r = Routers.from_backbone(bb, RouterConfig(num_layers=k, router_dim=32, num_heads=4))
    x = torch.randn(1, 20, bb.hidden_size, generator=torch.Generator().manual_seed(k))
    with torch.no_grad():
        hs = bb.decoder()(inputs_embeds=x, output_hidden_states=True).hidden_states[k]
        H = r.shadow(x)
    if k == bb.text_config.num_hidden_layers:
        H = bb.decoder().norm(H)   # HF's last hidden state is after the final norm
    torch.testing.assert_close(H, hs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("policy", ["global", "fragment", "budget", "uniform"])
def test_every_policy_at_scales_1_is_dense(bb, policy):
    from vr_runtime.runtime import VideoRouter
    vr = VideoRouter(bb, warmup_frames=0)
    pv = _frames(3, seed=9)
    kw = dict(num_frames=3, max_new_tokens=3, global_window=1, relevant_window=1, other_window=1)
    dense = vr.answer(pv, Q, policy="dense", **kw)
    r = vr.answer(pv, Q, policy=policy, budget=3 * 256, **kw)
    assert r.text == dense.text and r.report["visual_tokens"] == 3 * 256
    small = vr.answer(pv, Q, policy=policy, budget=300, num_frames=3, max_new_tokens=1).report
    assert 0 < small["visual_tokens"] <= 300


def test_saved_directory_loads(bb, tmp_path):
    from vr_runtime.backbones import load_backbone
    d = tmp_path / "InternVL3_5-tiny-HF"
    bb.model.save_pretrained(str(d))
    bb.tokenizer.save_pretrained(str(d))
    loaded = load_backbone(d)
    assert type(loaded) is InternVL3Backbone
    ids = torch.tensor([[5, 60, 70, 2]])
    with torch.no_grad():
        torch.testing.assert_close(loaded.forward(input_ids=ids).logits,
                                   bb.forward(input_ids=ids).logits, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,params,fields", [
    ("1b", 1_060_897_792, dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                               num_key_value_heads=8, intermediate_size=3072, head_dim=128)),
    ("2b", 2_348_347_392, dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
                               num_key_value_heads=8, intermediate_size=6144, head_dim=128)),
    ("8b", 8_528_318_464, dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                               num_key_value_heads=8, intermediate_size=12288, head_dim=128)),
])
def test_shape_presets(name, params, fields):
    """The released InternVL3_5-*-HF sizes (1.06B, 2.35B, 8.53B): InternViT-300M + Qwen3."""
    from transformers import InternVLConfig, InternVLForConditionalGeneration
    d = json.loads((CONFIGS / f"internvl3_5_{name}.json").read_text())
    d.pop("_comment")
    cfg = InternVLConfig.from_dict(d)
    tc, vc = cfg.text_config, cfg.vision_config
    assert tc.model_type == "qwen3" and {k: getattr(tc, k) for k in fields} == fields
    assert (vc.hidden_size, vc.num_hidden_layers) == (1024, 24)
    with torch.device("meta"):
        model = InternVLForConditionalGeneration._from_config(cfg)
    assert sum(p.numel() for p in model.parameters()) == params
    from vr_runtime.planning.cost_model import load_shape
    s = load_shape(str(CONFIGS / f"internvl3_5_{name}.json"))
    assert s.tokens_per_frame == 256 and s.d == fields["hidden_size"] and s.hd == 128
