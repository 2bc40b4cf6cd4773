"""Scales (s_g, s_1, s_0) from the command line (issue 27, item 3): one parser for ask, eval,
serve and the lmms-eval plugin, the `auto` rule of the paper's budget study, and the scales
reaching the plan."""
import json
import os
import subprocess
import sys

import pytest
import torch

from vr_runtime import cli
from vr_runtime.planning.scales import (AUTO, COARSE_SCALES, PAPER_SCALES, ScalesError,
                                        auto_scales, budget_from_text, parse_scales, resolve)


@pytest.mark.parametrize("text, want", [("2,1,4", (2, 1, 4)), (" 4, 1 ,8", (4, 1, 8)),
                                        ("4:1:8", (4, 1, 8)), ("2/1/4", (2, 1, 4)),
                                        ([4, 1, 8], (4, 1, 8)), ("AUTO", AUTO),
                                        (None, PAPER_SCALES)])
def test_parse(text, want):
    assert parse_scales(text) == want


@pytest.mark.parametrize("bad, needle", [("2,1", "three integers"), ("a,b,c", "three integers"),
                                         ([1.5, 1, 4], "three integers"), (4, "three integers"),
                                         ("", "three integers"), ("0,1,4", ">= 1"),
                                         ("2,4,1", "s_1"), ([True, 1, 4], "three integers")])
def test_bad_values_are_one_line(bad, needle):
    with pytest.raises(ScalesError, match=needle) as e:
        parse_scales(bad)
    assert "\n" not in str(e.value) and str(e.value).startswith("--scales")


@pytest.mark.parametrize("frames, budget, want", [
    # Section 5.3: 64 frames at 4K-8K run s_g=4, s_0=8; 128 frames at 4K-8K need s_0 >= 8
    (64, 4096, COARSE_SCALES), (64, 8192, COARSE_SCALES),
    (128, 4096, COARSE_SCALES), (128, 8192, COARSE_SCALES),
    # the controlled protocol (12,288) and abundant budgets (16K-24K, both frame counts): 2,1,4
    (64, 12288, PAPER_SCALES), (64, 16384, PAPER_SCALES), (64, 24576, PAPER_SCALES),
    (128, 16384, PAPER_SCALES), (128, 24576, PAPER_SCALES)])
def test_auto_follows_the_budget_study(frames, budget, want):
    # the rule reads the budget, not tokens per frame: 64 f at 8K and 128 f at 16K both have 128
    assert auto_scales(budget, 256) == want


def test_auto_at_a_request_budget():
    # B_img = max_length - text (10 per frame) - new tokens - margin
    b = budget_from_text(10 * 64, 8192 + 640 + 64 + 100, 64, 100)
    assert b == 8192 and resolve(AUTO, b) == (4, 1, 8)
    assert resolve(AUTO, 12288) == (2, 1, 4) and resolve((4, 1, 8), 99) == (4, 1, 8)


def _windows(scales) -> dict:
    return dict(zip(("global_window", "relevant_window", "other_window"), scales))


def test_scales_reach_the_plan():
    """The windows of a parsed value give the plan the paper describes."""
    from vr_runtime import VideoRouter
    vr = VideoRouter.from_pretrained("tiny")
    frames = torch.randn(4, 3, 448, 448, generator=torch.Generator().manual_seed(0))
    rel = [True, False, False, True]
    base = dict(num_frames=4, max_new_tokens=1, budget=900)
    r = vr.answer(frames, "What color?", policy="fragment", relevant=rel,
                  **_windows(parse_scales("4,1,8")), **base).report
    assert r["frame_tokens"] == [256, 4, 4, 256]
    r = vr.answer(frames, "What color?", policy="global",
                  **_windows(parse_scales("4,1,8")), **base).report
    assert r["frame_tokens"] == [16] * 4


def _videorouter(*args):
    e = dict(os.environ)
    e.pop("VIDEOROUTER_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "vr_runtime.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=180, env=e)


def test_ask_scales_and_a_bad_value(cli_here):
    sample = str(cli.SAMPLE_VIDEO)
    res = cli_here("ask", sample, "What is the background color?", "--frames", "4",
                   "--policy", "global", "--scales", "4,1,8", "--max-new-tokens", "1",
                   "--json")
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)["report"]
    assert rep["frame_tokens"] == [16] * 4                # s_g = 4: 256 / 16 per frame
    bad = _videorouter("ask", sample, "What?", "--scales", "2,1")
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1
    assert "--scales" in bad.stderr and "three integers" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_serve_request_field_and_default():
    from vr_runtime.serve.errors import APIError
    from vr_runtime.serve.schema import Limits, parse_request, to_settings
    msg = [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": "file:///x.mp4"}},
        {"type": "text", "text": "What?"}]}]
    s = to_settings(parse_request({"messages": msg}), Limits(), ["m"])
    assert s.scales == PAPER_SCALES
    s = to_settings(parse_request({"messages": msg}), Limits(scales=AUTO), ["m"])
    assert s.scales == AUTO
    s = to_settings(parse_request({"messages": msg, "scales": "4,1,8"}), Limits(), ["m"])
    assert s.scales == (4, 1, 8)
    s = to_settings(parse_request({"messages": msg, "mm_processor_kwargs": {"scales": [4, 1, 8]}}),
                    Limits(), ["m"])
    assert s.scales == (4, 1, 8)
    with pytest.raises(APIError) as e:
        to_settings(parse_request({"messages": msg, "scales": "9"}), Limits(), ["m"])
    assert e.value.status == 400 and "scales" in str(e.value)


def test_serve_command_option():
    from vr_runtime.serve.command import configs
    p = cli.build_parser()
    args = p.parse_args(["serve", "--media-dir", ".", "--scales", "auto"])
    assert configs(args)[2].scales == AUTO
    assert configs(p.parse_args(["serve", "--media-dir", "."]))[2].scales == PAPER_SCALES
