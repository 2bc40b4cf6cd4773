"""The frame stream (vr_runtime.video.stream, .frames): the frames are the PIL path's byte for
byte whatever the workers and chunks, in order, a bounded window held, and a failing or closed
stream leaves no thread behind."""
import subprocess
import threading

import numpy as np
import pytest
import torch

from vr_runtime.errors import VideoError
from vr_runtime.video import decoders as D
from vr_runtime.video.frames import FileSource, TensorSource, open_frames
from vr_runtime.video.load import (IMAGENET_MEAN, IMAGENET_STD, load_video, open_video,
                                   preprocess_frames)
from vr_runtime.video.sampling import FrameSpec, Sampling
from vr_runtime.video.stream import FrameStream, gop_jobs


def _encode(path, w, h, pix_fmt="yuv420p", frames=40, gop=6, codec="libx264"):
    src = f"testsrc2=size={w}x{h}:rate=10,noise=alls=20:allf=t"
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i", src, "-frames:v",
                    str(frames), "-c:v", codec, "-pix_fmt", pix_fmt, "-g", str(gop),
                    "-bf", "2", path], check=True, timeout=120)
    return path


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    d = tmp_path_factory.mktemp("stream")
    return {
        "16:9": _encode(str(d / "wide.mp4"), 320, 180),
        "9:16": _encode(str(d / "tall.mp4"), 180, 320),
        "4:3": _encode(str(d / "four3.mp4"), 200, 150),
        "10bit": _encode(str(d / "ten.mp4"), 320, 180, pix_fmt="yuv420p10le"),
    }


def _reference(path, n, size):
    """The PIL path as it was: every sampled frame decoded on one thread, then preprocessed
    at once (preprocess_frames: PIL's bicubic resize, float32 normalisation)."""
    info = open_video(path)
    clip_indices = load_video(path, num_frames=n, size=size, decode_workers=1).frame_indices
    raw = {}
    D.decode_frames(info, clip_indices, D.scaled_size(info.width, info.height, size),
                    lambda i, f: raw.__setitem__(i, f), "pyav")
    return preprocess_frames(np.stack([raw[i] for i in range(len(clip_indices))]), size)


@pytest.mark.parametrize("name", ["16:9", "9:16", "4:3", "10bit"])
@pytest.mark.parametrize("workers", [1, 2])
def test_frames_are_the_pil_paths_byte_for_byte(clips, name, workers):
    path, n, size = clips[name], 13, 56
    ref = _reference(path, n, size)
    clip = load_video(path, num_frames=n, size=size, decode_workers=workers, decoder="pyav")
    assert torch.equal(clip.pixel_values, ref)
    src = open_frames(path, Sampling(n, decoder="pyav"), FrameSpec.square(size),
                      decode_workers=workers)
    for chunk in (1, 5, 16):   # odd chunks: the chunking changes nothing
        got = torch.cat(list(src.chunks(range(n), chunk)))
        assert torch.equal(got, ref), (name, workers, chunk)


def test_repeated_and_partial_positions(clips):
    path, size = clips["16:9"], 32
    src = open_frames(path, Sampling(9, decoder="pyav"), FrameSpec.square(size))
    ref = load_video(path, num_frames=9, size=size).pixel_values
    pos = [1, 1, 4, 7, 8, 8]         # a kept subset; a padded unit repeats its last frame
    got = torch.cat(list(src.chunks(pos, 4)))
    assert torch.equal(got, ref[pos])
    with pytest.raises(ValueError, match="non-decreasing"):
        list(src.chunks([3, 2], 4))


def test_tensor_source_slices_without_copying():
    pv = torch.randn(7, 3, 8, 8)
    src = TensorSource(pv)
    parts = list(src.chunks(range(7), 3))
    assert [p.shape[0] for p in parts] == [3, 3, 1]
    assert parts[0].data_ptr() == pv.data_ptr()          # a view
    assert torch.equal(torch.cat(list(src.chunks([0, 2, 2, 6], 3))), pv[[0, 2, 2, 6]])


def test_jobs_keep_a_gop_whole(clips):
    info = open_video(clips["16:9"])                      # a keyframe every 6 frames
    idx = list(range(0, 40, 2))
    jobs = gop_jobs(info, idx, 4)
    assert [r for j in jobs for r in j] == list(range(len(idx)))
    for a, b in zip(jobs, jobs[1:]):                      # no keyframe on both sides of a cut
        assert int(info.keyframe[idx[a[-1]]]) != int(info.keyframe[idx[b[0]]])


def test_the_window_bounds_the_frames_held(clips):
    info = open_video(clips["16:9"])
    idx = list(range(40))
    s = FrameStream(info, idx, 32, "pyav", workers=2, job_frames=4, window=6)
    try:
        for r in range(len(idx)):
            s.take(r)
            if r == 0:
                threading.Event().wait(0.3)    # let the workers run ahead as far as they may
    finally:
        s.close()
    assert 1 <= s.held_peak <= 6 and s.wall_s is not None
    with FrameStream(info, idx[:4], 32, "pyav") as s2:
        with pytest.raises(ValueError, match="out of order"):
            s2.take(2)


