"""Stage configs and Trainees for the tiny curriculum's tests: the training tests' helpers
(``tests/training/stage_helpers.py``, a plain module for the reason it gives), with the keys
of the ``tiny`` section set where they belong."""
import dataclasses
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                                "training"))

from stage_helpers import projector_features, stage_config  # noqa: E402,F401
from stage_helpers import stage3_trainee as paper_trainee  # noqa: E402

from vr_tiny.options import TinyOptions  # noqa: E402

TINY_KEYS = {f.name for f in dataclasses.fields(TinyOptions)}


def split(over: dict) -> dict:
    """``over`` as ``load_config`` keywords: a tiny option as ``tiny.KEY``."""
    return {(f"tiny.{k}" if k in TINY_KEYS else k): v for k, v in over.items()}


def tiny_config(name: str, **over):
    from vr_runtime.training.config import load_config
    return load_config(name, **split(over))


def stage3_trainee(lm, **over):
    """A Stage 3 Trainee on ``lm`` with small seeded routers, plans from the labels and no
    random plans; ``over``: config keys and tiny options."""
    return paper_trainee(lm, **split(over))


def flat(cfg) -> dict:
    """A stage config as one dict: its keys and every tiny option (defaults when the config
    has no ``tiny`` section), as the configs said them before the options had a section."""
    from vr_tiny import tiny_options
    d = {k: v for k, v in cfg.to_dict().items() if k != "tiny"}
    return {**d, **dataclasses.asdict(tiny_options(cfg))}
