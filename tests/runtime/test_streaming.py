"""The streaming vision stage: frames decoded on worker threads flow through the tower a chunk at
a time, and Z, the plan and the answer are those of the whole decoded clip encoded at once (fp32;
the InternVL tiny, Qwen2.5-VL's tiny and Qwen3-VL's tiny, whose units hold two frames)."""
import subprocess
import threading

import pytest
import torch

from vr_runtime.backbones import load_backbone
from vr_runtime.request import AnswerOptions
from vr_runtime.routing.routers import Routers
from vr_runtime.runtime import VideoRouter
from vr_runtime.telemetry.timing import StageTimer
from vr_runtime.video.load import load_video

Q = "What shape is the red object?"


@pytest.fixture(scope="module")
def clip_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("streaming") / "clip.mp4")
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i",
                    "testsrc2=size=320x180:rate=10", "-frames:v", "30", "-c:v", "libx264",
                    "-g", "5", path], check=True, timeout=120)
    return path


@pytest.fixture(scope="module", params=["tiny", "tiny-qwen2.5-vl", "tiny-qwen3-vl"])
def vr(request):
    torch.manual_seed(0)
    lm = load_backbone(request.param, device="cpu", dtype=torch.float32)
    return VideoRouter(lm, Routers.from_backbone(lm))


def _reference_z(vr, path, n, chunk):
    """Z as the runtime computed it before the stream: the whole clip decoded and preprocessed,
    grouped into units, encoded in one ``encode_frames`` call."""
    spec = vr.lm.frame_spec
    clip = load_video(path, num_frames=n, size=spec.size[0], mean=spec.mean, std=spec.std)
    pv, _, _ = vr.lm.units(clip.pixel_values, clip.frame_indices, clip.timestamps_s)
    return vr.lm.encode_frames(pv, chunk), clip


@pytest.mark.parametrize("n,chunk", [(7, 3)])
def test_streamed_z_is_the_whole_clips(vr, clip_path, n, chunk):
    ref, _ = _reference_z(vr, clip_path, n, chunk)
    req = vr.request(clip_path, Q, num_frames=n, chunk_size=chunk)
    frames = vr.load_frames(req, StageTimer())
    assert frames.pixel_values is None                 # opened, nothing decoded yet
    Z = vr.encode(frames, req, StageTimer(), None)
    assert torch.equal(Z, ref)
    keep = [0, 2, frames.T - 1]                        # a plan-first policy's kept units
    Zk = vr.encode(vr.load_frames(req, StageTimer()), req, StageTimer(), None, keep)
    assert torch.equal(Zk, ref[keep])
    assert frames.pixel_values is None                 # no pixel outlived the vision stage


@pytest.mark.parametrize("policy", ["fragment", "uniform"])
def test_the_answer_and_plan_are_the_decoded_clips(vr, clip_path, policy):
    spec = vr.lm.frame_spec
    clip = load_video(clip_path, num_frames=8, size=spec.size[0], mean=spec.mean, std=spec.std)
    opts = AnswerOptions(num_frames=8, max_length=1200, max_new_tokens=3, policy=policy,
                         chunk_size=3, relevant=None if policy != "fragment" else None)
    a = vr.answer(clip_path, Q, options=opts)
    b = vr.answer(clip.pixel_values, Q, options=opts)     # frames given whole, as a tensor
    assert a.text == b.text
    for key in ("windows", "frame_tokens", "visual_tokens", "policy"):
        assert a.report[key] == b.report[key], key
    assert a.report["frame_indices"][0] == clip.frame_indices[0]
    t = a.report["timings_s"]
    assert t["first_token"] is not None and t["first_token"] >= t["ttft"] - 1e-6
    assert "frames_wait" in t and t["frames"] > 0


def test_batch_and_cache_take_the_stream(tiny_vr, clip_path):
    vr = tiny_vr
    opts = AnswerOptions(num_frames=6, max_length=1200, max_new_tokens=2, policy="fragment",
                         chunk_size=4)
    one = vr.answer(clip_path, Q, options=opts)
    both = vr.answer_batch([clip_path, clip_path], Q, options=opts)
    assert [x.text for x in both] == [one.text] * 2
    assert both[0].report["windows"] == one.report["windows"]
    cached = AnswerOptions(num_frames=6, max_length=1200, max_new_tokens=2, policy="fragment",
                           chunk_size=4, cache_visual=True)
    first = vr.answer(clip_path, Q, options=cached)
    again = vr.answer(clip_path, "Is it blue?", options=cached)
    assert (first.report["visual_cache"], again.report["visual_cache"]) == ("miss", "hit")
    assert first.text == one.text
    assert vr.has_frames(clip_path, 6)
    vr.clear_visual_cache()
    assert not [t for t in threading.enumerate() if t.name.startswith("vr-frames-")]


def test_rate_sampling_reaches_the_prompt(clip_path):
    torch.manual_seed(0)
    lm = load_backbone("tiny", device="cpu", dtype=torch.float32)
    vr = VideoRouter(lm, Routers.from_backbone(lm))
    r = vr.answer(clip_path, Q, fps=2.0, max_length=1500, max_new_tokens=2, policy="uniform")
    assert r.report["num_frames_used"] == 6                 # 3 s at 2 fps
    assert r.report["frame_indices"][0] == 0 and r.report["frame_indices"][-1] == 29
    assert any("2 fps" in n for n in r.report["notes"])
    with pytest.raises(ValueError, match="fps"):
        vr.answer(torch.zeros(2, 3, 448, 448), Q, fps=2.0)
    with pytest.raises(ValueError, match="fps"):
        AnswerOptions(fps=0)


def test_dropped_frames_are_said(tiny_vr):
    # 40 frames at the coarsest window (16 tokens) plus their lines do not fit: frames drop
    r = tiny_vr.answer(torch.zeros(40, 3, 448, 448), Q, num_frames=40, max_length=700,
                       max_new_tokens=2, policy="global", margin=10)
    dropped = r.report["frames_dropped"]
    assert dropped > 0 and dropped + r.report["frames_kept"] == 40
    assert any(f"{dropped} of 40 sampled frames were dropped" in n for n in r.report["notes"])


def test_rate_and_count_sampling_never_share_a_cache_entry(tiny_vr, clip_path):
    """8 frames by count and 8 frames by rate are different frames: a cached video keyed by one
    must not answer the other."""
    kw = dict(max_length=1500, max_new_tokens=2, policy="uniform", cache_visual=True)
    a = tiny_vr.answer(clip_path, Q, num_frames=3, **kw)
    b = tiny_vr.answer(clip_path, Q, fps=1.0, max_frames=3, min_frames=3, **kw)
    assert b.report["visual_cache"] == "miss"
    assert a.report["frame_indices"] != b.report["frame_indices"]
    tiny_vr.clear_visual_cache()
