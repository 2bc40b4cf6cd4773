"""Per-method TTFT that does not depend on the order of the methods.

``videorouter eval`` answers every method on one decoded video with ``cache_visual=True``: the
first call on a video (the cache *miss*) runs the vision tower over all T frames, and the first
call that runs the Image Router builds the shadow stack's question-independent state over each
Z_t; every later call (a *hit*) reuses both, so its measured TTFT leaves them out. Measured as
is, the first method in ``--methods`` would pay the vision tower for all the others.

The paper's protocol (Appendix D, "Latency measurement") is a single-sample TTFT after video
loading including "visual encoding, optional routing, compression, and LLM prefill". So each
prediction's ``ttft_s`` is the call's measured TTFT with the cached stages' *measured* cost
added back, as the method would have paid them alone:

* vision: the miss's vision time over all T frames (measured once per model, video and frame
  count), scaled to the frames this method encodes without a cache: all T when its scorer reads
  Z (the Image Router), else the frames its plan keeps (plan-first methods: budget, uniform,
  global, dense, CLIP). Linear in frames: the tower runs frame by frame in chunks.
* routing: the time the Image Router's visual state took to build (timed here, once per model,
  video and frame count), added to every call that reused it.

``ttft_cached_s`` keeps the figure as measured (what a server answering several questions about
one video sees) and ``ttft_added_back_s`` the difference. A miss for a plan-first method encoded
all T frames for the cache, so its ``ttft_s`` is *lower* than measured (only its kept frames).
"""
from __future__ import annotations

import time
from typing import Dict, Optional, Tuple

import torch

from ..routing.scorers import CachedImageRouterScorer


def _sync(t: Optional[torch.Tensor]) -> None:
    if t is not None and t.device.type == "cuda":
        torch.cuda.synchronize(t.device)


class TimedCachedImageRouterScorer(CachedImageRouterScorer):
    """``CachedImageRouterScorer`` that times building the visual state when it builds it:
    ``built_s`` is that time on the call that built it, 0.0 on a call that reused it, None when
    the scorer did not run (the policy needed no relevance)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.built_s: Optional[float] = None

    def probs(self, inp):
        state = inp.video_state
        if state is not None:
            pool = self.image_router_pool(inp.routers)
            key = self.cache_key(inp)
            if key in state:
                self.built_s = 0.0
            else:
                _sync(inp.Z)
                t0 = time.perf_counter()
                state[key] = inp.routers.visual_cache(inp.Z, self.frame_batch, pool, inp.grid)
                _sync(inp.Z)
                self.built_s = time.perf_counter() - t0
        return super().probs(inp)


class ColdCosts:
    """The cached stages' measured cost per (model, video, frames): vision over all T frames
    (from the miss) and the Image Router state's build time."""

    def __init__(self):
        self._vision: Dict[Tuple, float] = {}
        self._router: Dict[Tuple, float] = {}

    def clear(self) -> None:
        self._vision.clear()
        self._router.clear()

    def add_back(self, key: Tuple, report: dict, scorer=None) -> Tuple[Optional[float], float]:
        """(TTFT with the cached stages added back, seconds added) for one call's report.
        ``scorer``: the FrameScorer object the call was given (None: the runtime's default)."""
        t = report.get("timings_s") or {}
        ttft = t.get("ttft")
        if ttft is None:
            return None, 0.0
        vision = float(t.get("vision") or 0.0)
        T = int(report.get("num_frames_used") or 0)
        cache = report.get("visual_cache")
        if cache not in ("hit", "miss"):        # no visual cache: measured as the paper does
            return float(ttft), 0.0
        if cache == "miss":
            self._vision[key] = vision          # the miss encoded all T frames
        full = self._vision.get(key)
        if full is None or not T:
            return float(ttft), 0.0
        # Without a cache a method encodes all T frames when its scorer reads Z, else only the
        # frames its plan keeps (runtime.encode).
        used_z = report.get("scorer") is not None and getattr(scorer, "needs_z", True)
        kept = T if used_z else sum(1 for n in report.get("frame_tokens") or [] if n)
        cold_vision = full * kept / T
        extra = cold_vision - vision
        built = getattr(scorer, "built_s", None)
        if built:                                # this call built the router state
            self._router[key] = built
        elif built == 0.0 and key in self._router:
            extra += self._router[key]           # it reused a state another method paid for
        return float(ttft) + extra, extra


__all__ = ["TimedCachedImageRouterScorer", "ColdCosts"]
