"""The three stages run unchanged on the Qwen2.5-VL backbone (tiny-qwen2.5-vl): a few steps
each, and exactly the stage's parameter groups move."""
import pytest
import torch

from stage_helpers import stage_config
from vr_runtime.routing.routers import RouterConfig, Routers
from vr_runtime.training.loop import train
from vr_runtime.training.stages import param_groups


@pytest.fixture(scope="module")
def qwen_bb():
    from vr_runtime.backbones import load_backbone
    return load_backbone("tiny-qwen2.5-vl", dtype=torch.float32)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_qwen_stage_trains_exactly_its_groups(stage, tiny_data, qwen_bb, tmp_path):
    r0 = Routers.from_backbone(qwen_bb, RouterConfig(router_dim=32, num_heads=4, router_pool=2),
                               seed=3)
    r0.save(tmp_path / "r0.safetensors")
    before = {g: [p.detach().clone() for p in ps] for g, ps in param_groups(qwen_bb, r0).items()}
    cfg = stage_config(stage, tiny_data, tmp_path / "out", routers=str(tmp_path / "r0.safetensors"),
                       plan_from="labels" if stage == 3 else "routers", model="tiny-qwen2.5-vl")
    res = train(cfg, lm=qwen_bb, progress=False, evaluate=False)
    assert res["global_step"] == 2
    after = param_groups(qwen_bb, res["trainee"].routers)
    for g, ps in after.items():
        moved = [not torch.equal(a, b.detach()) for a, b in zip(before[g], ps)]
        if g in cfg.trainable_groups:
            assert any(moved), f"trained group {g} did not change"
        else:
            assert not any(moved), f"frozen group {g} changed"
    loaded = Routers.load(tmp_path / "out" / "routers.safetensors", qwen_bb)
    assert loaded.trained and loaded.positions is not None  # M-RoPE positions in the shadow stack
