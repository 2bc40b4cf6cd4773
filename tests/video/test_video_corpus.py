"""Real-world video input: a corpus made by ffmpeg at test time (tests/video/video_corpus.py)
decoded through vr_runtime.video.decoders / vr_runtime.video.load, checked against ffmpeg's own decode.

Tolerances (stated once, here):
* timestamps: within 1 ms of ffprobe's ``best_effort_timestamp_time - start_time``;
* frames at full resolution, 8-bit sources: at most 2 grey levels from ffmpeg's
  ``-pix_fmt rgb24`` output (both sides are the same FFmpeg decoders; measured: identical);
* 10-bit sources: mean abs difference <= 5 levels and each frame's mean within 2 levels (the
  10 -> 8-bit RGB conversion of Debian's swscale 5.1 and of PyAV's bundled one round and
  upsample chroma differently at colour edges; the decoded pictures themselves agree);
* the whole pipeline against InternVL's transform (PIL bicubic) on ffmpeg's frames, after
  undoing the normalisation: mean abs difference <= 0.5 levels where no reduction happens
  (5 for 10-bit, as above), and <= 1.5 levels when a 1280x720 source is decoded at the reduced
  resolution (896x720 for 448x448) before PIL's resize.

ffmpeg (Debian package ``ffmpeg``) is required: without it these tests fail, loudly, rather than
skip; CI installs it (.ci/run).
"""

import threading

import numpy as np
import pytest
import torch

import video_corpus as vc
from vr_runtime.video import decoders as D
from vr_runtime.video import probe as video_probe
from vr_runtime.video import pyav_decoder
from vr_runtime.video import workers as video_workers
from vr_runtime.errors import VideoError
from vr_runtime.video.load import (IMAGENET_MEAN, IMAGENET_STD, load_video, open_video,
                              preprocess_frames, prefetch_video, sample_indices)

TIME_TOL = 1e-3


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    if not vc.ffmpeg_available():
        pytest.fail("ffmpeg/ffprobe not found: the video corpus tests need the Debian 'ffmpeg' "
                    "package (apt-get install ffmpeg); CI installs it in .ci/run")
    return vc.make_corpus(tmp_path_factory.mktemp("corpus"))


_refs = {}


def ref(case):
    if case.path not in _refs:
        _refs[case.path] = vc.reference(case.path)
    return _refs[case.path]


def decode_native(info, indices, decoder, workers=1, seek="exact"):
    got = {}
    used = D.decode_frames(info, indices, (info.width, info.height),
                           lambda i, f: got.__setitem__(i, f), decoder, workers=workers,
                           seek=seek)
    assert sorted(got) == list(range(len(indices)))
    return np.stack([got[i] for i in range(len(indices))]), used


def sampled(n):
    """InternVL's 6-frame sample plus the first and last frame: exercises seeking."""
    return sorted(set(sample_indices(n, 6, 1.0)) | {0, n - 1})


def denorm(pixels):
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (pixels * std + mean) * 255.0


CASES = list(vc.SPECS)


@pytest.mark.parametrize("name", CASES)
def test_probe_matches_ffprobe(corpus, name):
    case = corpus[name]
    frames, times = ref(case)
    info = open_video(case.path)
    assert info.codec == case.codec
    assert info.display_size == (case.width, case.height) == (frames.shape[2], frames.shape[1])
    assert info.num_frames == len(frames), (info.num_frames, len(frames))
    if name in ("h264_avi", "raw_h264"):
        # No presentation times in the file (ffprobe reports some or all as N/A): frame i is
        # shown at i / fps, as ffmpeg's constant-rate output has it.
        assert not info.has_pts
        np.testing.assert_allclose(info.pts_s, np.arange(len(frames)) / info.fps, atol=TIME_TOL)
        # the rate ffprobe reports: AVI's header, the H.264 stream's timing info
        assert info.fps == pytest.approx(10.0)
        return
    assert len(times) == len(frames)
    np.testing.assert_allclose(info.pts_s, times, atol=TIME_TOL, rtol=0)


