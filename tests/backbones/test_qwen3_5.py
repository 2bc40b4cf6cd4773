"""Qwen3.5 (tiny-qwen3.5): Qwen3-VL's vision tower and video prompt over a hybrid LLM (Gated
DeltaNet and full attention, 3:1), run on CPU with transformers' PyTorch fallback for the
linear-attention layers. Window 1 against Hugging Face's forward and generate, the shadow stack
over both layer kinds (and its cached prefix), every policy at scales 1,1,1, a batch answered
as each request alone, and --ttft-budget refused in one line."""
import types

import pytest
import torch

from test_qwen3_vl import INDICES, Q, _clip, _frames, _ours, _processor_inputs
from vr_runtime.backbones.qwen3_vl import Qwen35Backbone


@pytest.fixture(scope="module")
def bb():
    return Qwen35Backbone.tiny()


@pytest.fixture(scope="module")
def vr(bb):
    from vr_runtime.runtime import VideoRouter
    return VideoRouter(bb, warmup_frames=0)


def test_hybrid_layers_and_one_stream(bb):
    assert bb.text_config.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    assert bb.streams == 1 and bb.frames_per_unit == 2 and not bb.pads_exactly


def test_window1_equals_hf_forward_and_generate(bb, vr):
    frames = _frames(len(INDICES), seed=21)
    ref = _processor_inputs(bb, frames)
    ids, E, pos, Z = _ours(bb, frames, [1, 1, 1])
    assert torch.equal(ids, ref["input_ids"][0]) and Z.shape[-1] == bb.hidden_size
    with torch.no_grad():
        torch.testing.assert_close(bb.forward(inputs_embeds=E, position_ids=pos).logits[0, -1],
                                   bb.model(**ref).logits[0, -1], rtol=1e-4, atol=1e-4)
        n = 5
        gen = bb.model.generate(**ref, max_new_tokens=n, do_sample=False,
                                eos_token_id=sorted(bb.stop_token_ids()), pad_token_id=0)
        mine = vr.generate(E, n, position_ids=pos)
    hf = gen[0, ids.numel():].tolist()
    stops = bb.stop_token_ids()
    assert mine == hf[:next((i for i, t in enumerate(hf) if t in stops), n)] and mine


