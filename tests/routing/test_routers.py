"""Routers: the shadow stack is the first k decoder layers, batching/padding do not change the
outputs, and save/load is an exact round trip with clear errors on mismatch."""
import json

import pytest
import torch

from vr_runtime.errors import RouterWeightsError
from vr_runtime.backbones import backbone_from_config
from vr_runtime.routing.routers import FORMAT, RouterConfig, Routers, embed_question


@pytest.fixture(scope="module")
def routers(tiny_lm):
    r = Routers.from_backbone(tiny_lm, RouterConfig(num_layers=2), seed=1)
    # Random non-zero head weights so the round trip compares real values.
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in list(r.semantic.parameters()) + list(r.image.parameters()):
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return r


@pytest.mark.parametrize("k", [1, 3])
def test_shadow_stack_is_first_k_layers(tiny_lm, k):
    r = Routers.from_backbone(tiny_lm, RouterConfig(num_layers=k))
    x = torch.randn(2, 23, tiny_lm.hidden_size, generator=torch.Generator().manual_seed(k))
    with torch.no_grad():
        ref = tiny_lm.decoder()(inputs_embeds=x, output_hidden_states=True).hidden_states[k]
        got = r.shadow(x)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    # A separate copy: training the shadow stack must not touch the backbone.
    src = tiny_lm.decoder().layers[0].mlp.up_proj.weight
    assert r.shadow.decoder.layers[0].mlp.up_proj.weight.data_ptr() != src.data_ptr()
    assert r.shadow.decoder.embed_tokens is None


def test_shadow_stack_too_deep(tiny_lm):
    n = tiny_lm.model.config.text_config.num_hidden_layers
    with pytest.raises(ValueError, match="num_layers"):
        Routers.from_backbone(tiny_lm, RouterConfig(num_layers=n + 1))


def test_policy_logits_padding_invariant(tiny_lm, routers):
    qs = ["Which color is the circle?", "How many red squares appear in the whole video?"]
    embs = [embed_question(tiny_lm.model, tiny_lm.tokenizer, q) for q in qs]
    L = max(e.shape[0] for e in embs)
    batch = torch.zeros(2, L, tiny_lm.hidden_size)
    mask = torch.zeros(2, L, dtype=torch.long)
    for i, e in enumerate(embs):
        batch[i, :e.shape[0]] = e
        mask[i, :e.shape[0]] = 1
    with torch.no_grad():
        both = routers.policy_logits(batch, mask)
        single = torch.cat([routers.policy_logits(e[None]) for e in embs])
    assert both.shape == (2, 2)
    torch.testing.assert_close(both, single, rtol=1e-4, atol=1e-5)
    assert (single[0] - single[1]).abs().max() > 1e-4  # depends on the question


