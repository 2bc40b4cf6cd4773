"""Stage 3: gradients flow through the fused pooling into the projector and the LLM, and the
kernel backends (vectorised torch, Triton under the interpreter) give the reference gradient."""

import torch

import vr_tiny  # noqa: F401  (the tiny model's configs: vr_tiny/configs)
from vr_runtime.routing.routers import RouterConfig, Routers
from vr_runtime.training.config import load_config
from vr_runtime.training.stages import Trainee, apply_freezing


def _reference_pack(Z, plan, grid, out, dest):
    """Plain reference: per-frame avg_pool2d, rows assigned into a copy of the embeddings."""
    from vr_kernels.reference import pool_pack_reference
    return pool_pack_reference(Z, list(plan), grid, out=out, dest=dest)


def _kernel_pack(backend):
    import vr_kernels
    return lambda Z, plan, grid, out, dest: vr_kernels.pool_pack(
        Z, list(plan), grid, out=out, dest=dest, backend=backend)


def _batch(lm, T=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    tok = lm.tokenizer
    out = []
    for q, a, pol, rel in (("What shape is the red object?", "circle", 1, [0, 1, 1, 0]),
                           ("What is the background color?", "black", 0, [0] * T)):
        out.append({"v": torch.randn(T, 256, 256, generator=g),
                    "q_ids": torch.tensor(tok(q, add_special_tokens=False)["input_ids"]),
                    "labels": torch.tensor(rel, dtype=torch.float32), "policy": pol,
                    "question": q, "answer": a})
    return out


def _grads(lm, pack, plan_from="labels"):
    torch.manual_seed(0)
    routers = Routers.from_backbone(lm, RouterConfig(router_dim=32, num_heads=4, router_pool=2), seed=1)
    cfg = load_config("tiny_stage3", routers=None, plan_from=plan_from, frames_per_example=0)
    params = apply_freezing(lm, routers, cfg.trainable_groups)
    tr = Trainee(lm, routers, cfg, pack=pack)
    for p in params:
        p.grad = None
    out = tr(_batch(lm))
    out["loss"].backward()
    names = dict(list(lm.model.named_parameters()) +
                 [("routers." + k, v) for k, v in routers.named_parameters()])
    return out, {k: (v.grad.clone() if v.grad is not None else None) for k, v in names.items()}


def test_gradients_reach_projector_and_llm_through_pool_pack(tiny_lm):
    out, g = _grads(tiny_lm, _kernel_pack("torch"))
    assert torch.isfinite(out["loss"]) and out["l_lm"] > 0 and out["l_sem"] > 0 and out["l_img"] > 0
    for k, v in g.items():
        if k.startswith("model.vision_tower."):
            assert v is None, k                      # frozen, never touched
        else:
            assert v is not None and v.abs().sum() > 0, k
    emb = g["model.language_model.embed_tokens.weight"]
    img_id = tiny_lm.image_token_id
    # every placeholder row was overwritten by pooled frames: no gradient reaches its embedding,
    # while the question / template tokens around them do receive gradient
    assert emb[img_id].abs().max() == 0
    q_ids = tiny_lm.tokenizer("What shape is the red object?", add_special_tokens=False)["input_ids"]
    assert all(emb[i].abs().sum() > 0 for i in q_ids)


def test_kernel_gradients_match_reference_in_a_training_step(tiny_lm):
    ref_out, ref = _grads(tiny_lm, _reference_pack)
    backends = ["torch"]
    import importlib
    pp = importlib.import_module("vr_kernels.pool_pack")
    if pp.CPU_TRITON:  # the tiny model runs on CPU: Triton there means the interpreter
        backends.append("triton")
    for b in backends:
        out, g = _grads(tiny_lm, _kernel_pack(b))
        torch.testing.assert_close(out["loss"], ref_out["loss"], rtol=1e-5, atol=1e-6)
        for k in ("model.multi_modal_projector.linear_2.weight",
                  "model.multi_modal_projector.layer_norm.weight",
                  "model.language_model.layers.0.self_attn.q_proj.weight",
                  "model.language_model.embed_tokens.weight", "lm_head.weight"):
            torch.testing.assert_close(g[k], ref[k], rtol=1e-4, atol=1e-6, msg=f"{b}: {k}")


def test_plan_from_routers_is_decided_without_gradient(tiny_lm):
    # Routers' own decisions pick the plan; the routing heads still learn from L_sem / L_img.
    out, g = _grads(tiny_lm, _kernel_pack("torch"), plan_from="routers")
    assert g["routers.image.cls"] is not None and g["routers.semantic.fc2.weight"] is not None
    assert torch.isfinite(out["loss"])
