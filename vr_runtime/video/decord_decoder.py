"""decord's decoding path, used by ``decoder="auto"`` only where the video corpus tests show it
gives ffmpeg's frames (``DECORD_CODECS`` / ``DECORD_CONTAINERS``).

decord (named by the design) has no AV1 decoder in its bundled FFmpeg, fails on real-time VP9
and animated GIF, returns wrong frames from MPEG-TS and from HEVC when it seeks, mishandles
rotation, and has no aarch64 / Apple-arm64 wheel: it is optional, imported on first use.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import List, Tuple

from ..errors import VideoError
from .probe import OnFrame, VideoIndex, _check_cancel, _orient

__all__ = ["DECORD_CODECS", "DECORD_CONTAINERS", "decode_decord"]

# Codecs and containers for which decord's bundled FFmpeg gives ffmpeg's frames (checked by
# tests/video/test_video_corpus.py). Everything else goes to PyAV: decord has no AV1, fails
# on real-time VP9 and GIF, returns wrong frames from MPEG-TS, and from HEVC when it seeks
# (sparse sampling gave frames up to 255 levels off ffmpeg's).
DECORD_CODECS = frozenset({"h264", "mjpeg"})
DECORD_CONTAINERS = ("mov", "matroska", "avi")

_stderr_lock = threading.Lock()


@contextlib.contextmanager
def _quiet_stderr():
    """Silence C-level writes to fd 2 (decord's and ffmpeg's logging) for the duration.

    fd 2 is process-wide, so this is kept to short calls and serialised."""
    with _stderr_lock:
        try:
            sys.stderr.flush()
        except Exception:  # pragma: no cover - a closed or odd sys.stderr
            pass
        try:
            saved = os.dup(2)
        except OSError:  # pragma: no cover - no fd 2 (e.g. some embedded interpreters)
            yield
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 2)
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(devnull)


def _decord_module():
    try:
        import decord
        return decord
    except Exception:  # not installed (aarch64, Apple arm64) or broken
        return None


def decode_decord(info: VideoIndex, indices: List[int], scale: Tuple[int, int],
                  on_frame: OnFrame) -> None:
    """decord's backend of :func:`vr_runtime.video.decoders.decode_frames` (in order, a few
    frames a call); refuses rotated videos and files whose frame count differs from the
    probe's."""
    decord = _decord_module()
    if decord is None:
        raise VideoError("decoder 'decord' is not installed here; use --decoder pyav")
    try:
        decord.logging.set_level(decord.logging.QUIET)
    except Exception:  # pragma: no cover - older decord without the logging module
        pass
    if info.rotation:
        # decord applies (part of) the display matrix itself, and its frames then differ
        # from ffmpeg's; PyAV's match.
        raise VideoError(f"{info.path}: decord does not decode rotated videos correctly; use "
                         f"--decoder pyav (or auto)")
    w, h = scale
    kw = {} if (w, h) == (info.width, info.height) else {"width": w, "height": h}
    with _quiet_stderr():
        vr = decord.VideoReader(info.open_path, ctx=decord.cpu(0), **kw)
    if len(vr) != info.num_frames:
        # decord's frame list disagrees with the demuxer's (dropped or merged packets): its
        # frame i would not be ours.
        raise VideoError(f"{info.path}: decord sees {len(vr)} frames, the demuxer "
                         f"{info.num_frames}")
    chunk = 4  # a few frames per call: decord's batches are full arrays
    for s in range(0, len(indices), chunk):
        _check_cancel(info.path)
        part = indices[s:s + chunk]
        with _quiet_stderr():
            frames = vr.get_batch(part).asnumpy()
        for j, f in enumerate(frames):
            on_frame(s + j, _orient(f, info.rotation))
