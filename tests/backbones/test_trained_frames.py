"""The frames a backbone was trained on: the long-prompt planners' cap."""
import json
from importlib import resources

import pytest

from vr_runtime.backbones import backbone_class
from vr_runtime.backbones.trained_frames import trained_frames, trained_frames_from


def test_the_tiny_presets_figure_is_its_training_length():
    cfgs = resources.files("vr_tiny") / "configs"      # the tiny model's training configs
    lengths = {json.loads((cfgs / f"tiny_stage{s}.json").read_text())["num_frames"]
               for s in ("1", "2", "3", "3b")}
    assert lengths == {trained_frames("tiny")} == {16}


def test_config_then_preset_then_family():
    cls = backbone_class("internvl")
    assert trained_frames_from(cls, {}) == 64                       # InternVL3's figure
    assert trained_frames_from(cls, {"trained_frames": 128}, "tiny") == 128
    assert trained_frames_from(backbone_class("qwen2_5_vl"), {}) is None
    with pytest.raises(ValueError, match=r"^config.json trained_frames: expected an int >= 1"):
        trained_frames_from(cls, {"trained_frames": "64"})


def test_a_loaded_backbone(tiny_lm):
    from vr_runtime.backbones.trained_frames import trained_frames_of
    assert trained_frames_of(tiny_lm) == 16
