"""torchcodec's NVDEC path (vr_runtime.video.torchcodec_decoder): where ``auto`` picks it, what
it says when it is missing, and its frames against PyAV's (CPU where torchcodec loads; CUDA
under ``-m gpu``)."""
import shutil
import subprocess

import numpy as np
import pytest
import torch

from vr_runtime.errors import VideoError
from vr_runtime.video import decoders, torchcodec_decoder
from vr_runtime.video.load import open_video

import video_corpus  # noqa: E402  (tests/video: the rotated H.264 clip)

HAS_TC = torchcodec_decoder.torchcodec_module() is not None
needs_ffmpeg = pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="needs ffmpeg")


def _clip(path, rotate=False):
    if rotate:   # PyAV writes the display matrix (Debian's ffmpeg 5.1 cannot)
        video_corpus._write_rotated(str(path), 160, 96, 25, 80)
        return str(path)
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i",
                    "testsrc2=size=160x96:rate=25:duration=3", "-c:v", "libx264", "-pix_fmt",
                    "yuv420p", "-g", "30", str(path)], check=True)
    return str(path)


def _frames(info, indices, decoder, device="cpu"):
    got = {}
    scale = decoders.scaled_size(info.width, info.height, 448)
    used = decoders.decode_frames(info, indices, scale, got.__setitem__, decoder, device=device)
    return used, [np.asarray(got[i]) for i in range(len(indices))]


def _index(codec="h264", rotation=0, bits=8):
    return decoders.VideoIndex(path="x.mp4", container="mov,mp4", codec=codec, width=64,
                               height=48, rotation=rotation, pts=np.arange(4),
                               time_base=0.04, start=0, keyframe=np.zeros(4, dtype=np.int64),
                               has_pts=True, fps=25.0, declared_s=0.16, bits=bits)


def test_auto_keeps_the_cpu_choice_on_cpu(monkeypatch):
    monkeypatch.setattr(decoders, "nvdec_available", lambda codec: True)
    assert "torchcodec" not in decoders._candidates(_index(), "auto", 1, "cpu")
    assert "torchcodec" not in decoders._candidates(_index(), "auto", 4)


def test_auto_picks_nvdec_on_cuda_for_its_codecs_only(monkeypatch):
    monkeypatch.setattr(decoders, "nvdec_available",
                        lambda codec: codec in torchcodec_decoder.NVDEC_CODECS)
    assert decoders._candidates(_index(), "auto", 1, "cuda") == ["torchcodec", "pyav"]
    assert decoders._candidates(_index(), "auto", 8, "cuda:0")[0] == "torchcodec"
    assert "torchcodec" not in decoders._candidates(_index("mpeg4"), "auto", 1, "cuda")
    assert "torchcodec" not in decoders._candidates(_index(bits=12), "auto", 1, "cuda")


def test_nvdec_needs_cuda_and_torchcodec(monkeypatch):
    assert not torchcodec_decoder.nvdec_available("mpeg4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not torchcodec_decoder.nvdec_available("h264")


def test_display_size_follows_the_rotation():
    assert torchcodec_decoder._display_hw(_index(rotation=0), (64, 48)) == (48, 64)
    assert torchcodec_decoder._display_hw(_index(rotation=90), (64, 48)) == (64, 48)
    assert torchcodec_decoder._display_hw(_index(rotation=270), (64, 48)) == (64, 48)


@pytest.mark.skipif(HAS_TC, reason="torchcodec loads here")
def test_missing_torchcodec_is_one_clear_line():
    assert "torchcodec" in decoders.DECODERS and "torchcodec" not in decoders.available_decoders()
    with pytest.raises(VideoError, match="not installed here.*--decoder auto or pyav") as e:
        decoders.resolve_decoder("torchcodec")
    assert "\n" not in str(e.value)
    with pytest.raises(VideoError, match="use --decoder auto or pyav"):
        torchcodec_decoder.decode_torchcodec(_index(), [0], (64, 48), lambda i, f: None)


def _compare(tmp_path, device, rotate=False):
    info = open_video(_clip(tmp_path / "c.mp4", rotate=rotate))
    idx = [0, 7, 31, 52, 74]
    used, tc = _frames(info, idx, "torchcodec", device)
    _, ref = _frames(info, idx, "pyav")
    assert used == "torchcodec"
    for n, (a, b) in enumerate(zip(tc, ref)):
        assert a.dtype == np.uint8 and a.shape == b.shape, (n, a.shape, b.shape)
        # bilinear (torchcodec) against area (PyAV) scaling: close, and closer to its own
        # frame than to the next one sampled (the right frame, not a neighbour)
        diff = np.abs(a.astype(np.int16) - b).mean()
        assert diff < 8.0, (n, diff)
        if n + 1 < len(ref):
            assert diff < np.abs(a.astype(np.int16) - ref[n + 1]).mean(), n


@needs_ffmpeg
@pytest.mark.skipif(not HAS_TC, reason="torchcodec is not installed here (or needs CUDA torch)")
def test_cpu_frames_match_pyav(tmp_path):
    _compare(tmp_path, "cpu")


@pytest.mark.gpu
@needs_ffmpeg
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.skipif(not HAS_TC, reason="torchcodec is not installed (docs/video-input.md)")
@pytest.mark.parametrize("rotate", [False, True])
def test_nvdec_frames_match_pyav(tmp_path, rotate):
    _compare(tmp_path, "cuda", rotate)


@pytest.mark.gpu
@needs_ffmpeg
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.skipif(not HAS_TC, reason="torchcodec is not installed (docs/video-input.md)")
def test_auto_on_cuda_uses_nvdec_and_frames_stay_on_the_gpu(tmp_path):
    info = open_video(_clip(tmp_path / "c.mp4"))
    used, _ = _frames(info, [0, 40], "auto", "cuda")
    assert used == "torchcodec"
    got = []
    torchcodec_decoder.decode_torchcodec(info, [3], (80, 48), lambda i, f: got.append(f),
                                         device="cuda", as_tensor=True)
    assert got[0].is_cuda and tuple(got[0].shape) == (48, 80, 3)
