"""The tiny model's curriculum, beside the paper's trainer (``vr_runtime.training``).

The ``tiny`` preset starts from a random fill and learns on the synthetic evidence task
(``vr_runtime.data.synthetic_videos``) what a pretrained VLM brings to the paper's Stages 1-3:
Stage 0 teaches it to see (``pretrain.py``); its Stage 3 lays examples out in ways the paper
does not (``layouts.py``) and supervises attention (``route.py``), through the trainer's two
seams (``curriculum.py``); the recipes chain the stages into the shipped weights
(``recipe.py``); the labeller, the label study, the routing evaluation and the curves measure
them. Its configs are in ``vr_tiny/configs``; its command is ``python -m vr_tiny``.

Importing this package registers the curriculum and its config section, ``"tiny"``, with the
trainer. ``vr_tiny`` imports ``vr_runtime``; ``vr_runtime`` never imports it.
"""
from __future__ import annotations

from vr_runtime.training.curriculum import Extension, register

from .config_files import CONFIGS
from .options import TinyOptions


def _curriculum(cfg, options):
    from .curriculum import TinyCurriculum   # torch and the planners load with a stage
    return TinyCurriculum(cfg, options)


TINY = register(Extension("tiny", TinyOptions, _curriculum, configs=str(CONFIGS)))


def tiny_options(cfg) -> TinyOptions:
    """The ``tiny`` section of a stage config (its defaults when the config has none)."""
    return cfg.extensions.get("tiny") or TinyOptions()


def set_option(cfg, key: str, value) -> None:
    """Set ``key`` of a stage config: a ``TrainConfig`` field, or an option of its ``tiny``
    section (the section is added when the config has none)."""
    if hasattr(cfg, key):
        setattr(cfg, key, value)
        return
    setattr(cfg.extensions.setdefault("tiny", TinyOptions()), key, value)


__all__ = ["TINY", "CONFIGS", "TinyOptions", "tiny_options", "set_option"]
