"""vr_runtime.video.load: InternVL sampling, time windows, preprocessing, prefetch and bad inputs."""
import pathlib
import random
from fractions import Fraction

import numpy as np
import pytest
import torch

from vr_runtime.errors import VideoError
from vr_runtime.video.load import (IMAGENET_MEAN, IMAGENET_STD, VideoClip, load_video,
                              prefetch_video, preprocess_frames, sample_indices)

SAMPLE = pathlib.Path(__file__).resolve().parents[2] / "vr_runtime" / "assets" / "sample.mp4"


def internvl_get_index(bound, fps, max_frame, first_idx=0, num_segments=32):
    """InternVL's published get_index (InternVL3 model card, load_video), verbatim."""
    if bound:
        start, end = bound[0], bound[1]
    else:
        start, end = -100000, 100000
    start_idx = max(first_idx, round(start * fps))
    end_idx = min(round(end * fps), max_frame)
    seg_size = float(end_idx - start_idx) / num_segments
    frame_indices = np.array([
        int(start_idx + (seg_size / 2) + np.round(seg_size * idx))
        for idx in range(num_segments)
    ])
    return frame_indices


def write_video(path, frames, fps=4, faststart=False):
    """Encode uint8 [T, H, W, 3] frames as near-lossless H.264 with PyAV."""
    import av
    opts = {"movflags": "faststart"} if faststart else {}
    with av.open(str(path), "w", options=opts) as c:
        s = c.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000))
        s.height, s.width = frames.shape[1:3]
        s.pix_fmt = "yuv420p"
        s.options = {"crf": "4", "preset": "veryfast"}
        for f in frames:
            for p in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


def grey_level(i):
    return 10 + 5 * i  # frame i is a flat grey of this level: decoded frames name themselves


