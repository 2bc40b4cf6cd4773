"""The tiny curriculum's options: the ``"tiny"`` section of a stage config.

Each is a departure from the paper made for the tiny model, off by default; a config without a
``tiny`` section trains the paper's Stage 3 (``vr_runtime.training.curriculum``). The trainer's
config loader checks them with the paper's keys (types, then :meth:`TinyOptions.validate`) and
names a key in its place, ``tiny.caption_turn_prob``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Union

from vr_runtime.training.config import ConfigError


@dataclass
class TinyOptions:
    random_plan_prob: float = 0.0       # probability that a Stage 3 example's plan is random
                                        # (one window from random_plan_windows for every
                                        # frame, or one per frame) instead of the routers' /
                                        # labels', so the answer cannot be read off the plan's
                                        # layout (the tiny model learned "uniform plan -> none")
    random_plan_windows: List[int] = field(default_factory=lambda: [1, 2, 4])
    dense_plan_prob: float = 0.0        # probability that an example's plan is dense (every
                                        # frame at s_1, or as many as model_max_length holds
                                        # spread in time; layouts.py)
    dense_plan_frames: Union[int, List[int]] = 0
                                        # at most this many dense frames, spread in time (0: as
                                        # many as model_max_length holds); [lo, hi]: the cap
                                        # drawn uniformly for each example
    dense_plan_keep_relevant: bool = False
                                        # the dense plan keeps the labelled relevant frames
                                        # (the rest spread in time), so a capped dense example
                                        # still shows its answer (layouts.keep_evidence)
    dense_plan_dialogue: bool = False   # a dense example also asks every other question about
                                        # the same frames, as follow-up turns (answers trained;
                                        # layouts.dialogue_turns)
    caption_turn_prob: float = 0.0      # a dense dialogue -> caption (layouts.caption_turn)
    color_first_answers: bool = False   # a shape answer says its color first, "red circle"
                                        # (layouts.color_first)
    route_weight: float = 0.0           # weight of the route loss (route.py: head route_head
                                        # of decoder layer route_layer looks from each answer
                                        # row at the question's color word); 0: off
    route_layer: int = 1
    route_head: int = 0
    frame_weight: float = 0.0           # route.FrameSupervision's weight; 0: off
    frame_layer: int = 0                # its layer, head and rows drawn per sequence
    frame_head: int = 3
    frame_rows: int = 64
    evidence_weight: float = 0.0        # weight of the evidence loss (route.py: head
                                        # evidence_head of decoder layer evidence_layer looks
                                        # from each answer row at the frames its question is
                                        # about); 0: off
    evidence_layer: int = 2
    evidence_head: int = 0
    exclusion_weight: float = 0.0       # weight of the exclusion loss (route.py: every head of
                                        # exclusion_layers keeps the answer row off the frames
                                        # its question is not about); 0: off
    exclusion_layers: List[int] = field(default_factory=lambda: [2, 3])
    freeze_embeddings: bool = False     # with the language model trained, keep its input
                                        # embeddings frozen; with the projector frozen as well,
                                        # the routers read exactly the inputs they did
    long_plan_prob: float = 0.0         # probability that an example is stretched to a long
                                        # sampled count and planned as inference plans long
                                        # videos (layouts.py)
    long_plan_frames: List[int] = field(default_factory=lambda: [128, 2048])
                                        # [lo, hi]: the stretched count, drawn uniformly
    long_plan_budget: List[int] = field(default_factory=lambda: [1024, 6144])
                                        # [lo, hi]: the long plan's visual budget, drawn uniformly
    long_plan_planners: List[str] = field(default_factory=lambda: ["fragment"])
                                        # Fragment planners drawn uniformly for long plans (a
                                        # Global example gets each one's Global twin)

    def validate(self) -> "TinyOptions":
        """Ranges and relations (the types are checked by the config loader first);
        ``ConfigError`` naming the first bad key."""
        for k in ("random_plan_prob", "dense_plan_prob", "long_plan_prob", "caption_turn_prob"):
            if not 0.0 <= getattr(self, k) <= 1.0:
                raise ConfigError(f"{k}: expected in [0, 1], got {getattr(self, k)!r}")
        if self.dense_plan_prob + self.long_plan_prob > 1.0:
            raise ConfigError(f"dense_plan_prob + long_plan_prob: expected <= 1, got "
                              f"{self.dense_plan_prob} + {self.long_plan_prob}")
        if not self.random_plan_windows or min(self.random_plan_windows) < 1:
            raise ConfigError(f"random_plan_windows: expected a non-empty list of ints >= 1, "
                              f"got {self.random_plan_windows!r}")
        _check_dense(self)
        _check_long(self)
        _check_supervision(self)
        return self


def _check_dense(o: TinyOptions) -> None:
    d = o.dense_plan_frames
    pair = isinstance(d, list) and len(d) == 2 and 1 <= d[0] <= d[1]
    if not pair and (not isinstance(d, int) or d < 0):
        raise ConfigError(f"dense_plan_frames: expected an int >= 0 or [lo, hi] with "
                          f"1 <= lo <= hi, got {d!r}")
    if o.caption_turn_prob and not o.dense_plan_dialogue:
        raise ConfigError("caption_turn_prob: a caption replaces a dense dialogue; set "
                          "dense_plan_dialogue to true as well (or caption_turn_prob to 0)")


def _check_long(o: TinyOptions) -> None:
    """The long layout's counts, budgets and planners (each a Fragment planner with a Global
    twin, ``layouts.global_twin``)."""
    for k in ("long_plan_frames", "long_plan_budget"):
        v = getattr(o, k)
        if len(v) != 2 or not 1 <= v[0] <= v[1]:
            raise ConfigError(f"{k}: expected [lo, hi] with 1 <= lo <= hi, got {v!r}")
    from vr_runtime.planning.policies import PLANNERS
    from .layouts import global_twin

    def usable(n):
        return n in PLANNERS and PLANNERS[n].needs_relevance and global_twin(n) in PLANNERS
    if not o.long_plan_planners or not all(map(usable, o.long_plan_planners)):
        ok = [n for n in PLANNERS if usable(n)]
        raise ConfigError(f"long_plan_planners: expected a non-empty list of Fragment "
                          f"planners ({', '.join(ok)}), got {o.long_plan_planners!r}")


def _check_supervision(o: TinyOptions) -> None:
    """The attention supervisions' weights, layers and heads (``route.supervisions`` checks
    the layers and heads against the model)."""
    if o.route_weight < 0 or o.route_layer < 0 or o.route_head < 0:
        raise ConfigError(f"route_weight, route_layer, route_head: expected >= 0, got "
                          f"{o.route_weight}, {o.route_layer}, {o.route_head}")
    if o.evidence_weight < 0 or o.evidence_layer < 0 or o.evidence_head < 0:
        raise ConfigError(f"evidence_weight, evidence_layer, evidence_head: expected >= 0, "
                          f"got {o.evidence_weight}, {o.evidence_layer}, {o.evidence_head}")
    fr = (o.frame_weight, o.frame_layer, o.frame_head, o.frame_rows - 1)
    if min(fr) < 0:
        raise ConfigError(f"frame_weight, frame_layer, frame_head, frame_rows: expected >= 0 "
                          f"(rows >= 1), got {fr[:3] + (o.frame_rows,)}")
    if o.exclusion_weight < 0 or any(i < 0 for i in o.exclusion_layers) or \
            (o.exclusion_weight and not o.exclusion_layers):
        raise ConfigError(f"exclusion_weight, exclusion_layers: expected >= 0 (and a layer "
                          f"when the weight is set), got "
                          f"{o.exclusion_weight}, {o.exclusion_layers}")


__all__ = ["TinyOptions"]
