"""A request after every stage before the prefill (:meth:`VideoRouter.prepare`): what the
prefill, the decode steps and the report read, typed."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch

from ..planning.policies import FittedPlan
from ..request import Request
from ..routing.policy import PolicyDecision
from ..routing.scorers import FrameScores
from ..telemetry.timing import StageTimer
from ..video.frames import Frames
from .cache import PrefixUse


@dataclass
class Packing:
    """What a batch's one ``pool_pack`` needs of a request whose frames are not pooled yet:
    Z of the frames it holds, their windows, and the first prompt row of each frame."""
    Z: torch.Tensor
    z_plan: list
    starts: list


@dataclass
class Prepared:
    """One request through the frames, policy, vision, score and plan stages; the compress
    stage fills ``ids`` to ``prefix``."""
    req: Request
    timer: StageTimer
    frames: Frames
    decision: PolicyDecision
    planner: object
    notes: List[str]
    #: the visual cache held the video before this request (``cache_visual``)
    hit: bool = False
    scores: Optional[FrameScores] = None
    fitted: Optional[FittedPlan] = None
    ids: Optional[torch.Tensor] = None
    embeds: Optional[torch.Tensor] = None
    position_ids: Optional[torch.Tensor] = None
    #: answer_batch: until the batch's one pool_pack; None after it (no Z outlives packing)
    packing: Optional[Packing] = None
    prefix: Optional[PrefixUse] = None

    @property
    def visual_cache(self) -> Optional[str]:
        """The report's ``visual_cache``: "hit" | "miss", None without ``cache_visual``."""
        return ("hit" if self.hit else "miss") if self.req.cache_visual else None


__all__ = ["Packing", "Prepared"]
