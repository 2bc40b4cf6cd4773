"""Each stage, a few real steps on the tiny model: exactly the intended parameters change."""
import os

import pytest
import torch

from stage_helpers import stage_config
from vr_runtime.routing.routers import RouterConfig, Routers
from vr_runtime.training.loop import train

GROUP_OF = (("model.vision_tower.", "vision"), ("model.multi_modal_projector.", "projector"),
            ("model.language_model.", "language"), ("lm_head.", "language"),
            ("shadow.", "extractor"), ("semantic.", "semantic"), ("image.", "image"))


def group(name):
    for prefix, g in GROUP_OF:
        if name.startswith(prefix):
            return g
    raise AssertionError(f"{name} in no group")


def snapshot(lm, routers):
    s = {k: v.detach().clone() for k, v in lm.model.state_dict().items()}
    s.update({k: v.detach().clone() for k, v in routers.state_dict().items()})
    return s


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_stage_trains_exactly_its_groups(stage, tiny_data, tiny_lm, tmp_path):
    r0 = Routers.from_backbone(tiny_lm, RouterConfig(router_dim=32, num_heads=4, router_pool=2), seed=3)
    r0.save(tmp_path / "r0.safetensors")
    before = snapshot(tiny_lm, r0)
    cfg = stage_config(stage, tiny_data, tmp_path / "out", routers=str(tmp_path / "r0.safetensors"),
                       plan_from="labels" if stage == 3 else "routers")
    res = train(cfg, lm=tiny_lm, progress=False, evaluate=False)
    assert res["global_step"] == 2 and len(res["history"]) == 2
    after = snapshot(tiny_lm, res["trainee"].routers)
    trainable = set(cfg.trainable_groups)
    changed = {g: [] for g in ("vision", "projector", "language", "extractor", "semantic", "image")}
    for k, v in before.items():
        changed[group(k)].append(not torch.equal(v, after[k]))
    for g, flags in changed.items():
        if g in trainable:
            # every tensor of a trained group moves (Adam steps every entry with a gradient)
            assert all(flags), (g, sum(flags), len(flags))
        else:
            assert not any(flags), f"frozen group {g} changed"
    # the saved routers are what VideoRouter.from_pretrained(routers=...) loads
    loaded = Routers.load(os.path.join(cfg.output_dir, "routers.safetensors"), tiny_lm)
    assert loaded.trained
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, after[k])
    if stage == 3:  # the LLM in Hugging Face format
        from transformers import InternVLForConditionalGeneration
        hf = InternVLForConditionalGeneration.from_pretrained(os.path.join(cfg.output_dir, "hf"))
        sd = hf.state_dict()
        w = "model.language_model.layers.0.mlp.up_proj.weight"
        assert torch.equal(sd[w], after[w])
        assert os.path.isfile(os.path.join(cfg.output_dir, "model.safetensors"))


def test_resume_continues_exactly(tiny_data, tiny_lm, tmp_path):
    import copy
    lm2 = copy.deepcopy(tiny_lm)
    full = stage_config(2, tiny_data, tmp_path / "full", max_steps=4, save_steps=2,
                        lr_scheduler_type="cosine", warmup_ratio=0.3)
    ref = train(full, lm=tiny_lm, progress=False, evaluate=False)["trainee"].routers
    assert os.path.isdir(tmp_path / "full" / "checkpoint-2")
    part = stage_config(2, tiny_data, tmp_path / "full", max_steps=4, save_steps=2,
                        lr_scheduler_type="cosine", warmup_ratio=0.3)
    res = train(part, lm=lm2, progress=False, evaluate=False,
                resume=str(tmp_path / "full" / "checkpoint-2"))
    assert res["global_step"] == 4
    assert [h["step"] for h in res["history"]] == [1, 2, 3, 4]
    for (k, a), b in zip(ref.state_dict().items(), res["trainee"].routers.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7, msg=k)
