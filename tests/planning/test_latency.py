"""Latency-budgeted routing: the budget search, the correction by measurements, the report."""
import random

import pytest

from vr_runtime.planning.cost_model import DeviceSpec
from vr_runtime.planning.latency import LatencyModel, largest_fitting_budget

Q = "Which color is the square in the video?"


@pytest.mark.parametrize("seed", range(20))
def test_largest_fitting_budget_is_the_brute_force_answer(seed):
    rnd = random.Random(seed)
    lo, hi = rnd.randint(1, 50), rnd.randint(60, 3000)
    steps = sorted(rnd.sample(range(lo, hi + 1), 8))   # a monotone staircase of predictions
    f = lambda b: sum(1 for s in steps if s <= b)      # noqa: E731
    target = rnd.uniform(-1, 9)
    want = max((b for b in range(lo, hi + 1) if f(b) <= target), default=None)
    assert largest_fitting_budget(f, lo, hi, target) == want


def test_ratios_scale_predictions_by_the_recent_max(tiny_lm):
    dev = DeviceSpec("test", flops=1e11, bandwidth=1e10)
    m = LatencyModel(tiny_lm.model.config.to_dict(), dev, window=3)
    kw = dict(visual_tokens=512, text_tokens=80, num_frames=4, kept_frames=4, routers=True,
              router_layers=4, router_pool=1, question_tokens=10)
    raw = m.predict(**kw)
    assert all(v > 0 for k, v in raw.items() if k != "compress")
    m.observe(raw, {k: 3 * v for k, v in raw.items()})
    m.observe(raw, {k: 2 * v for k, v in raw.items()})
    assert m.predict(**kw)["prefill"] == pytest.approx(3 * raw["prefill"])
    for _ in range(3):                                  # the window forgets the old 3x
        m.observe(raw, {k: 1.5 * v for k, v in raw.items()})
    assert m.predict(**kw)["vision"] == pytest.approx(1.5 * raw["vision"])
    assert m.raw(**kw) == pytest.approx(raw)
    more = m.raw(**dict(kw, visual_tokens=2048))
    assert more["prefill"] > raw["prefill"]             # the budget moves the prefill


def test_answer_with_a_ttft_budget(tiny_vr, frames):
    pv = frames(6, seed=8)
    kw = dict(num_frames=6, max_length=4000, max_new_tokens=1, policy="global")
    full = tiny_vr.answer(pv, Q, **kw).report
    r = tiny_vr.answer(pv, Q, **kw, ttft_budget_s=1e6).report        # anything fits
    assert r["windows"] == full["windows"] and r["budget"] == full["budget"]
    assert r["ttft_budget_s"] == 1e6 and r["ttft_predicted_s"] > 0
    assert set(r["ttft_predicted_stages_s"]) == {"vision", "router", "compress", "prefill"}
    tight = tiny_vr.answer(pv, Q, **kw, ttft_budget_s=1e-6).report   # nothing fits
    assert tight["visual_tokens"] == 64 and any("even the smallest plan" in n
                                                for n in tight["notes"])
    mid_target = full["timings_s"]["ttft"] * 0.6
    mid = tiny_vr.answer(pv, Q, **kw, ttft_budget_s=mid_target).report
    if not any("even the smallest plan" in n for n in mid["notes"]):
        assert mid["ttft_predicted_s"] <= mid_target
    assert tight["visual_tokens"] <= mid["visual_tokens"] <= full["visual_tokens"]
    with pytest.raises(ValueError, match="ttft_budget_s"):
        tiny_vr.answer(pv, Q, num_frames=6, policy="dense", ttft_budget_s=1.0)
    with pytest.raises(ValueError, match="ttft_budget_s"):
        tiny_vr.answer(pv, Q, num_frames=6, ttft_budget_s=-2)


def test_answer_with_a_ttft_budget_on_qwen(frames):
    # The backbone gives its own cost shape, so --ttft-budget is not InternVL3's alone.
    from vr_runtime.backbones import load_backbone
    from vr_runtime.backbones.base import Backbone
    from vr_runtime.runtime import VideoRouter
    lm = load_backbone("tiny-qwen2.5-vl")
    shape = type(lm).cost_shape(lm.model.config.to_dict())
    assert shape.vis_window_tokens == 64 and shape.tokens_per_frame == 256
    vr = VideoRouter(lm, warmup_frames=0)
    pv = frames(4, seed=3)
    kw = dict(num_frames=4, max_length=4000, max_new_tokens=1, policy="global")
    r = vr.answer(pv, Q, **kw, ttft_budget_s=1e6).report
    assert r["ttft_budget_s"] == 1e6 and r["ttft_predicted_s"] > 0
    assert set(r["ttft_predicted_stages_s"]) == {"vision", "router", "compress", "prefill"}
    tight = vr.answer(pv, Q, **kw, ttft_budget_s=1e-6).report
    assert any("even the smallest plan" in n for n in tight["notes"])
    assert tight["visual_tokens"] < r["visual_tokens"]

    class NoShape(Backbone):   # a backbone that gives no cost shape is refused in one line
        family = "toy"
    with pytest.raises(ValueError, match="gives no cost shape"):
        NoShape.cost_shape({})


def test_kernel_warmup_runs_at_load_and_is_a_no_op_on_cpu(tiny_lm):
    from vr_runtime.runtime import VideoRouter
    vr = VideoRouter(tiny_lm)
    assert "cpu" in vr.kernel_warmup["skipped"]
    assert VideoRouter(tiny_lm, warmup_frames=0).kernel_warmup == {"skipped": "warmup_frames=0"}