def test_shadow_stack_copies_both_layer_kinds(bb):
    """After 4 layers (3 Gated DeltaNet, 1 attention) the shadow stack's features equal the
    LLM's, and the Image Router's cached [Z_t] prefix gives the uncached logits."""
    from vr_runtime.routing.routers import RouterConfig, Routers, embed_question
    r = Routers.from_backbone(bb, RouterConfig(router_dim=32, num_heads=4))
    x = torch.randn(2, 30, bb.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        hs = bb.decoder()(inputs_embeds=x, output_hidden_states=True).hidden_states[4]
        torch.testing.assert_close(bb.decoder().norm(r.shadow(x)), hs, rtol=1e-5, atol=1e-5)
        pv, _, _ = bb.units(_frames(4, seed=4), [0, 1, 2, 3], None)
        Z = bb.encode_frames(pv)
        q = embed_question(bb.model, bb.tokenizer, Q)
        full = r.frame_logits(Z, q, grid=bb.grid)
        cached = r.frame_logits_cached(r.visual_cache(Z, grid=bb.grid), q)
    # atol 1e-4: transformers 5.5.4's torch fallback runs the cached continuation through
    # another form of the gated delta rule (chunked vs recurrent): the same sums in another
    # order (2.6e-5 seen there; 0 on newer releases).
    torch.testing.assert_close(full, cached, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("policy", ["global", "fragment", "uniform"])
def test_every_policy_at_scales_1_is_dense(vr, policy):
    c = _clip()
    kw = dict(num_frames=8, max_new_tokens=3, global_window=1, relevant_window=1, other_window=1)
    dense = vr.answer(c, Q, policy="dense", **kw)
    r = vr.answer(c, Q, policy=policy, budget=4 * 196, **kw)
    assert r.text == dense.text and r.report["visual_tokens"] == 4 * 196
    assert r.report["backbone"] == "qwen3_5"


def test_batch_answers_each_request_as_alone(vr):
    """Two requests of different lengths: a right-padded prefill would feed the padding into
    the shorter one's recurrent state, so the batch is answered one by one (the same answers)."""
    a, b = _clip(8, seed=1), _clip(4, seed=2)
    kw = dict(max_new_tokens=4, policy="global")
    alone = [vr.answer(a, Q, num_frames=8, **kw).text, vr.answer(b, "Is it red?", num_frames=4,
                                                                  **kw).text]
    both = vr.answer_batch([a, b], [Q, "Is it red?"], options=[{"num_frames": 8},
                                                               {"num_frames": 4}], **kw)
    assert [x.text for x in both] == alone


def test_cost_model_prices_each_layer_kind(vr):
    """The cost shape names each layer's kind; a Gated DeltaNet layer's prefill cost grows
    linearly with the tokens while an attention layer's grows faster; --ttft-budget runs."""
    import dataclasses
    from vr_runtime.planning.cost_model import DEVICES, _Stage, _decoder_layers
    s = Qwen35Backbone.cost_shape(vr.lm.model.config.to_dict())
    assert s.layer_kinds == ("linear_attention",) * 3 + ("full_attention",)
    assert (s.lin_k_heads, s.lin_v_heads, s.lin_dk, s.lin_dv) == (2, 4, 32, 32)
    big = dataclasses.replace(s, d=2048, heads=16, kv_heads=2, head_dim=256, ff=6144,
                              lin_k_heads=16, lin_v_heads=32, lin_dk=128, lin_dv=128)

    def flops(kind, tokens):
        st = _Stage(DEVICES["h100"])
        _decoder_layers(st, dataclasses.replace(big, layer_kinds=(kind,)), tokens, 1, 1)
        return st.flops
    lin = flops("linear_attention", 32768) / flops("linear_attention", 8192)
    full = flops("full_attention", 32768) / flops("full_attention", 8192)
    assert 3.9 < lin < 4.1 < full
    r = vr.answer(_clip(), Q, num_frames=8, max_new_tokens=1, policy="global",
                  ttft_budget_s=30.0).report
    assert r["ttft_predicted_s"] > 0 and r["visual_tokens"] <= r["budget"]


def test_moe_window1_equals_hf_and_routes():
    """Qwen3.5 MoE (tiny-qwen3.5-moe): HF's forward at window 1, the shadow stack over hybrid
    MoE layers, and a policy at scales 1,1,1 equal to dense."""
    from vr_runtime.backbones.qwen3_vl import Qwen35MoeBackbone
    from vr_runtime.routing.routers import RouterConfig, Routers
    from vr_runtime.runtime import VideoRouter
    b = Qwen35MoeBackbone.tiny()
    assert type(b.decoder().layers[0].mlp).__name__.endswith("SparseMoeBlock")
    frames = _frames(4, seed=23)
    ref = _processor_inputs(b, frames, indices=INDICES[:4])
    ids, E, pos, _ = _ours(b, frames, [1, 1], indices=INDICES[:4])
    assert torch.equal(ids, ref["input_ids"][0])
    r = Routers.from_backbone(b, RouterConfig(router_dim=32, num_heads=4))
    x = torch.randn(1, 24, b.hidden_size, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(b.forward(inputs_embeds=E, position_ids=pos).logits[0, -1],
                                   b.model(**ref).logits[0, -1], rtol=1e-4, atol=1e-4)
        hs = b.decoder()(inputs_embeds=x, output_hidden_states=True).hidden_states[4]
        torch.testing.assert_close(b.decoder().norm(r.shadow(x)), hs, rtol=1e-5, atol=1e-5)
    vr = VideoRouter(b, warmup_frames=0)
    c = _clip(4)
    kw = dict(num_frames=4, max_new_tokens=3, global_window=1, relevant_window=1, other_window=1)
    assert vr.answer(c, Q, policy="global", budget=2 * 196, **kw).text == \
        vr.answer(c, Q, policy="dense", **kw).text
    assert Qwen35MoeBackbone.cost_shape(b.model.config.to_dict()).ff == 2 * 64 + 64


def test_static_decoding_refused_in_one_line(bb):
    from vr_runtime.runtime import VideoRouter
    with pytest.raises(ValueError, match="decoding 'static': backbone 'qwen3_5' keeps a "
                                         "recurrent state") as e:
        VideoRouter(bb, warmup_frames=0, decoding="static")
    assert "\n" not in str(e.value)


def test_prefix_cache_keeps_the_recurrent_state(bb, vr):
    """VideoRouter(prefix_cache=True): the visual prefix's cache (Gated DeltaNet states
    included) serves a second question with the answers a plain runtime gives."""
    from vr_runtime.runtime import VideoRouter
    c = _clip()
    kw = dict(num_frames=8, max_new_tokens=4, policy="global", cache_visual=True)
    want = [vr.answer(c, q, **kw).text for q in (Q, "Is it red?")]
    pc = VideoRouter(bb, warmup_frames=0, prefix_cache=True)
    got = [pc.answer(c, q, **kw) for q in (Q, "Is it red?")]
    assert [a.text for a in got] == want and got[1].report["prefix_cache"]["status"] == "hit"
