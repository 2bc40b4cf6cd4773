"""How many frames a backbone's LLM saw in one training prompt: the cap of the long-prompt
planners (``planning/long_prompt.py``). A prompt with more frames than this is a layout the
model never trained on.

Where the figure comes from, first found:

1. ``config.json``'s ``trained_frames`` (an int; a checkpoint fine-tuned on longer videos says
   so there);
2. the preset's own figure (:data:`PRESET_TRAINED_FRAMES`): the shipped ``tiny`` weights were
   trained on 16-frame videos (``num_frames`` 16 in every ``vr_tiny/configs/tiny_stage*.json``);
3. the family's published figure (:data:`FAMILY_TRAINED_FRAMES`): InternVL3 and InternVL3.5
   were trained on at most 64 frames a video, the paper's sampled count;
4. None: not known (the planners then use their own default, 64).
"""
from __future__ import annotations

import pathlib
from typing import Optional, Union

CONFIG_KEY = "trained_frames"
PRESET_TRAINED_FRAMES = {"tiny": 16}
FAMILY_TRAINED_FRAMES = {"internvl3": 64}


def trained_frames_from(cls, config: dict, name: str = "") -> Optional[int]:
    """The figure of a backbone class with its config dict (and preset name, if any)."""
    n = config.get(CONFIG_KEY) if isinstance(config, dict) else None
    if n is not None:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"config.json {CONFIG_KEY}: expected an int >= 1, got {n!r}")
        return n
    if name in PRESET_TRAINED_FRAMES:
        return PRESET_TRAINED_FRAMES[name]
    return FAMILY_TRAINED_FRAMES.get(getattr(cls, "family", ""))


def trained_frames(path_or_name: Union[str, pathlib.Path]) -> Optional[int]:
    """The figure of a preset or checkpoint directory, from its config.json alone."""
    from . import backbone_class_for
    cls, config = backbone_class_for(path_or_name)
    return trained_frames_from(cls, config, str(path_or_name))


def trained_frames_of(lm) -> Optional[int]:
    """The figure of a loaded backbone (its config, its preset name, its family)."""
    config = getattr(getattr(lm, "model", None), "config", None)
    d = config.to_dict() if hasattr(config, "to_dict") else {}
    return trained_frames_from(type(lm), d, str(getattr(lm, "name", "")))


__all__ = ["trained_frames", "trained_frames_of", "trained_frames_from", "CONFIG_KEY",
           "PRESET_TRAINED_FRAMES", "FAMILY_TRAINED_FRAMES"]