@pytest.mark.parametrize("name", CASES)
def test_frames_match_ffmpeg(corpus, name):
    case = corpus[name]
    frames, _ = ref(case)
    info = open_video(case.path)
    idx = sampled(info.num_frames)
    backends = ["pyav"] + (["decord"] if case.decord and "decord" in D.available_decoders()
                           else [])
    for backend in backends:
        ours, used = decode_native(info, idx, backend)
        assert used == backend
        want = frames[idx].astype(np.int16)
        diff = np.abs(ours.astype(np.int16) - want)
        if info.bits > 8:
            assert diff.mean() <= 5.0, (backend, diff.mean())
            per_frame = np.abs(ours.reshape(len(idx), -1).mean(1) - want.reshape(len(idx), -1).mean(1))
            assert per_frame.max() <= 2.0, (backend, per_frame)
        else:
            assert diff.max() <= 2, (backend, diff.max(), diff.mean())


@pytest.mark.parametrize("name", ["h264", "av1", "vp9_realtime", "gif", "rotated", "mpeg2_ts",
                                  "odd_size", "ten_bit", "h264_avi", "raw_h264"])
def test_pipeline_matches_ffmpeg_then_pil(corpus, name):
    """load_video vs InternVL's transform (PIL bicubic) applied to ffmpeg's frames. At size 100
    no source here is reduced before the resize, so this checks frame choice, times and the
    transform exactly."""
    case = corpus[name]
    frames, times = ref(case)
    size = 100
    clip = load_video(case.path, num_frames=5, size=size)
    assert clip.codec == case.codec and clip.pixel_values.shape[1:] == (3, size, size)
    assert clip.frame_indices == sample_indices(len(frames), 5, clip.fps)
    if len(times) == len(frames):
        np.testing.assert_allclose(clip.timestamps_s, times[clip.frame_indices], atol=TIME_TOL)
    want = preprocess_frames(frames[clip.frame_indices], size)
    diff = (denorm(clip.pixel_values) - denorm(want)).abs()
    assert diff.mean() <= (5.0 if clip.codec == "hevc" else 0.5), diff.mean()


def test_reduced_resolution_decode(tmp_path):
    """A 1280x720 source for 448x448 is decoded at 896x720 (each side capped at 2 x 448) and
    then resized by PIL: within 1.5 grey levels (mean) of PIL on the full frames."""
    path = str(tmp_path / "hd.mp4")
    vc._run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i",
             vc.SRC.format(w=1280, h=720, r=10, d=0.3), "-c:v", "libx264", "-preset",
             "ultrafast", "-crf", "18", path])
    frames, _ = vc.reference(path)
    assert D.scaled_size(1280, 720, 448) == (896, 720)
    for decoder in ["pyav"] + (["decord"] if "decord" in D.available_decoders() else []):
        clip = load_video(path, num_frames=3, decoder=decoder)
        want = preprocess_frames(frames[clip.frame_indices], 448)
        diff = (denorm(clip.pixel_values) - denorm(want)).abs().mean()
        assert diff <= 1.5, (decoder, diff)


def test_auto_picks_a_working_backend(corpus):
    # AV1, VP9, VP8, GIF, ProRes, MPEG-TS: never decord (which fails or is wrong on them)
    for name in ("av1", "vp9_realtime", "vp8", "gif", "prores", "mpeg2_ts", "hevc"):
        assert load_video(corpus[name].path, num_frames=2, size=16).decoder == "pyav", name
    want = "decord" if "decord" in D.available_decoders() else "pyav"
    assert load_video(corpus["h264"].path, num_frames=2, size=16,
                      decode_workers=1).decoder == want
    # parallel exact decoding (several workers) and keyframe seeking are PyAV's
    assert load_video(corpus["h264"].path, num_frames=2, size=16,
                      decode_workers=2).decoder == "pyav"
    assert load_video(corpus["h264"].path, num_frames=2, size=16, decode_workers=1,
                      seek="keyframe").decoder == "pyav"
    # explicit choice is honoured
    assert load_video(corpus["h264"].path, num_frames=2, size=16, decoder="pyav").decoder == "pyav"
    with pytest.raises(VideoError, match="decoder"):
        load_video(corpus["h264"].path, num_frames=2, decoder="ffmpeg")