def denorm(pixels):
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (pixels * std + mean) * 255.0


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    d = tmp_path_factory.mktemp("videos")
    T, H, W = 48, 120, 160  # not square: the resize to 448x448 changes the aspect ratio
    grey = np.stack([np.full((H, W, 3), grey_level(i), np.uint8) for i in range(T)])
    out = {"grey": write_video(d / "grey.mp4", grey, fps=4),
           "short": write_video(d / "short.mp4", grey[:10], fps=4),
           "grey_fs": write_video(d / "grey_fs.mp4", grey, fps=4, faststart=True)}
    (d / "empty.mp4").write_bytes(b"")
    (d / "random.mp4").write_bytes(np.random.default_rng(0).bytes(20000))
    (d / "text.mp4").write_text("this is not a video\n" * 50)
    (d / "notes.txt").write_text("this is not a video\n" * 50)  # ffmpeg's "tty" demuxer takes it
    from PIL import Image
    Image.fromarray(grey[3]).save(d / "image.png")
    Image.fromarray(grey[3]).save(d / "image.jpg")
    out.update(empty=d / "empty.mp4", random=d / "random.mp4", text=d / "text.mp4",
               txt=d / "notes.txt", png=d / "image.png", jpg=d / "image.jpg", missing=d / "nope.mp4", directory=d)
    # Cut-off files: without the trailing moov index, and (faststart) with the index but
    # without the second half of the frame data.
    data = out["grey"].read_bytes()
    (d / "truncated.mp4").write_bytes(data[: len(data) // 2])
    data = out["grey_fs"].read_bytes()
    (d / "truncated_fs.mp4").write_bytes(data[: len(data) // 2])
    out.update(truncated=d / "truncated.mp4", truncated_fs=d / "truncated_fs.mp4")
    return out


def decoded_levels(clip):
    return denorm(clip.pixel_values).mean(dim=(1, 2, 3))


# ----------------------------------------------------------------------------- sampling

def test_sample_indices_match_internvl():
    rng = random.Random(1234)
    for _ in range(500):
        num = rng.randint(1, 128)
        total = rng.randint(num + 1, 6000)
        fps = rng.choice([1.0, 2.0, 23.976, 25.0, 29.97, 30.0, 60.0, rng.uniform(0.5, 60)])
        window = None
        if rng.random() < 0.5:
            dur = total / fps
            a, b = sorted(rng.uniform(0, dur) for _ in range(2))
            window = (a, b)
            start_idx, end_idx = max(0, round(a * fps)), min(round(b * fps), total - 1)
            if end_idx - start_idx + 1 <= num:
                continue  # fewer frames than asked: all frames, tested below
        ours = sample_indices(total, num, fps, window)
        ref = internvl_get_index(window, fps, total - 1, num_segments=num).tolist()
        assert ours == ref, (total, num, fps, window)
        assert ours == sorted(ours) and len(set(ours)) == num


def test_sample_indices_fewer_frames_than_asked():
    assert sample_indices(10, 16, 4.0) == list(range(10))
    assert sample_indices(16, 16, 2.0) == list(range(16))
    # window [2 s, 4 s] at 4 fps = frames 8..16 (9 frames) < 12 asked
    assert sample_indices(48, 12, 4.0, (2.0, 4.0)) == list(range(8, 17))


def test_sample_indices_time_window_bounds():
    rng = random.Random(7)
    for _ in range(200):
        fps = rng.uniform(1, 60)
        total = rng.randint(100, 5000)
        a = rng.uniform(0, total / fps * 0.8)
        b = rng.uniform(a + 2.0 / fps, total / fps)
        idx = sample_indices(total, rng.randint(1, 64), fps, (a, b))
        assert round(a * fps) <= idx[0] and idx[-1] <= min(round(b * fps), total - 1)


@pytest.mark.parametrize("window", [(5.0, 5.0), (6.0, 2.0), (-1.0, 3.0), (20.0, 30.0),
                                    (1.0, 99.0), (float("nan"), 3.0), ("a", "b"), (1.0,)])
def test_bad_time_window(window):
    with pytest.raises(VideoError, match="time_window"):
        sample_indices(48, 8, 4.0, window)  # the clip lasts 12 s


@pytest.mark.parametrize("n", [0, -3, 2.5, True, None])
def test_bad_num_frames(n, videos):
    with pytest.raises(VideoError, match="num_frames"):
        sample_indices(48, n, 4.0)
    with pytest.raises(VideoError, match="num_frames"):
        load_video(videos["grey"], num_frames=n)


# ----------------------------------------------------------------------------- preprocessing

def test_preprocess_matches_internvl_transform():
    from PIL import Image
    rng = np.random.default_rng(0)
    for h, w in [(120, 160), (500, 300), (448, 448), (900, 1000)]:
        frames = rng.integers(0, 256, (2, h, w, 3), dtype=np.uint8)
        ours = preprocess_frames(frames, 448)
        # InternVL: PIL RGB -> Resize((448, 448), BICUBIC) -> ToTensor -> Normalize(mean, std)
        ref = np.stack([np.asarray(Image.fromarray(f).resize((448, 448), Image.BICUBIC))
                        for f in frames]).astype(np.float32) / 255.0
        ref = (ref - np.array(IMAGENET_MEAN, np.float32)) / np.array(IMAGENET_STD, np.float32)
        ref = torch.from_numpy(ref).permute(0, 3, 1, 2)
        assert ours.shape == (2, 3, 448, 448) and ours.dtype == torch.float32
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_load_video_shape_values_and_indices(videos):
    clip = load_video(videos["grey"], num_frames=8)
    assert isinstance(clip, VideoClip)
    assert clip.pixel_values.shape == (8, 3, 448, 448)
    assert clip.total_frames == 48 and clip.fps == pytest.approx(4.0) and clip.requested == 8
    assert clip.frame_indices == internvl_get_index(None, 4.0, 47, num_segments=8).tolist()
    assert clip.timestamps_s == pytest.approx([i / 4.0 for i in clip.frame_indices])
    assert clip.note is None and clip.decode_s > 0
    # Each decoded frame is the flat grey of its source index: the right frames were read and
    # the normalisation inverts to the original levels (H.264 error of a level or two).
    levels = decoded_levels(clip)
    expect = torch.tensor([float(grey_level(i)) for i in clip.frame_indices])
    torch.testing.assert_close(levels, expect, atol=2.0, rtol=0)


def test_load_video_time_window(videos):
    clip = load_video(videos["grey"], num_frames=4, time_window=(2.0, 6.0))
    assert clip.frame_indices == internvl_get_index((2.0, 6.0), 4.0, 47, num_segments=4).tolist()
    assert all(2.0 <= t <= 6.0 for t in clip.timestamps_s)
    expect = torch.tensor([float(grey_level(i)) for i in clip.frame_indices])
    torch.testing.assert_close(decoded_levels(clip), expect, atol=2.0, rtol=0)
    with pytest.raises(VideoError, match="outside the video"):
        load_video(videos["grey"], num_frames=4, time_window=(13.0, 20.0))


def test_load_video_fewer_frames_than_asked(videos):
    clip = load_video(videos["short"], num_frames=16)
    assert clip.frame_indices == list(range(10)) and clip.pixel_values.shape[0] == 10
    assert clip.requested == 16 and "10" in clip.note and "16" in clip.note


def test_prefetch_matches_load(videos):
    import threading
    fut = prefetch_video(videos["grey"], num_frames=12, progress=True)
    # daemon decode threads: the interpreter does not wait for (or hang joining) them at exit
    assert all(t.daemon for t in threading.enumerate() if t.name == "vr-decode")
    clip = fut.result(timeout=60)
    ref = load_video(videos["grey"], num_frames=12)
    assert clip.frame_indices == ref.frame_indices
    torch.testing.assert_close(clip.pixel_values, ref.pixel_values)


def test_bundled_sample_ground_truth():
    """The bundled demo clip is synthetic.demo_spec: the red circle is in frames 5-7 only."""
    from vr_runtime.data.synthetic_videos import demo_spec, render_frame
    spec = demo_spec()
    clip = load_video(SAMPLE, num_frames=16)
    assert clip.frame_indices == list(range(spec.num_frames)) and clip.fps == spec.fps
    assert SAMPLE.stat().st_size < 200_000
    rgb = denorm(clip.pixel_values)
    red = ((rgb[:, 0] > 180) & (rgb[:, 1] < 80) & (rgb[:, 2] < 80)).float().mean(dim=(1, 2))
    assert (red > 0.05).nonzero().flatten().tolist() == spec.frames_with("red") == [5, 6, 7]
    ref = preprocess_frames(np.stack([render_frame(spec, t) for t in range(16)]), 448)
    assert (denorm(ref) - rgb).abs().mean() < 3.0


def test_parallel_workers_under_the_callers_inference_mode(tmp_path):
    """Workers deliver frames from their own threads, where inference mode (thread-local) is
    off; the clip made under the caller's inference mode is still written, and equals one
    worker's."""
    import subprocess
    path = tmp_path / "gops.mp4"   # a keyframe every 8 frames: several shares for 2 workers
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-f", "lavfi", "-i", "testsrc=size=96x64:rate=16",
                    "-t", "4", "-c:v", "libx264", "-g", "8", "-pix_fmt", "yuv420p", str(path)],
                   check=True)
    with torch.inference_mode():
        two = load_video(path, num_frames=16, size=64, decoder="pyav", decode_workers=2)
        one = load_video(path, num_frames=16, size=64, decoder="pyav", decode_workers=1)
    assert torch.equal(two.pixel_values, one.pixel_values)


# ----------------------------------------------------------------------------- bad inputs

@pytest.mark.parametrize("kind,match", [
    ("missing", "no such file"), ("directory", "directory"), ("empty", "empty"),
    ("random", "not a readable video"), ("text", "not a readable video"),
    ("txt", "text file, not a video"),
    ("png", "image"), ("jpg", "image"), ("truncated", "not a readable video|corrupt|truncated"),
    ("truncated_fs", "corrupt|truncated"),
])
def test_bad_files(videos, kind, match, capfd):
    with pytest.raises(VideoError, match=match):
        load_video(videos[kind], num_frames=8)
    with pytest.raises(VideoError, match=match):
        prefetch_video(videos[kind], num_frames=8).result(timeout=60)
    # decord/ffmpeg noise is kept off the terminal: the error message is the only output
    assert capfd.readouterr().err == ""


def test_audio_only_file(tmp_path):
    import av
    path = tmp_path / "audio.m4a"
    with av.open(str(path), "w") as c:
        s = c.add_stream("aac", rate=16000)
        for i in range(10):
            f = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp",
                                           layout="mono")
            f.sample_rate, f.pts = 16000, i * 1024
            for p in s.encode(f):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    with pytest.raises(VideoError, match="no video stream"):
        load_video(path, num_frames=4)


def test_zero_frames():
    with pytest.raises(VideoError, match="no frames"):
        sample_indices(0, 8, 4.0)


def test_mjpeg_in_a_container_is_a_video(tmp_path):
    """MJPEG frames inside AVI are a video, not a still image (only image demuxers are)."""
    import av
    path = tmp_path / "mjpeg.avi"
    with av.open(str(path), "w") as c:
        s = c.add_stream("mjpeg", rate=4)
        s.width = s.height = 64
        s.pix_fmt = "yuvj420p"
        for i in range(8):
            frame = np.full((64, 64, 3), grey_level(i), np.uint8)
            for p in s.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    clip = load_video(path, num_frames=4)
    assert clip.frame_indices == internvl_get_index(None, 4.0, 7, num_segments=4).tolist()
    expect = torch.tensor([float(grey_level(i)) for i in clip.frame_indices])
    torch.testing.assert_close(decoded_levels(clip), expect, atol=3.0, rtol=0)


# ----------------------------------------------------------------------------- time windows

def test_sample_window_equals_internvl_on_constant_rate():
    """By-time window sampling is exactly InternVL's get_index(bound) when frames are evenly
    spaced (pts = i / fps), including the fewer-frames-than-asked case."""
    from vr_runtime.video.load import sample_window
    rng = random.Random(99)
    for _ in range(400):
        fps = rng.choice([1.0, 4.0, 23.976, 25.0, 29.97, 30.0, 60.0, rng.uniform(0.5, 60)])
        total = rng.randint(2, 3000)
        num = rng.randint(1, 96)
        dur = total / fps
        a, b = sorted(rng.uniform(0, dur) for _ in range(2))
        if b - a < 1e-3:
            continue
        pts = [i / fps for i in range(total)]
        ours = sample_window(pts, num, (a, b), fps)
        assert ours == sample_indices(total, num, fps, (a, b)), (total, num, fps, a, b)


def test_sample_window_variable_rate():
    """Random VFR timelines: picks are distinct, increasing, on screen inside the window, and
    as many as asked when the window holds enough frames."""
    from vr_runtime.video.load import sample_window
    rng = np.random.default_rng(5)
    for _ in range(300):
        n = int(rng.integers(2, 400))
        gaps = rng.choice([rng.uniform(0.005, 0.05), rng.uniform(0.2, 1.0)], size=n - 1)
        pts = np.concatenate([[rng.uniform(0, 0.5)], rng.uniform(0.5, 1.5, n - 1) * gaps])
        pts = np.cumsum(pts)
        end = pts[-1] + (pts[-1] - pts[-2])
        a, b = sorted(rng.uniform(0, end, 2))
        if b - a < 0.05:
            continue
        num = int(rng.integers(1, 64))
        idx = sample_window(pts, num, (a, b))
        assert idx == sorted(set(idx)) and len(idx) >= 1
        nxt = np.append(pts[1:], np.inf)
        fps = (n - 1) / (pts[-1] - pts[0])
        slack = 0.5 / fps + 1e-6  # window bounds snap to the grid, as InternVL's round() does
        assert all(pts[i] <= b + slack and nxt[i] > a - slack for i in idx), (a, b, idx)
        on_screen = [i for i in range(n) if pts[i] <= b and nxt[i] > a]
        assert len(idx) <= max(num, 1)
        if len(on_screen) >= 4 * num:  # plenty of frames: the full count
            assert len(idx) >= num - 1, (len(idx), num, len(on_screen))
