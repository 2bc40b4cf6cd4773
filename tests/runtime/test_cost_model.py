"""The TTFT cost model: shapes from the shipped configs, stage arithmetic, monotonicity."""
import os

import pytest

from vr_runtime.cost_model import DEVICES, DeviceSpec, load_shape, predict_ttft, stage_costs

CFG = os.path.join(os.path.dirname(__file__), "..", "..", "vr_runtime", "configs", "internvl3_8b.json")


def test_shape_of_the_8b_config():
    s = load_shape(CFG)
    assert (s.d, s.layers, s.heads, s.kv_heads, s.ff) == (3584, 28, 28, 4, 18944)
    assert (s.d_vis, s.vis_layers, s.vis_tokens, s.tokens_per_frame) == (1024, 24, 1025, 256)


def test_prefill_flops_match_the_closed_form():
    s = load_shape(CFG)
    dev = DeviceSpec("unit", 1e15, 1e15)
    L = 1000
    st = stage_costs(s, visual_tokens=L - 100, text_tokens=100, num_frames=4, device=dev, routers=False)
    hd = s.d // s.heads
    per_layer = 2 * L * (s.d * (s.d + 2 * s.kv_heads * hd) + s.d * s.d + 3 * s.d * s.ff) + 2 * L * L * s.d
    assert st["prefill"]["flops"] == pytest.approx(s.layers * per_layer + 2 * s.d * s.vocab, rel=1e-9)
    assert st["router"]["flops"] == 0


def test_predictions_grow_with_tokens_and_frames():
    a = predict_ttft(CFG, 4000, 180, 64, "h100")
    b = predict_ttft(CFG, 8000, 180, 64, "h100")
    c = predict_ttft(CFG, 8000, 180, 32, "h100")
    assert a["stages_s"]["prefill"] < b["stages_s"]["prefill"]
    assert c["stages_s"]["vision"] < b["stages_s"]["vision"]
    assert b["ttft_s"] == pytest.approx(sum(b["stages_s"].values()))
    assert predict_ttft(CFG, 8000, 180, 64, "h200")["ttft_s"] <= b["ttft_s"]
    assert set(DEVICES) >= {"h100", "h200"} and b["label"] == "model"
