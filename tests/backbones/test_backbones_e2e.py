"""Everything above the backbone works unchanged on both families (docs/CONTRACT.md section 7): the
planner, pool_pack, the routers, the runtime, the visual cache and the command line."""
import json

import pytest
import torch

from vr_runtime.backbones import frame_spec_for, load_backbone
from vr_runtime.backbones.tiny import ASSETS

SAMPLE = ASSETS.parent / "sample.mp4"
Q = "What shape is the red object?"


@pytest.fixture(scope="module")
def qwen_vr():
    from vr_runtime.runtime import VideoRouter
    return VideoRouter(load_backbone("tiny-qwen2.5-vl"))


@pytest.mark.parametrize("policy", ["auto", "global", "fragment", "dense", "budget", "uniform"])
def test_qwen_every_policy(qwen_vr, policy):
    g = torch.Generator().manual_seed(1)
    pv = torch.randn(4, 3, 448, 448, generator=g)
    r = qwen_vr.answer(pv, Q, num_frames=4, max_length=900, max_new_tokens=2, policy=policy,
                       allow_over_length=policy == "dense").report
    assert r["backbone"] == "qwen2_5_vl" and r["dense_visual_tokens"] == 4 * 256
    assert r["prompt_tokens"] == r["text_tokens"] + r["visual_tokens"]
    if policy != "dense":
        assert r["visual_tokens"] <= r["budget"]
        assert r["prompt_tokens"] + 2 + 100 <= 900


def test_qwen_decodes_with_its_own_normalisation(qwen_vr):
    from vr_runtime.video.load import load_video
    spec = frame_spec_for("tiny-qwen2.5-vl")
    assert spec == qwen_vr.lm.frame_spec and spec.mean != frame_spec_for("tiny").mean
    from vr_runtime.telemetry.timing import StageTimer
    frames = qwen_vr.load_frames(qwen_vr.request(str(SAMPLE), Q, num_frames=4), StageTimer("cpu"))
    ref = load_video(str(SAMPLE), num_frames=4, mean=spec.mean, std=spec.std).pixel_values
    inet = load_video(str(SAMPLE), num_frames=4).pixel_values
    assert torch.equal(frames.all_pixels(), ref) and not torch.allclose(ref, inet)
    a = qwen_vr.answer(str(SAMPLE), Q, num_frames=4, max_new_tokens=2, policy="fragment",
                       cache_visual=True).report
    b = qwen_vr.answer(str(SAMPLE), "Is it blue?", num_frames=4, max_new_tokens=2,
                       policy="fragment", cache_visual=True).report
    assert (a["visual_cache"], b["visual_cache"]) == ("miss", "hit")


def test_cli_ask_on_qwen_preset(cli_here):
    out = cli_here("ask", SAMPLE, Q, "--model", "tiny-qwen2.5-vl", "--frames", "4",
                   "--max-length", "1200", "--max-new-tokens", "2", "--policy", "global", "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)["report"]
    assert r["backbone"] == "qwen2_5_vl" and r["model"] == "tiny-qwen2.5-vl"
    assert r["windows"] == [2, 2, 2, 2]
