"""Stage 1 on the Qwen3-VL backbone (tiny-qwen3-vl): the Image Router learns per-unit labels
(a temporal patch is relevant if either of its frames is) from the units' wide Z (DeepStack
streams through the shadow stack), the loss falls, and the routers save and reload on it."""
import pytest
import torch

from stage_helpers import stage_config
from vr_runtime.routing.routers import RouterConfig, Routers
from vr_runtime.training.loop import train
from vr_runtime.training.stages import param_groups


@pytest.fixture(scope="module")
def qwen3_bb():
    from vr_runtime.backbones import load_backbone
    return load_backbone("tiny-qwen3-vl", dtype=torch.float32)


@torch.no_grad()
def _set_loss(bb, routers, data):
    """Mean BCE of the Image Router over every unit of the Stage 1 file."""
    import torch.nn.functional as F
    from vr_runtime.routing.routers import embed_question
    from vr_runtime.training.data import read_jsonl
    from vr_runtime.training.features import FeatureCache
    cache = FeatureCache(bb, 12)
    losses = []
    for ex in read_jsonl(data["relevance"], "relevance"):
        Z = bb.project(cache.get(ex.video, ex.frames))
        y = torch.tensor(cache.labels(ex.frame_labels), dtype=torch.float32)
        assert Z.shape[0] == y.numel() == 6   # 12 frames, 6 temporal patches
        logits = routers.frame_logits(Z, embed_question(bb.model, bb.tokenizer,
                                                        ex.routed_question), grid=bb.grid)
        losses.append(F.binary_cross_entropy_with_logits(logits.float(), y))
    return float(torch.stack(losses).mean())


def test_qwen3_stage1_loss_falls_and_routers_reload(tiny_data, qwen3_bb, tmp_path):
    r0 = Routers.from_backbone(qwen3_bb, RouterConfig(router_dim=32, num_heads=4, router_pool=2),
                               seed=3)
    r0.save(tmp_path / "r0.safetensors")
    before = {g: [p.detach().clone() for p in ps] for g, ps in param_groups(qwen3_bb, r0).items()}
    cfg = stage_config(1, tiny_data, tmp_path / "out", routers=str(tmp_path / "r0.safetensors"),
                       model="tiny-qwen3-vl", max_steps=16, frames_per_example=0,
                       learning_rate=5e-3)
    res = train(cfg, lm=qwen3_bb, progress=False, evaluate=False)
    assert res["global_step"] == 16 and len(res["history"]) == 16
    # L_img over every unit of the training set, before and after
    first, last = _set_loss(qwen3_bb, r0, tiny_data), _set_loss(qwen3_bb, res["trainee"].routers,
                                                               tiny_data)
    assert last < 0.85 * first, (first, last)
    after = param_groups(qwen3_bb, res["trainee"].routers)
    for g, ps in after.items():
        moved = [not torch.equal(a, b.detach()) for a, b in zip(before[g], ps)]
        assert any(moved) if g in cfg.trainable_groups else not any(moved), g
    loaded = Routers.load(tmp_path / "out" / "routers.safetensors", qwen3_bb)
    assert loaded.trained and loaded.backbone == "qwen3_vl" and loaded.positions is not None
    trained = res["trainee"].routers
    state = {k: v for k, v in trained.state_dict().items()}
    assert all(torch.equal(state[k], v) for k, v in loaded.state_dict().items())


@pytest.mark.parametrize("stage", [2, 3])
def test_qwen3_stages_2_and_3_train_their_groups(stage, tiny_data, qwen3_bb, tmp_path):
    """Stage 2 (the Semantic Router) and Stage 3 (the joint fine-tune: the plan's pooled units,
    DeepStack streams included, in the LLM's input) run a few steps on Qwen3-VL and move
    exactly their parameter groups."""
    r0 = Routers.from_backbone(qwen3_bb, RouterConfig(router_dim=32, num_heads=4, router_pool=2),
                               seed=3)
    r0.save(tmp_path / "r0.safetensors")
    before = {g: [p.detach().clone() for p in ps] for g, ps in param_groups(qwen3_bb, r0).items()}
    cfg = stage_config(stage, tiny_data, tmp_path / "out", routers=str(tmp_path / "r0.safetensors"),
                       plan_from="labels" if stage == 3 else "routers", model="tiny-qwen3-vl")
    res = train(cfg, lm=qwen3_bb, progress=False, evaluate=False)
    assert res["global_step"] == 2
    assert all(h["loss"] is not None for h in res["history"])
    after = param_groups(qwen3_bb, res["trainee"].routers)
    for g, ps in after.items():
        moved = [not torch.equal(a, b.detach()) for a, b in zip(before[g], ps)]
        assert any(moved) if g in cfg.trainable_groups else not any(moved), g
    # Stage 3 moved the backbone: put it back for the other tests of this module
    if stage == 3:
        with torch.no_grad():
            for g, ps in after.items():
                for a, b in zip(before[g], ps):
                    b.copy_(a)


def test_training_prompts_carry_the_clips_timestamps(tiny_data, qwen3_bb, tmp_path):
    """The feature cache keeps each unit's time (the processor's mean of its two frames' true
    times), in memory and in the cached file, and the training sequence writes them as
    inference does."""
    from vr_runtime.backbones.qwen3_vl import timestamp, unit_times
    from vr_runtime.training.data import read_jsonl
    from vr_runtime.training.features import FeatureCache
    from vr_runtime.training.stages import answer_sequence
    from vr_runtime.video.load import load_video
    ex = read_jsonl(tiny_data["relevance"], "relevance")[0]
    cache = FeatureCache(qwen3_bb, 12, str(tmp_path / "cache"))
    times = cache.times(ex.video, ex.frames)
    want = unit_times(load_video(ex.video, num_frames=12).timestamps_s, 2)
    assert times == want and len(times) == 6
    again = FeatureCache(qwen3_bb, 12, str(tmp_path / "cache"))   # read back from the file
    assert again.times(ex.video, ex.frames) == want and not again.mem.get((ex.video, 12)) is None
    ids, _, _, _ = answer_sequence(qwen3_bb, "What is red?", "circle", [2] * 6, times)
    text = qwen3_bb.tokenizer.decode(ids)
    assert all(timestamp(t) in text for t in times)