def test_frame_logits_batching_and_dependence(tiny_lm, routers):
    g = torch.Generator().manual_seed(3)
    Z = torch.randn(5, 256, tiny_lm.hidden_size, generator=g) * 0.05
    q = embed_question(tiny_lm.model, tiny_lm.tokenizer, "Does a blue star appear?")
    with torch.no_grad():
        full = routers.frame_logits(Z, q)
        one = routers.frame_logits(Z, q, frame_batch=1)
        two = routers.frame_logits(Z, q, frame_batch=2)
        # The same frame with the question's last token changed scores differently.
        q2 = embed_question(tiny_lm.model, tiny_lm.tokenizer, "Does a blue star appear first?")
        other_q = routers.frame_logits(Z, q2)
        manual = routers.image(routers.shadow(torch.cat([Z[2:3], q[None]], 1)))
    assert full.shape == (5,)
    torch.testing.assert_close(one, full, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(two, full, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(manual, full[2:3], rtol=1e-4, atol=1e-5)
    assert full.std() > 1e-4 and (other_q - full).abs().max() > 1e-5
    probs = routers.frame_probs(Z, q)
    assert ((probs > 0) & (probs < 1)).all()
    with pytest.raises(ValueError, match="frame_batch"):
        routers.frame_logits(Z, q, frame_batch=0)


def test_save_load_round_trip(tiny_lm, routers, tmp_path):
    path = tmp_path / "r.safetensors"
    routers.trained = True
    routers.save(path)
    back = Routers.load(path, tiny_lm)
    assert back.trained is True and back.config == routers.config
    a, b = routers.state_dict(), back.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    q = embed_question(tiny_lm.model, tiny_lm.tokenizer, "Which frame shows a green ring?")
    Z = torch.randn(3, 256, tiny_lm.hidden_size, generator=torch.Generator().manual_seed(9)) * 0.05
    with torch.no_grad():
        torch.testing.assert_close(back.frame_logits(Z, q), routers.frame_logits(Z, q))
        torch.testing.assert_close(back.policy_logits(q[None]), routers.policy_logits(q[None]))
    # The file is plain safetensors with the config in its metadata (no pickle anywhere).
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    assert meta["format"] == FORMAT and json.loads(meta["router_config"])["num_layers"] == 2
    routers.trained = False


def test_load_mismatch_errors(tiny_lm, routers, tmp_path, small_config):
    path = tmp_path / "r.safetensors"
    routers.save(path)
    other = backbone_from_config(small_config(hidden=96))
    with pytest.raises(RouterWeightsError, match="hidden size 128"):
        Routers.load(path, other)
    # A key removed from an otherwise valid file is named in the error.
    from safetensors.torch import load_file, save_file
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    state = load_file(str(path))
    state.pop("image.cls")
    save_file(state, str(tmp_path / "cut.safetensors"), metadata=meta)
    with pytest.raises(RouterWeightsError, match="image.cls"):
        Routers.load(tmp_path / "cut.safetensors", tiny_lm)
    # Wrong shape in one tensor.
    state = load_file(str(path))
    state["semantic.fc2.bias"] = torch.zeros(3)
    save_file(state, str(tmp_path / "shape.safetensors"), metadata=meta)
    with pytest.raises(RouterWeightsError, match="semantic.fc2.bias"):
        Routers.load(tmp_path / "shape.safetensors", tiny_lm)
    # No metadata / not safetensors / missing.
    save_file(load_file(str(path)), str(tmp_path / "nometa.safetensors"))
    with pytest.raises(RouterWeightsError, match="router config"):
        Routers.load(tmp_path / "nometa.safetensors", tiny_lm)
    (tmp_path / "junk.safetensors").write_bytes(b"\x80\x04not a safetensors file")
    with pytest.raises(RouterWeightsError, match="readable"):
        Routers.load(tmp_path / "junk.safetensors", tiny_lm)
    with pytest.raises(RouterWeightsError, match="no such file"):
        Routers.load(tmp_path / "missing.safetensors", tiny_lm)


def test_router_config_validation():
    with pytest.raises(ValueError, match="router_dim"):
        RouterConfig(router_dim=100, num_heads=8).resolved(128)
    with pytest.raises(ValueError, match="threshold"):
        RouterConfig(threshold=1.5).resolved(128)
    c = RouterConfig().resolved(3584)
    assert c.router_dim == 1024 and c.hidden_size == 3584 and c.num_layers == 4


def test_router_pool_is_pooled_input(tiny_lm, routers):
    """router_pool=2 == the paper's router run on 2x2-mean-pooled frames (64 tokens each)."""
    from vr_kernels.reference import pool_pack_reference
    Z = torch.randn(3, 256, tiny_lm.hidden_size, generator=torch.Generator().manual_seed(4)) * 0.05
    q = embed_question(tiny_lm.model, tiny_lm.tokenizer, "Which frame shows a pink heart?")
    with torch.no_grad():
        pooled = routers.frame_logits(Z, q, router_pool=2)
        ref = routers.frame_logits(pool_pack_reference(Z, [2] * 3).view(3, 64, -1), q, router_pool=1)
        full = routers.frame_logits(Z, q)
    torch.testing.assert_close(pooled, ref, rtol=1e-4, atol=1e-5)
    assert (pooled - full).abs().max() > 1e-6
    with pytest.raises(ValueError, match="router_pool"):
        routers.frame_logits(Z, q, router_pool=0)
    assert RouterConfig(router_pool=2).resolved(128).router_pool == 2


@pytest.mark.parametrize("pool", [1, 2])
def test_visual_cache_matches_uncached(tiny_lm, routers, pool):
    """Reusing the shadow-stack KV over Z_t across questions == the full [Z_t; q] pass."""
    Z = torch.randn(5, 256, tiny_lm.hidden_size, generator=torch.Generator().manual_seed(21)) * 0.05
    with torch.no_grad():
        cache = routers.visual_cache(Z, frame_batch=2, router_pool=pool)
        for text in ("Does a red ball appear?", "How many frames show a yellow diamond on the left?"):
            q = embed_question(tiny_lm.model, tiny_lm.tokenizer, text)
            torch.testing.assert_close(routers.frame_logits_cached(cache, q),
                                       routers.frame_logits(Z, q, router_pool=pool),
                                       rtol=1e-4, atol=1e-5)


def test_shadow_stack_with_real_pad_id(tiny_lm):
    """InternVL3 configs carry pad_token_id=151643: the shadow stack must not use it."""
    import copy
    from vr_runtime.routing.routers import ShadowStack
    cfg = copy.deepcopy(tiny_lm.model.config.text_config)
    cfg.pad_token_id = 151643
    src = tiny_lm.decoder()
    shadow = ShadowStack(cfg, 2, source=src)
    x = torch.randn(1, 9, tiny_lm.hidden_size)
    with torch.no_grad():
        ref = src(inputs_embeds=x, output_hidden_states=True).hidden_states[2]
        torch.testing.assert_close(shadow(x), ref, rtol=1e-5, atol=1e-5)
