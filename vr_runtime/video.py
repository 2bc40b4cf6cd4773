"""Video input (SPEC section 3): decord decoding, InternVL's frame sampling, 448x448 ImageNet
preprocessing, and a background prefetch so decoding overlaps model loading.

Sampling follows InternVL's published ``load_video`` / ``get_index``: the clip (or the time
window) is cut into T equal segments over the frame indices ``start_idx .. end_idx`` and the
middle frame of each is taken::

    seg_size = (end_idx - start_idx) / T
    idx_i    = start_idx + int(seg_size / 2 + round(seg_size * i))

A clip with fewer frames than asked for yields all of them, and ``VideoClip.note`` says so.

Bad inputs raise :class:`~vr_runtime.errors.VideoError` with one clear message. The file is
probed with PyAV first (quiet, raises Python exceptions) so that images, text, audio-only and
unparseable files never reach decord, which prints ffmpeg noise to stderr and fails with less
helpful errors on such inputs.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import math
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from .errors import VideoError

__all__ = ["VideoClip", "load_video", "sample_indices", "prefetch_video", "open_video",
           "preprocess_frames", "IMAGENET_MEAN", "IMAGENET_STD"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# Frames decoded per decord call. Bounds peak host memory on high-resolution sources (64 raw
# 1080p frames are ~400 MB of uint8) and gives the progress bar its steps.
CHUNK = 8

_stderr_lock = threading.Lock()


@dataclass
class VideoClip:
    """Sampled, preprocessed frames of one video."""
    pixel_values: torch.Tensor          # float32 [T, 3, size, size], ImageNet-normalised
    frame_indices: List[int]            # source frame numbers, increasing
    timestamps_s: List[float]           # frame_indices / fps
    fps: float
    total_frames: int
    requested: int                      # frames asked for (T actually used may be fewer)
    note: Optional[str] = None          # e.g. "the video has 20 frames; 64 were asked for"
    path: Optional[str] = None
    decode_s: float = 0.0               # wall time spent decoding + preprocessing

    @property
    def num_frames(self) -> int:
        return len(self.frame_indices)


# ----------------------------------------------------------------------------- sampling

def sample_indices(total_frames: int, num_frames: int, fps: float,
                   time_window: Optional[Tuple[float, float]] = None) -> List[int]:
    """InternVL's ``get_index``: the middle frame of each of ``num_frames`` equal segments of
    ``[start_idx, end_idx]`` (the whole clip, or ``time_window`` in seconds).

    If the range holds fewer than ``num_frames`` frames, every frame in it is returned (so
    the result may be shorter than ``num_frames``). Indices are increasing and lie in
    ``[start_idx, end_idx]``."""
    _check_count(num_frames, "num_frames")
    if isinstance(total_frames, bool) or not isinstance(total_frames, int) or total_frames < 1:
        raise VideoError(f"the video has no frames (total_frames={total_frames!r})")
    start_idx, end_idx = _window_range(total_frames, fps, time_window)
    available = end_idx - start_idx + 1
    if available <= num_frames:
        return list(range(start_idx, end_idx + 1))
    seg_size = float(end_idx - start_idx) / num_frames
    # Python's round() is round-half-to-even like np.round in InternVL's code.
    idx = [start_idx + int(seg_size / 2 + round(seg_size * i)) for i in range(num_frames)]
    return [min(max(i, start_idx), end_idx) for i in idx]


def _window_range(total_frames: int, fps: float,
                  time_window: Optional[Tuple[float, float]]) -> Tuple[int, int]:
    """First and last frame index (inclusive) of the clip or of ``time_window``."""
    max_frame = total_frames - 1
    if time_window is None:
        return 0, max_frame
    try:
        start_s, end_s = (float(v) for v in time_window)
    except (TypeError, ValueError):
        raise VideoError(f"time_window: expected (start_s, end_s) in seconds, got {time_window!r}")
    if not (math.isfinite(start_s) and math.isfinite(end_s)):
        raise VideoError(f"time_window: {time_window!r} must be finite seconds")
    if not fps or fps <= 0 or not math.isfinite(fps):
        raise VideoError(f"time_window needs the frame rate, but the video reports fps={fps!r}")
    duration = total_frames / fps
    if start_s < 0 or start_s >= end_s:
        raise VideoError(f"time_window: need 0 <= start < end, got ({start_s:g}, {end_s:g}) s")
    # One frame of slack: a window ending "at the end" of a 10.0 s clip must not be refused
    # because the last frame starts at 9.96 s.
    if start_s >= duration or end_s > duration + 1.0 / fps:
        raise VideoError(f"time_window ({start_s:g}, {end_s:g}) s is outside the video, which "
                         f"lasts {duration:.2f} s ({total_frames} frames at {fps:g} fps)")
    start_idx = max(0, round(start_s * fps))
    end_idx = min(round(end_s * fps), max_frame)
    if end_idx < start_idx:  # a window shorter than one frame: take the frame it falls in
        end_idx = start_idx = min(int(start_s * fps), max_frame)
    return start_idx, end_idx


def _check_count(n, name: str) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise VideoError(f"{name} must be an integer >= 1, got {n!r}")


# ----------------------------------------------------------------------------- preprocessing

def preprocess_frames(frames: np.ndarray, size: int = 448, mean=IMAGENET_MEAN,
                      std=IMAGENET_STD) -> torch.Tensor:
    """uint8 RGB ``[T, H, W, 3]`` -> float32 ``[T, 3, size, size]``, normalised with ``mean`` /
    ``std`` (ImageNet's for InternVL; the backbone's ``FrameSpec`` says which).

    This is InternVL's transform (PIL bicubic resize to size x size, ToTensor, Normalize) with
    PIL itself doing the resize: torch's bicubic ``F.interpolate`` (even with ``antialias``)
    differs from PIL by up to ~20 grey levels on detailed content when upsampling, and the
    model was trained on PIL's output. PIL also releases the GIL, so the background decode
    thread does not stall the caller."""
    from PIL import Image
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise VideoError(f"expected RGB frames [T, H, W, 3], got shape {tuple(frames.shape)}")
    frames = np.ascontiguousarray(frames, dtype=np.uint8)
    if frames.shape[1:3] != (size, size):
        bicubic = getattr(getattr(Image, "Resampling", Image), "BICUBIC")
        frames = np.stack([np.asarray(Image.fromarray(f).resize((size, size), bicubic))
                           for f in frames])
    x = torch.from_numpy(frames).permute(0, 3, 1, 2).float()
    m = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1) * 255.0
    sd = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1) * 255.0
    return ((x - m) / sd).contiguous()


# ----------------------------------------------------------------------------- opening

@contextlib.contextmanager
def _quiet_stderr():
    """Silence C-level writes to fd 2 (decord's and ffmpeg's logging) for the duration.

    fd 2 is process-wide, so this is kept to the short open call and serialised."""
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


def _probe(path: str) -> Optional[float]:
    """Reject what is not a decodable video before decord sees it (PyAV raises cleanly).

    Returns the duration the container declares, in seconds (None if it declares none)."""
    import av
    try:
        container = av.open(path, metadata_errors="ignore")
    except Exception as e:  # av.error.FFmpegError and friends
        raise VideoError(f"{path}: not a readable video (unknown format, corrupt or truncated "
                         f"file: {_reason(e)})") from None
    try:
        fmt = (container.format.name or "").lower()
        streams = list(container.streams.video)
        if not streams:
            kinds = sorted({s.type for s in container.streams})
            raise VideoError(f"{path}: the file has no video stream"
                             + (f" (only {', '.join(kinds)})" if kinds else ""))
        codec = (streams[0].codec_context.name or "").lower()
        if fmt == "tty":  # ffmpeg renders .txt/.ans files as "ANSI art" video
            raise VideoError(f"{path}: this is a text file, not a video")
        # Still images come through ffmpeg's image demuxers ("png_pipe", "jpeg_pipe", "image2");
        # MJPEG or PNG frames inside a real container (avi, mov, mkv) are a video.
        if fmt.endswith("_pipe") or fmt == "image2":
            raise VideoError(f"{path}: this is an image ({codec or fmt}), not a video")
        duration = container.duration  # in AV_TIME_BASE units (microseconds)
        return duration / 1e6 if duration and duration > 0 else None
    finally:
        container.close()


def _reason(e: BaseException) -> str:
    msg = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return " ".join(str(msg).split())


def open_video(path) -> "object":
    """Validate ``path`` and open it with decord; returns the ``decord.VideoReader``.

    Raises ``VideoError`` for a missing, empty, corrupt or non-video file and for zero frames."""
    return _open(os.fspath(path))[0]


def _open(path: str):
    """``open_video`` plus the duration the container declares (seconds or None)."""
    if not os.path.exists(path):
        raise VideoError(f"{path}: no such file")
    if os.path.isdir(path):
        raise VideoError(f"{path}: is a directory, not a video file")
    try:
        size = os.path.getsize(path)
        with open(path, "rb"):
            pass
    except OSError as e:
        raise VideoError(f"{path}: cannot read the file ({_reason(e)})") from None
    if size == 0:
        raise VideoError(f"{path}: the file is empty (0 bytes)")
    declared_s = _probe(path)

    import decord
    try:
        decord.logging.set_level(decord.logging.QUIET)
    except Exception:  # pragma: no cover - older decord without the logging module
        pass
    try:
        with _quiet_stderr():
            vr = decord.VideoReader(path, ctx=decord.cpu(0))
    except Exception as e:  # decord raises RuntimeError / DECORDError
        raise VideoError(f"{path}: decord cannot open the video; the file is corrupt, truncated "
                         f"or in an unsupported format ({_decord_reason(e)})") from None
    if len(vr) < 1:
        raise VideoError(f"{path}: the video has zero frames")
    return vr, declared_s


def _decord_reason(e: BaseException) -> str:
    # decord messages carry a "[hh:mm:ss] /path/to/source.cc:NN:" prefix and a stack trace.
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    msg = lines[0] if lines else type(e).__name__
    if ".cc:" in msg:
        msg = msg.split(".cc:", 1)[1].split(":", 1)[-1]
    return " ".join(msg.split())[:200]


def _fps(vr) -> float:
    try:
        fps = float(vr.get_avg_fps())
    except Exception:
        fps = 0.0
    return fps if math.isfinite(fps) and fps > 0 else 0.0


# ----------------------------------------------------------------------------- loading

def _plan(vr, path: str, num_frames: int, time_window,
          declared_s: Optional[float] = None) -> Tuple[List[int], float, int, Optional[str]]:
    total = len(vr)
    fps = _fps(vr)
    if time_window is not None and fps <= 0:
        raise VideoError(f"{path}: the video reports no frame rate, so time_window cannot be used")
    indices = sample_indices(total, num_frames, fps if fps > 0 else 1.0, time_window)
    note = None
    if len(indices) < num_frames:
        where = "the video has" if time_window is None else "the time window holds"
        note = (f"{where} only {len(indices)} frames; {num_frames} were asked for, "
                f"so all {len(indices)} are used")
    # Containers without a trailing index (mkv, ts) decode a cut-off file up to the cut; say so
    # rather than silently sampling from the part that survived.
    if fps > 0 and declared_s and total / fps < 0.9 * declared_s - 1.0:
        cut = (f"the file declares {declared_s:.1f} s but only {total / fps:.1f} s decode "
               f"(truncated?); sampling from the decodable part")
        note = cut if note is None else f"{note}; {cut}"
    return indices, fps, total, note


def _decode(vr, path: str, indices: Sequence[int], size: int, progress: bool,
            norm=(IMAGENET_MEAN, IMAGENET_STD)) -> torch.Tensor:
    out = torch.empty(len(indices), 3, size, size, dtype=torch.float32)
    chunks = [indices[i:i + CHUNK] for i in range(0, len(indices), CHUNK)]
    bar = None
    if progress and len(chunks) > 1:
        from tqdm.auto import tqdm
        # delay: the bar shows only when decoding takes long enough to be worth watching.
        bar = tqdm(total=len(indices), desc="decoding", unit="frame", file=sys.stderr,
                   leave=False, dynamic_ncols=True, delay=1.0)
    try:
        done = 0
        for chunk in chunks:
            try:
                frames = vr.get_batch(list(chunk)).asnumpy()
            except Exception as e:
                raise VideoError(f"{path}: decoding frames {chunk[0]}..{chunk[-1]} failed; the "
                                 f"file is corrupt or truncated ({_decord_reason(e)})") from None
            out[done:done + len(chunk)] = preprocess_frames(frames, size, *norm)
            done += len(chunk)
            if bar is not None:
                bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
    return out


def load_video(path, num_frames: int = 64, time_window: Optional[Tuple[float, float]] = None,
               size: int = 448, progress: bool = False, mean=IMAGENET_MEAN,
               std=IMAGENET_STD) -> VideoClip:
    """Decode ``num_frames`` frames of ``path`` with InternVL's sampling (optionally within
    ``time_window`` = (start_s, end_s)) and preprocess them to ``[T, 3, size, size]``."""
    t0 = time.perf_counter()
    vr, path, indices, fps, total, note = _prepare(path, num_frames, time_window, size)
    return _finish(vr, path, indices, fps, total, num_frames, note, size, progress, t0,
                   (mean, std))


def _prepare(path, num_frames, time_window, size):
    """The cheap part: argument checks, opening (probe + decord) and the sampling plan."""
    _check_count(num_frames, "num_frames")
    _check_count(size, "size")
    path = os.fspath(path)
    vr, declared_s = _open(path)
    indices, fps, total, note = _plan(vr, path, num_frames, time_window, declared_s)
    return vr, path, indices, fps, total, note


def _finish(vr, path, indices, fps, total, num_frames, note, size, progress, t0,
            norm=(IMAGENET_MEAN, IMAGENET_STD)) -> VideoClip:
    pixels = _decode(vr, path, indices, size, progress, norm)
    return VideoClip(pixel_values=pixels, frame_indices=list(indices),
                     timestamps_s=[i / fps if fps > 0 else float("nan") for i in indices],
                     fps=fps, total_frames=total, requested=num_frames, note=note, path=path,
                     decode_s=time.perf_counter() - t0)


_pool: Optional[cf.ThreadPoolExecutor] = None
_pool_lock = threading.Lock()


def _executor() -> cf.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = cf.ThreadPoolExecutor(max_workers=2, thread_name_prefix="vr-decode")
        return _pool


def prefetch_video(path, num_frames: int = 64, time_window: Optional[Tuple[float, float]] = None,
                   size: int = 448, progress: bool = False, mean=IMAGENET_MEAN,
                   std=IMAGENET_STD) -> "cf.Future[VideoClip]":
    """Start :func:`load_video` on a background thread and return its Future.

    The cheap checks run here, synchronously, so a missing, empty or non-video file, a bad
    window, or a file truncated before its last sampled frame raises ``VideoError`` at once
    (before a caller spends seconds loading a model); the decoding and resizing, which release
    the GIL in decord and torch, overlap whatever the caller does next."""
    t0 = time.perf_counter()
    vr, path, indices, fps, total, note = _prepare(path, num_frames, time_window, size)
    try:  # a truncated file usually fails on its last frames: find out now, not after loading
        with _quiet_stderr():
            vr.get_batch([indices[-1]])
    except Exception as e:
        raise VideoError(f"{path}: cannot decode frame {indices[-1]}; the file is corrupt or "
                         f"truncated ({_decord_reason(e)})") from None
    return _executor().submit(_finish, vr, path, indices, fps, total, num_frames, note, size,
                              progress, t0, (mean, std))
