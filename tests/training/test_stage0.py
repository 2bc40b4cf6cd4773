"""Stage 0 (tiny-only pretraining): captions, token alignment, and a short run end to end."""
import random

import pytest
import torch

from vr_runtime.training import pretrain as s0
from vr_runtime.training.synthetic import COLORS, SHAPES


def test_caption_names_every_color_once_with_its_shape():
    cfg = s0.PretrainConfig(two_shape_prob=0.5)
    rng = random.Random(0)
    for _ in range(200):
        spec = s0.random_frame_spec(rng, cfg)
        pairs = s0.caption(spec, rng)
        assert sorted(c for c, _ in pairs) == sorted(COLORS)
        shape_of = {s.color: s.shape for s in spec.shapes}
        assert len(shape_of) == len(spec.shapes) <= 2          # two shapes: two colors
        for c, a in pairs:
            assert a == shape_of.get(c, "no") and (a == "no" or a in SHAPES)


def test_two_shapes_do_not_overlap():
    cfg = s0.PretrainConfig(two_shape_prob=1.0, empty_prob=0.0)
    rng = random.Random(1)
    for _ in range(100):
        spec = s0.random_frame_spec(rng, cfg)
        a, b = spec.shapes
        assert abs(a.cx - b.cx) > a.r + b.r  # side by side, disjoint bounding boxes


def test_targets_follow_each_color_word():
    from vr_runtime.tiny import load_tiny_tokenizer
    toks = s0.CaptionTokens(load_tiny_tokenizer())
    pairs = [("red", "circle"), ("blue", "no")]
    ids, tgt = toks.encode(pairs)
    assert ids == [toks.ids["red"], toks.ids["circle"], toks.ids["blue"], toks.ids["no"]]
    # the color word's position predicts the answer; the answer's position has no loss
    assert tgt == [toks.ids["circle"], -100, toks.ids["no"], -100]


def test_config_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown fields"):
        s0.PretrainConfig.load("tiny_stage0", not_a_field=1)


def test_short_run_trains_projector_and_llm_only(tmp_path):
    from vr_runtime.backbones import load_backbone
    from vr_runtime.backbones.internvl3 import InternVL3Backbone
    from vr_runtime.tiny import init_weights_
    cfg = s0.PretrainConfig.load("tiny_stage0", frames=24, heldout_frames=6, steps=3,
                                 batch_size=4, warmup_steps=1, output_dir=str(tmp_path / "s0"))
    res = s0.pretrain(cfg, progress=False)
    assert set(res["metrics"]) == {"window_1", "window_2", "window_4"}
    for m in res["metrics"].values():
        assert 0.0 <= m["presence_accuracy"] <= 1.0 and m["queries"] == 6 * 6
    trained = load_backbone(str(tmp_path / "s0" / "hf"), dtype=torch.float32)
    fill = InternVL3Backbone.tiny(dtype=torch.float32)
    init_weights_(fill.model, 0)
    a, b = dict(trained.model.named_parameters()), dict(fill.model.named_parameters())
    vision = {n for n, _ in fill.model.named_parameters() if n.startswith("model.vision_tower")}
    assert vision, "vision tower parameters not found"
    for n in vision:                       # frozen at the deterministic fill
        assert torch.equal(a[n], b[n]), n
    moved = [n for n in a if n not in vision and not torch.equal(a[n], b[n])]
    assert any("multi_modal_projector" in n for n in moved)
    assert any("language_model" in n for n in moved)