def _workers_alive():
    return [t for t in threading.enumerate() if t.name.startswith("vr-frames-")]


def test_a_failing_worker_stops_the_stream_and_names_the_file(clips, monkeypatch):
    path = clips["4:3"]
    src = open_frames(path, Sampling(30, decoder="pyav"), FrameSpec.square(32),
                      decode_workers=2)
    real = D.decode_frames
    calls = []

    def flaky(info, indices, *a, **k):
        calls.append(indices)
        if len(calls) == 2:
            raise VideoError(f"{info.path}: boom in the second job")
        return real(info, indices, *a, **k)
    monkeypatch.setattr("vr_runtime.video.stream.decode_frames", flaky)
    with pytest.raises(VideoError, match="boom in the second job") as e:
        list(src.chunks(range(30), 4))
    assert path in str(e.value)
    assert not _workers_alive()


def test_closing_mid_way_joins_every_worker(clips):
    src = open_frames(clips["10bit"], Sampling(40, decoder="pyav"), FrameSpec.square(32),
                      decode_workers=2)
    gen = src.chunks(range(40), 4)
    next(gen)
    gen.close()                      # the consumer stops early (an error, a Ctrl-C)
    assert not _workers_alive()


def test_the_stream_memory_check_is_one_line(clips, monkeypatch):
    monkeypatch.setenv("VIDEOROUTER_MEMORY_LIMIT", "1M")
    with pytest.raises(VideoError, match="window of frames"):
        open_frames(clips["16:9"], Sampling(2048))
    monkeypatch.setenv("VIDEOROUTER_MEMORY_LIMIT", "2G")
    # the frame count does not grow what a stream needs (the clip is never held)
    assert isinstance(open_frames(clips["16:9"], Sampling(100_000)), FileSource)


def test_rate_sampling(clips):
    path = clips["16:9"]             # 40 frames at 10 fps: 4 s
    src = open_frames(path, Sampling(fps=2.0))
    assert len(src) == 8 and src.indices[0] == 0 and src.indices[-1] == 39
    assert "2 fps" in src.note
    assert len(open_frames(path, Sampling(fps=0.1))) == 4                  # min_frames
    assert len(open_frames(path, Sampling(fps=10, max_frames=5))) == 5     # max_frames
    w = open_frames(path, Sampling(time_window=(1.0, 3.0), fps=4))
    assert len(w) == 8 and all(1.0 - 1e-6 <= t <= 3.0 for t in w.times_s)
    with pytest.raises(VideoError, match="fps"):
        open_frames(path, Sampling(fps=-1.0))
    with pytest.raises(VideoError, match="min_frames"):
        open_frames(path, Sampling(fps=1.0, min_frames=9, max_frames=3))


def test_mean_and_std_reach_the_stream(clips):
    path = clips["16:9"]
    a = open_frames(path, Sampling(3), FrameSpec.square(24))
    b = open_frames(path, Sampling(3), FrameSpec.square(24, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)))
    x = torch.cat(list(a.chunks(range(3), 3)))
    y = torch.cat(list(b.chunks(range(3), 3)))
    m, s = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    rgb = x * s + m
    torch.testing.assert_close(y, (rgb - 0.5) / 0.25, atol=1e-4, rtol=1e-4)


def test_prefetched_frames_are_the_same_frames(clips):
    """A server decodes a request's first frames before its turn (prefetch), then streams the
    rest: the frames are the same, for every frame or a kept subset, and a prefetch stopped by
    its deadline is one VideoError with nothing left running."""
    path, size = clips["9:16"], 40
    ref = load_video(path, num_frames=20, size=size).pixel_values
    src = open_frames(path, Sampling(20), FrameSpec.square(size), decode_workers=2)
    src.prefetch(6)
    assert src._prefetch.held_peak <= 6
    assert torch.equal(torch.cat(list(src.chunks(range(20), 7))), ref)
    src.prefetch(8)
    pos = [0, 3, 3, 9, 15, 19]
    assert torch.equal(torch.cat(list(src.chunks(pos, 4))), ref[pos])
    with pytest.raises(VideoError, match="given up"):
        open_frames(path, Sampling(20), FrameSpec.square(size)).prefetch(20, lambda: "given up")
    assert not _workers_alive()


@pytest.mark.parametrize("prefetch", [0, 5])
def test_the_source_names_the_decoder_that_delivered(clips, prefetch):
    """``decoder="auto"`` is a request; the report's ``decoder`` is what decoded the frames,
    as the loader's clip says, whether they came from a prefetch or the stream."""
    path, size = clips["4:3"], 32
    want = load_video(path, num_frames=11, size=size).decoder
    src = open_frames(path, Sampling(11), FrameSpec.square(size), decode_workers=2)
    assert src.decoder == "auto"
    if prefetch:
        src.prefetch(prefetch)
    list(src.chunks(range(11), 4))
    assert src.decoder == want and want != "auto"
