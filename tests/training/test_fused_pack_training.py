"""A Stage 3 step with the fused pool_pack kernels (Triton, interpreted on CPU) computes what the
plain reference computes: the same loss and the same gradients of every trained parameter
(projector, LLM, routers, embeddings), on a plan with frames at full resolution and at 4x4."""
import pytest
import torch

from stage_helpers import projector_features, stage3_trainee


def step_grads(lm, backend, batch):
    from vr_runtime.training.stages import apply_freezing
    torch.manual_seed(0)
    tr = stage3_trainee(lm, pool_pack_backend=backend, freeze_language_model=False,
                        freeze_mlp=False)
    params = apply_freezing(lm, tr.routers, tr.cfg.trainable_groups)
    for p in params:
        p.grad = None
    loss = tr(batch)["loss"]
    loss.backward()
    names = {id(p): n for n, p in list(lm.model.named_parameters())
             + [("routers." + n, p) for n, p in tr.routers.named_parameters()]}
    return float(loss), {names[id(p)]: p.grad.clone() for p in params if p.grad is not None}


@pytest.mark.parametrize("T", [5, 9])
def test_fused_step_equals_reference(tiny_lm, T):
    g = torch.Generator().manual_seed(T)
    labels = (torch.rand(T, generator=g) > 0.6).float()
    labels[0] = 1.0
    q = "What shape is the red object?"
    batch = [dict(v=projector_features(tiny_lm.model, T, seed=T),
                  q_ids=tiny_lm.tokenizer(q, add_special_tokens=False,
                                          return_tensors="pt")["input_ids"][0],
                  labels=labels, policy=1, question=q, answer="circle", times=None)]
    l_ref, g_ref = step_grads(tiny_lm, "reference", batch)
    l_fused, g_fused = step_grads(tiny_lm, "triton", batch)
    assert l_fused == pytest.approx(l_ref, rel=1e-5)
    assert g_ref.keys() == g_fused.keys() and any("multi_modal_projector" in k for k in g_ref)
    for name, want in g_ref.items():
        err = float((g_fused[name] - want).norm() / want.norm().clamp_min(1e-12))
        assert err < 1e-4, name
