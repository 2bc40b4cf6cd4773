"""Latency-budgeted routing (beyond the paper): ``answer(..., ttft_budget_s=...)`` picks the
largest visual budget whose *predicted* TTFT on this device fits the target.

The prediction is :mod:`vr_runtime.planning.cost_model` (per-stage FLOPs and bytes on a device spec:
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
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch

from vr_kernels import pooled_counts

from . import budget
from .cost_model import DEVICES, DeviceSpec, Shape, cpu_device, load_shape, stage_costs
from .policies import FittedPlan, kept_frames

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
        from ..errors import DeviceError
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
    def probe(self, bb, routers, frames: int = 2, tokens: int = 512,
              question_tokens: int = 16) -> None:
        """Seed the per-stage ratios with this machine's speed on the real modules (warm):
        backbone ``bb`` and its ``routers``."""
        import time
        H, W = bb.frame_spec.size
        pv = torch.zeros(frames, 3 * bb.frames_per_unit, H, W)   # units (Backbone.units)
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


# ---------------------------------------------------------------------- the runtime's use of it
# What latency planning needs of a runtime is a :class:`LatencyContext`: the backbone, the
# routers, the latency state and the question embedder -- not the runtime itself.

class LatencyState:
    """A runtime's latency model: none until a request gives ``ttft_budget_s``, then built
    and probed once (the probe runs the model) and corrected by every answer after."""

    def __init__(self, model: Optional[LatencyModel] = None):
        self.model = model

    def get(self, lm, routers) -> LatencyModel:
        """The model of backbone ``lm`` on its device (built and probed on first use)."""
        if self.model is None:
            model = LatencyModel.for_backbone(lm)
            model.probe(lm, routers)
            self.model = model
        return self.model


@dataclass
class LatencyContext:
    """What latency planning reads: backbone ``lm``, its ``routers``, the runtime's
    :class:`LatencyState` and ``embed`` (question -> Emb(q), for the question's length)."""
    lm: object
    routers: object
    state: LatencyState
    embed: Callable[[str], torch.Tensor]

    @property
    def model(self) -> LatencyModel:
        """The cost model of the backbone on its device, corrected by this process's
        measurements (built, CPU: calibrated, on first use)."""
        return self.state.get(self.lm, self.routers)


def plan_inputs(ctx: LatencyContext, req, planner, T: int):
    """-> ``inputs(plan)``: the cost model's inputs for one plan of ``req``. What does not
    depend on the plan (the prompt's text, the question's length) is counted once."""
    routers = ctx.routers
    pool = req.scorer.image_router_pool(routers)   # None: the scorer runs no Image Router
    fixed = dict(text_tokens=req.text_tokens(ctx.lm, T),
                 routers=planner.needs_relevance and (req.scorer.uses_routers
                                                      or pool is not None),
                 router_layers=routers.config.num_layers,
                 router_pool=routers.config.router_pool if pool is None else pool,
                 question_tokens=int(ctx.embed(req.routed_question).shape[0]))
    grid = ctx.lm.grid

    def inputs(plan) -> dict:
        kept = len(kept_frames(plan, grid))
        # plan-first policies encode only the frames they keep
        return dict(fixed, visual_tokens=sum(pooled_counts(plan, grid)), kept_frames=kept,
                    num_frames=T if planner.needs_relevance else kept)
    return inputs


def fit_latency(ctx: LatencyContext, req, planner, T: int, relevant, fitted, text_for):
    """The largest visual budget (at most the context's) whose predicted TTFT fits
    ``req.ttft_budget_s`` -> a FittedPlan."""
    model = ctx.model
    grid, w = ctx.lm.grid, req.windows
    inputs = plan_inputs(ctx, req, planner, T)

    def plan_for(b: int):
        try:
            plan = planner.plan(T, b, grid, relevant, w)
        except budget.BudgetError:
            return None
        return plan if sum(pooled_counts(plan, grid)) else None

    def predicted(b: int) -> float:
        plan = plan_for(b)
        if plan is None:
            return float("inf")
        return sum(model.predict(**inputs(plan)).values())

    # The smallest budget that holds a frame at one of the policy's windows.
    sizes = sorted(budget.window_tokens(x, grid)
                   for x in (w.other_window, w.global_window, w.relevant_window, 1))
    lo = next((b for b in sizes if plan_for(b) is not None), fitted.budget)
    best = largest_fitting_budget(predicted, lo, max(fitted.budget, lo), req.ttft_budget_s)
    chosen = lo if best is None else best
    notes = () if best is not None else (
        f"ttft_budget_s {req.ttft_budget_s:g}: even the smallest plan is predicted at "
        f"{predicted(lo):.3f} s (the vision tower and routers see every frame); it was used",)
    plan = planner.plan(T, chosen, grid, relevant, w)
    return FittedPlan(plan, chosen, text_for(kept_frames(plan, grid)), notes)


def latency_report(ctx: LatencyContext, req, planner, T: int, fitted, timer,
                   observe: bool = True) -> dict:
    """The report's prediction for the plan that ran; ``observe``: correct the model by what
    this request measured."""
    model = ctx.model
    inputs = plan_inputs(ctx, req, planner, T)(fitted.plan)
    raw = model.raw(**inputs)
    pred = model.predict(**inputs)
    if observe:   # a batch's shared prefill is not one request's: it would mislead the model
        model.observe(raw, timer.times)   # corrects the next prediction
    return {"ttft_budget_s": req.ttft_budget_s,
            "ttft_predicted_s": round(sum(pred.values()), 6),
            "ttft_predicted_stages_s": {k: round(v, 6) for k, v in pred.items()},
            "ttft_model_device": model.device.name}


__all__ = ["LatencyModel", "LatencyState", "LatencyContext", "largest_fitting_budget", "STAGES",
           "plan_inputs", "fit_latency", "latency_report"]