def test_auto_falls_back_when_decord_fails(corpus, monkeypatch):
    def broken(info, indices, scale, on_frame):
        raise RuntimeError("[12:00:00] /home/build/decord/src/video/video_reader.cc:151: boom")
    monkeypatch.setitem(D._BACKENDS, "decord", broken)
    monkeypatch.setattr(D, "_decord_module", lambda: object())
    clip = load_video(corpus["h264"].path, num_frames=4, size=16, decode_workers=1)
    assert clip.decoder == "pyav"
    with pytest.raises(VideoError) as e:  # an explicit decord: its error, without its path
        load_video(corpus["h264"].path, num_frames=4, size=16, decoder="decord")
    assert "boom" in str(e.value) and ".cc" not in str(e.value) and "/home" not in str(e.value)


def test_undecodable_codec_is_one_line_naming_it(corpus, monkeypatch):
    monkeypatch.setattr(video_probe, "_has_decoder", lambda codec: codec != "av1")
    with pytest.raises(VideoError) as e:
        load_video(corpus["av1"].path, num_frames=4)
    msg = str(e.value)
    assert "AV1" in msg and "re-encode" in msg and "\n" not in msg


def test_vfr_times_and_time_window(corpus):
    """20 fps for 1 s, then 5 fps: real times, and a window that is the right seconds."""
    case = corpus["vfr"]
    _, times = ref(case)
    clip = load_video(case.path, num_frames=8, size=16)
    np.testing.assert_allclose(clip.timestamps_s, times[clip.frame_indices], atol=TIME_TOL)
    # index / mean fps would put frame 25 at 2.37 s; it is shown at 2.0 s
    assert abs(open_video(case.path).pts_s[25] - 2.0) < TIME_TOL
    for window in [(0.0, 0.5), (1.0, 2.9), (2.1, 2.9), (0.4, 1.6)]:
        clip = load_video(case.path, num_frames=4, size=16, time_window=window)
        ts = np.array(clip.timestamps_s)
        assert len(ts) == 4 and np.all(np.diff(ts) > 0)
        # every frame is on screen inside the window (shown at or before its end, and still
        # shown at its start)
        nxt = [times[i + 1] if i + 1 < len(times) else 1e9 for i in clip.frame_indices]
        assert np.all(ts <= window[1] + TIME_TOL) and np.all(np.array(nxt) > window[0])
    # sampled by time: in (0.4, 1.6) s the picks are spread over the window, not bunched in the
    # dense first second as index sampling would do
    clip = load_video(case.path, num_frames=4, size=16, time_window=(0.4, 1.6))
    assert clip.timestamps_s[-1] >= 1.2


def test_truncated_file_decodes_the_surviving_part(corpus):
    case = corpus["truncated_mkv"]
    frames, times = ref(case)
    clip = load_video(case.path, num_frames=64, size=16)
    assert clip.total_frames == len(frames) and "truncated" in clip.note
    np.testing.assert_allclose(clip.timestamps_s, times, atol=TIME_TOL)


def test_one_frame(corpus):
    clip = prefetch_video(corpus["one_frame"].path, num_frames=8, size=16).result(timeout=60)
    assert clip.frame_indices == [0] and clip.timestamps_s == [0.0] and "1 frame" in clip.note


def test_memory_refused_before_decoding(corpus, monkeypatch):
    path = corpus["h264"].path
    info = open_video(path)
    from vr_runtime.video.load import estimate_memory
    limit = estimate_memory(10, 448, info.width, info.height) + 1
    with pytest.raises(VideoError) as e:
        prefetch_video(path, num_frames=30, memory_limit=limit)
    msg = str(e.value)
    assert "at most 10 frames" in msg and "--frames 10" in msg and "\n" not in msg
    clip = load_video(path, num_frames=10, memory_limit=limit)  # the advice fits
    assert clip.num_frames == 10
    # the estimate covers what the clip really holds
    assert clip.pixel_values.nbytes <= estimate_memory(10, 448, info.width, info.height)
    monkeypatch.setenv("VIDEOROUTER_MEMORY_LIMIT", "1M")
    with pytest.raises(VideoError, match="need about"):
        load_video(path, num_frames=30)
    # far beyond any machine: refused with the machine's own free memory
    monkeypatch.delenv("VIDEOROUTER_MEMORY_LIMIT")
    with pytest.raises(VideoError, match="need about"):
        load_video(path, num_frames=30, size=200_000)


