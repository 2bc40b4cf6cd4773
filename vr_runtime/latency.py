"""Latency-budgeted routing (beyond the paper): ``answer(..., ttft_budget_s=...)`` picks the
largest visual budget whose *predicted* TTFT on this device fits the target.

The prediction is :mod:`vr_runtime.cost_model` (per-stage FLOPs and bytes on a device spec:
H100 / H200 nominal, or this CPU calibrated by ``cost_model.cpu_device``), corrected per stage
by what this process has measured: the ratio measured / predicted of each stage is kept (the
last ``window`` of them) and a prediction is scaled by their maximum. The raw model is a floor
(it under-predicts small layers dominated by per-operator host cost); the max of recent ratios
keeps the choice on the safe side of the measured time while following a machine whose speed
drifts. The first ratios come from :meth:`LatencyModel.probe`, run when the model is built: the
backbone's own vision tower on 2 frames, its decoder on one short sequence and the routers on 2
frames, timed (warm) against the model's prediction for the same shapes -- so even the first
request of a process (every ``videorouter ask``) is predicted from this machine's real speed.
After every answer its measured stages are added.

What depends on the budget: the prefill (text + visual tokens), the compress step, and under
Global the vision tower (only kept frames are encoded). Under Fragment the vision tower and the
routers see every frame whatever the budget, so a target below that fixed cost cannot be met:
the smallest plan is used and the report says so.
"""
from __future__ import annotations

import collections
from typing import Callable, Dict, Optional

import torch

from .cost_model import DEVICES, DeviceSpec, Shape, cpu_device, load_shape, stage_costs

STAGES = ("vision", "router", "compress", "prefill")


class LatencyModel:
    """Predicted TTFT stages of one backbone on one device, corrected by measurements."""

    def __init__(self, config, device: DeviceSpec, window: int = 8):
        """``config``: the backbone's cost shape, or a config.json dict (or path) to read it from."""
        self.shape = config if isinstance(config, Shape) else load_shape(config)
        self.device = device
        self.ratios: Dict[str, collections.deque] = {s: collections.deque(maxlen=window)
                                                     for s in STAGES}

    @classmethod
    def for_backbone(cls, bb, device_spec: Optional[DeviceSpec] = None) -> "LatencyModel":
        from .errors import DeviceError
        bb = bb.lm if hasattr(bb, "lm") else bb
        shape = type(bb).cost_shape(bb.model.config.to_dict())   # first: a clear refusal
        if device_spec is None:
            if bb.device.type == "cpu":
                device_spec = cpu_device(threads=torch.get_num_threads())
            else:
                name = torch.cuda.get_device_name(bb.device).lower()
                key = next((k for k in DEVICES if k in name), None)
                if key is None:
                    raise DeviceError(f"ttft_budget_s: no cost-model spec for {name!r} (known: "
                                      f"{', '.join(DEVICES)})")
                device_spec = DEVICES[key]
        return cls(shape, device_spec)

    def scale(self, stage: str) -> float:
        r = self.ratios[stage]
        return max(r) if r else 1.0

    def raw(self, visual_tokens: int, text_tokens: int, num_frames: int, kept_frames: int,
            routers: bool, router_layers: int, router_pool: int,
            question_tokens: int) -> Dict[str, float]:
        """The cost model's stage seconds, uncorrected."""
        st = stage_costs(self.shape, visual_tokens, text_tokens, num_frames, self.device,
                         kept_frames=kept_frames, router_layers=router_layers,
                         router_pool=router_pool, question_tokens=question_tokens,
                         routers=routers)
        return {s: st[s]["seconds"] for s in STAGES}

    def predict(self, **kw) -> Dict[str, float]:
        """:meth:`raw` scaled per stage by the measured ratios."""
        return {s: v * self.scale(s) for s, v in self.raw(**kw).items()}

    @torch.inference_mode()
    def probe(self, vr, frames: int = 2, tokens: int = 512, question_tokens: int = 16) -> None:
        """Seed the per-stage ratios with this machine's speed on the real modules (warm)."""
        import time
        bb, routers = vr.lm, vr.routers
        H, W = bb.frame_spec.size
        pv = torch.zeros(frames, 3, H, W)
        x = torch.zeros(1, tokens, bb.hidden_size, device=bb.device, dtype=bb.dtype)
        q = torch.zeros(question_tokens, bb.hidden_size, device=bb.device, dtype=bb.dtype)
        sync = (lambda: torch.cuda.synchronize(bb.device)) if bb.device.type == "cuda" else \
            (lambda: None)

        def timed(fn):
            fn()                                   # warm
            sync()
            t0 = time.perf_counter()
            out = fn()
            sync()
            return time.perf_counter() - t0, out

        t_vis, Z = timed(lambda: bb.encode_frames(pv))
        t_pre, _ = timed(lambda: bb.forward(inputs_embeds=x))
        t_rt, _ = timed(lambda: routers.frame_logits(Z, q, None, None, bb.grid))
        common = dict(text_tokens=0, num_frames=frames, kept_frames=frames, question_tokens=question_tokens,
                      router_layers=routers.config.num_layers, router_pool=routers.config.router_pool)
        raw_v = self.raw(visual_tokens=0, routers=False, **common)
        raw_r = self.raw(visual_tokens=0, routers=True, **common)
        raw_p = self.raw(visual_tokens=tokens, routers=False, **dict(common, num_frames=0,
                                                                     kept_frames=0))
        self.observe({"vision": raw_v["vision"], "router": raw_r["router"],
                      "prefill": raw_p["prefill"]},
                     {"vision": t_vis, "router": t_rt, "prefill": t_pre})

    def observe(self, raw_predicted: Dict[str, float], measured: Dict[str, float]) -> None:
        """Record measured / raw-predicted per stage (stages that ran and took time)."""
        for s in STAGES:
            p, m = raw_predicted.get(s, 0.0), measured.get(s, 0.0)
            if p > 0 and m > 0:
                self.ratios[s].append(m / p)


def largest_fitting_budget(predict_for: Callable[[int], float], lo: int, hi: int,
                           target_s: float) -> Optional[int]:
    """The largest budget in [lo, hi] with ``predict_for(budget) <= target_s`` (predictions
    grow with the budget), or None when even ``lo`` does not fit."""
    if predict_for(lo) > target_s:
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if predict_for(mid) <= target_s:
            lo = mid
        else:
            hi = mid - 1
    return lo


__all__ = ["LatencyModel", "largest_fitting_budget", "STAGES"]
