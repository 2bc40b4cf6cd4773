"""Video decoding backends: one probe (PyAV, :mod:`.probe`) that indexes a file, and
interchangeable decoders (:mod:`.pyav_decoder`, :mod:`.decord_decoder`,
:mod:`.torchcodec_decoder`) that turn a list of frame indices into small RGB frames. This module chooses the decoder for a file and dispatches
to it (:func:`decode_frames`); it re-exports the probe's names.

Why a layer: no single library decodes everything users hand over. decord (named by the
design) has no AV1 decoder in its bundled FFmpeg, fails on real-time VP9 and animated GIF,
returns wrong frames from MPEG-TS and from HEVC when it seeks, mishandles rotation, and has no
aarch64 / Apple-arm64 wheel. PyAV (always installed) ships an FFmpeg with every common decoder
(dav1d for AV1). ``decoder="auto"`` uses decord only where the corpus tests show it gives
ffmpeg's frames (``DECORD_CODECS`` / ``DECORD_CONTAINERS``), when it is installed, and PyAV for
everything else and as the fallback whenever decord fails on a file. On a CUDA device
(``device="cuda"``) ``auto`` first tries torchcodec's NVDEC where it is installed and NVDEC
has the codec (``NVDEC_CODECS``), so decoding leaves the host's cores free; on CPU nothing
changes.

Frames are decoded straight to a reduced resolution (``scaled_size``: each side capped at
twice the model's input size) by the decoder's scaler, one frame at a time, so a 4K file holds
no full-resolution RGB frames (bench/results/video_cpu.md: 32 frames of 4K cost ~0.1 GB more
than of 448p). Rotation metadata (phone videos) is applied, as ffmpeg does by default.
"""
from __future__ import annotations

import threading
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..errors import VideoError
from .decord_decoder import DECORD_CODECS, DECORD_CONTAINERS, _decord_module, decode_decord
from .probe import (Limits, OnFrame, VideoIndex, _clean_reason, cancel_scope, limits, probe,
                    scaled_size, set_limits)
from .pyav_decoder import decode_pyav, split_by_gop
from .torchcodec_decoder import decode_torchcodec, nvdec_available, torchcodec_module
from .workers import default_workers, resolve_workers

__all__ = ["VideoIndex", "probe", "decode_frames", "DECODERS", "available_decoders",
           "scaled_size", "resolve_decoder", "Limits", "limits", "set_limits", "cancel_scope",
           "SEEKS", "resolve_seek", "keyframe_indices", "default_workers", "resolve_workers",
           "split_by_gop"]

DECODERS = ("auto", "pyav", "decord", "torchcodec")
# How sampled times become frames: "exact" decodes the sampled frame itself (InternVL's
# sampling, the paper's setting); "keyframe" takes the keyframe nearest each sampled time and
# decodes only it (one frame a sample; at most half a GOP from the exact frame).
SEEKS = ("exact", "keyframe")


def available_decoders() -> List[str]:
    """Backends that can be imported here (PyAV always: it is a core dependency)."""
    out = ["pyav"]
    if _decord_module() is not None:
        out.append("decord")
    if torchcodec_module() is not None:
        out.append("torchcodec")
    return out


def resolve_decoder(decoder: str) -> str:
    """Check a ``decoder=`` / ``--decoder`` value."""
    if decoder not in DECODERS:
        raise VideoError(f"decoder: expected one of {', '.join(DECODERS)}, got {decoder!r}")
    if decoder == "decord" and _decord_module() is None:
        raise VideoError("decoder 'decord' is not installed here (it has no wheel for this "
                         "platform); use --decoder auto or pyav")
    if decoder == "torchcodec" and torchcodec_module() is None:
        raise VideoError("decoder 'torchcodec' is not installed here, or does not load (it "
                         "needs a CUDA PyTorch and FFmpeg's shared libraries; docs/video-input.md "
                         "lists the wheels); use --decoder auto or pyav")
    return decoder


def resolve_seek(seek: str) -> str:
    """Check a ``seek=`` / ``--seek`` value."""
    if seek not in SEEKS:
        raise VideoError(f"seek: expected one of {', '.join(SEEKS)}, got {seek!r}")
    return seek