def test_mean_std_and_size_parameters(corpus):
    path = corpus["h264"].path
    a = load_video(path, num_frames=3, size=24)
    mean, std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
    b = load_video(path, num_frames=3, size=24, mean=mean, std=std)
    rgb = denorm(a.pixel_values) / 255.0
    want = (rgb - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    torch.testing.assert_close(b.pixel_values, want, atol=1e-4, rtol=1e-4)
    with pytest.raises(VideoError, match="std"):
        load_video(path, num_frames=3, std=(0.0, 1.0, 1.0))


def test_without_decord(corpus, monkeypatch):
    """Where decord has no wheel (aarch64, Apple arm64) PyAV decodes everything."""
    monkeypatch.setattr(D, "_decord_module", lambda: None)
    assert D.available_decoders() == ["pyav"]
    clip = load_video(corpus["h264"].path, num_frames=4, size=16)
    assert clip.decoder == "pyav" and clip.num_frames == 4
    with pytest.raises(VideoError, match="not installed"):
        load_video(corpus["h264"].path, num_frames=4, decoder="decord")


# ----------------------------------------------------------------------------- seek, workers

@pytest.mark.parametrize("name", ["h264", "h264_bframes_mkv", "hevc", "mpeg2_ts"])
def test_keyframe_seek_matches_ffprobe_keyframes(corpus, name):
    """seek="keyframe": each frame used is one of ffprobe's keyframes (-skip_frame nokey), the
    one nearest a sampled time, reported at its own time, with ffmpeg's pixels."""
    case = corpus[name]
    frames, times = ref(case)
    info = open_video(case.path)
    kt = vc.keyframe_times(case.path)
    assert len(kt) >= 2, "the corpus file should have several GOPs"
    exact = sample_indices(info.num_frames, 8, info.fps)
    clip = load_video(case.path, num_frames=8, size=100, seek="keyframe")
    assert clip.seek == "keyframe" and clip.decoder == "pyav"
    got = np.asarray(clip.timestamps_s)
    np.testing.assert_allclose(got, times[clip.frame_indices], atol=TIME_TOL, rtol=0)
    for t in got:
        assert np.abs(kt - t).min() <= TIME_TOL, (t, kt)
    for k in exact:
        near = kt[np.argmin(np.abs(kt - times[k]))]
        assert np.abs(got - near).min() <= TIME_TOL
        # at most half the interval between the keyframes around the sample
        before, after = kt[kt <= times[k] + TIME_TOL], kt[kt > times[k] + TIME_TOL]
        if len(before) and len(after):
            assert abs(near - times[k]) <= (after[0] - before[-1]) / 2 + TIME_TOL
    ours, _ = decode_native(info, clip.frame_indices, "pyav", seek="keyframe")
    diff = np.abs(ours.astype(np.int16) - frames[clip.frame_indices].astype(np.int16))
    assert diff.max() <= 2, diff.max()
    two, _ = decode_native(info, clip.frame_indices, "pyav", workers=2, seek="keyframe")
    assert np.array_equal(ours, two)


@pytest.mark.parametrize("name", ["h264_bframes_mkv", "hevc", "av1", "vp9_realtime", "vp8",
                                  "mpeg2_ts", "vfr", "ten_bit"])
def test_parallel_workers_give_identical_frames(corpus, name):
    """1, 2 and 3 workers (split by GOP, non-reference frames skipped) give the same bytes,
    and those are ffmpeg's frames."""
    case = corpus[name]
    frames, _ = ref(case)
    info = open_video(case.path)
    idx = sample_indices(info.num_frames, 12, info.fps)
    outs = [decode_native(info, idx, "pyav", workers=w)[0] for w in (1, 2, 3)]
    for o in outs[1:]:
        assert np.array_equal(outs[0], o)
    diff = np.abs(outs[0].astype(np.int16) - frames[idx].astype(np.int16))
    assert (diff.mean() <= 5.0) if info.bits > 8 else (diff.max() <= 2), diff.max()
    # shares are contiguous, and frames that share a keyframe share a worker
    shares = D.split_by_gop(info, idx, 3)
    assert [p for s in shares for p in s] == list(range(len(idx)))
    owner = {p: i for i, s in enumerate(shares) for p in s}
    for a in range(len(idx) - 1):
        if info.keyframe[idx[a]] == info.keyframe[idx[a + 1]]:
            assert owner[a] == owner[a + 1]


def test_load_video_workers_and_memory(corpus, monkeypatch):
    from vr_runtime.video.load import estimate_memory
    path = corpus["h264_bframes_mkv"].path
    clips = [load_video(path, num_frames=10, size=32, decoder="pyav", decode_workers=w)
             for w in (1, 3)]
    assert torch.equal(clips[0].pixel_values, clips[1].pixel_values)
    assert clips[1].decode_workers == 3 and clips[1].seek == "exact"
    e1, e3 = (estimate_memory(10, 448, 1920, 1080, workers=w) for w in (1, 3))
    assert e3 > e1 + 2 * 32 * 1920 * 1080   # each worker's decoder frames are counted
    # memory for one decoder, not three: fewer workers, not a refusal
    info = open_video(path)
    one = estimate_memory(10, 32, info.width, info.height, info.bits, 1)
    clip = load_video(path, num_frames=10, size=32, decode_workers=3, memory_limit=one)
    assert clip.decode_workers == 1
    with pytest.raises(VideoError, match="decode_workers"):
        load_video(path, num_frames=2, decode_workers=0)
    with pytest.raises(VideoError, match="seek"):
        load_video(path, num_frames=2, seek="nearest")
    from vr_runtime.request import AnswerOptions
    assert AnswerOptions(seek="keyframe").seek == "keyframe"
    with pytest.raises(ValueError, match="seek"):
        AnswerOptions(seek="nearest")


def test_a_dying_worker_is_one_line_and_no_thread_is_left(corpus, monkeypatch):
    case = corpus["h264_bframes_mkv"]
    info = open_video(case.path)
    idx = sample_indices(info.num_frames, 12, info.fps)
    real = pyav_decoder._pyav_by_pts

    def dies_on_its_second_share(holder, info, indices, rgb, on_frame, **kw):
        if kw.get("positions") and kw["positions"][0] > 0:
            raise MemoryError("out of memory")
        return real(holder, info, indices, rgb, on_frame, **kw)
    monkeypatch.setattr(pyav_decoder, "_pyav_by_pts", dies_on_its_second_share)
    before = threading.active_count()
    with pytest.raises(VideoError) as e:
        decode_native(info, idx, "pyav", workers=2)
    msg = str(e.value)
    assert msg.startswith(case.path) and "\n" not in msg and "worker" in msg, msg
    assert threading.active_count() == before
    assert not [t for t in threading.enumerate() if t.name.startswith("vr-decode-")]
    monkeypatch.setattr(pyav_decoder, "_pyav_by_pts", real)
    # a deadline reaches every worker
    with D.cancel_scope(lambda: "deadline passed"), pytest.raises(VideoError, match="deadline"):
        decode_native(info, idx, "pyav", workers=2)
    assert threading.active_count() == before


def test_default_workers_follow_affinity_and_cgroup(tmp_path, monkeypatch):
    monkeypatch.setattr(video_workers.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    cpu_max = tmp_path / "cpu.max"
    monkeypatch.setattr(video_workers, "_CGROUP_CPU_FILES", ((str(cpu_max), None),))
    cpu_max.write_text("max 100000\n")
    assert D.default_workers() == 8
    cpu_max.write_text("250000 100000\n")        # docker --cpus 2.5
    assert D.default_workers() == 3
    cpu_max.write_text("50000 100000\n")
    assert D.default_workers() == 1