def keyframe_indices(info: VideoIndex, indices: Sequence[int]) -> List[int]:
    """For ``seek="keyframe"``: the keyframe nearest in time to each sampled frame (the one
    before it on a tie), distinct and increasing. Samples that share their nearest keyframe
    give one frame, so the result may be shorter. A keyframe is at most half a GOP (half the
    keyframe interval) from its sample. Files without timestamps have no keyframe index: their
    samples are returned unchanged (decoded exactly)."""
    idx = [int(k) for k in indices]
    if not info.has_pts or not idx:
        return idx
    keys = np.unique(info.keyframe)
    t = info.pts_s
    out = set()
    for k in idx:
        j = int(np.searchsorted(keys, k, side="right")) - 1   # the keyframe at or before k
        best = int(keys[max(j, 0)])
        if j + 1 < keys.size:
            nxt = int(keys[j + 1])
            if abs(t[nxt] - t[k]) < abs(t[k] - t[best]):
                best = nxt
        out.add(best)
    return sorted(out)


def _candidates(info: VideoIndex, decoder: str, workers: int = 1,
                device: str = "cpu") -> List[str]:
    if decoder != "auto":
        return [decoder]
    # On a GPU, NVDEC first: it takes the decode off the host's cores (PyAV stays the fallback).
    if (device.startswith("cuda") and info.has_pts and info.bits <= 10
            and nvdec_available(info.codec)):
        return ["torchcodec", "pyav"]
    # Several workers: PyAV's parallel decode (decord indexes the whole file per reader and
    # decodes one GOP at a time).
    if workers > 1 and info.has_pts:
        return ["pyav"]
    if (info.codec in DECORD_CODECS and info.container.startswith(DECORD_CONTAINERS)
            and info.has_pts and not info.rotation and _decord_module() is not None):
        return ["decord", "pyav"]
    return ["pyav"]


def decode_frames(info: VideoIndex, indices: Sequence[int], scale: Tuple[int, int],
                  on_frame: OnFrame, decoder: str = "auto", workers: int = 1,
                  seek: str = "exact", device: str = "cpu") -> str:
    """Decode frames ``indices`` (increasing, distinct) of ``info`` as uint8 RGB scaled to
    ``scale`` = (width, height) of the coded frame and rotated for display, calling
    ``on_frame(position_in_indices, frame)`` for each. Returns the backend used.

    With one worker the calls come in order, from the calling thread. With ``workers`` > 1
    (PyAV) the indices are split by GOP (:func:`split_by_gop`) over that many threads, each
    with its own demuxer and decoder: ``on_frame`` is then called from those threads (one call
    at a time) and out of order, and a position may be delivered again if decoding had to
    restart. ``seek="keyframe"``: ``indices`` are keyframes (:func:`keyframe_indices`) and only
    keyframes are decoded.

    With ``decoder="auto"`` a backend that fails before delivering a frame is replaced by the
    next; an explicit backend's failure is the user's answer. ``device``: where the frames are
    going ("cuda": ``auto`` may use NVDEC, :mod:`.torchcodec_decoder`); an explicit
    ``torchcodec`` decodes on CUDA where there is one, else on the CPU."""
    resolve_seek(seek)
    workers = max(1, int(workers))
    cands = _candidates(info, decoder, workers if seek == "exact" else 2, device)
    last: Optional[BaseException] = None
    for name in cands:
        delivered = [0]
        lock = threading.Lock()

        def counted(i, f, _d=delivered, _lock=lock):
            with _lock:
                _d[0] += 1
                on_frame(i, f)
        try:
            if name == "pyav":
                decode_pyav(info, list(indices), scale, counted, workers=workers, seek=seek)
            else:
                _BACKENDS[name](info, list(indices), scale, counted)
            return name
        except VideoError as e:
            last = e
            if delivered[0] or name == cands[-1]:
                raise
        except Exception as e:  # a backend's own error types (decord.DECORDError, ...)
            last = e
            if delivered[0] or name == cands[-1]:
                raise VideoError(f"{info.path}: decoding the {info.codec_name} video with "
                                 f"{name} failed; the file is corrupt or truncated "
                                 f"({_clean_reason(e)})") from None
    raise VideoError(f"{info.path}: cannot decode the video ({_clean_reason(last)})")


_BACKENDS = {"pyav": decode_pyav, "decord": decode_decord, "torchcodec": decode_torchcodec}
