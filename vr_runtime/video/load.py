"""Video input (docs/CONTRACT.md section 3): decoding through :mod:`vr_runtime.video.decoders` (decord or PyAV,
chosen per file), InternVL's frame sampling, 448x448 ImageNet preprocessing, a memory check
before anything large is allocated, and a background prefetch so decoding overlaps model
loading.

Sampling of the whole clip follows InternVL's published ``load_video`` / ``get_index``: the
frames are cut into T equal segments by index and the middle frame of each is taken::

    seg_size = (end_idx - start_idx) / T
    idx_i    = start_idx + int(seg_size / 2 + round(seg_size * i))

A ``time_window`` is sampled by *time*: the same formula runs on a constant-rate grid of
``duration * fps`` slots over the window (``fps`` = the file's mean frame rate), and each slot
takes the frame on screen at that time (the last frame whose presentation timestamp is not
after it). On a constant-frame-rate file that is exactly InternVL's ``get_index`` with a
``bound``; on a variable-frame-rate file (phone, browser and WebRTC recordings) the window is
the right seconds of video and the frames are spread evenly in time within it.

Reported times (``VideoClip.timestamps_s``) are the frames' real presentation timestamps, in
seconds from the start of the file (ffprobe's ``pts_time - start_time``), never ``index / fps``.

A clip with fewer frames than asked for yields all of them, and ``VideoClip.note`` says so.
Bad inputs raise :class:`~vr_runtime.errors.VideoError` with one clear message.
"""
from __future__ import annotations

import concurrent.futures as cf
import inspect
import math
import os
import re
import stat
import sys
import threading
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from tqdm.auto import tqdm

from ..errors import VideoError
from .decoders import (Limits, VideoIndex, cancel_scope, decode_frames, keyframe_indices,
                       resolve_decoder, resolve_seek, resolve_workers, scaled_size)
from .probe import _duration, _reason, probe
from .sampling import (IMAGENET_MEAN, IMAGENET_STD, MAX_FRAMES, MIN_FRAMES, NUM_FRAMES, FrameSpec,
                       Sampling)
from .stream import FrameStream, normalise, resize_frame

__all__ = ["VideoClip", "VideoFile", "load_video", "sample_indices", "sample_window",
           "prefetch_video", "open_video", "preprocess_frames", "estimate_memory", "available_memory",
           "IMAGENET_MEAN", "IMAGENET_STD"]


# Frames resized per step: bounds the uint8 staging memory and gives the progress bar steps.
CHUNK = 8
# Frames a worker of the frame stream decodes in one job (vr_runtime.video.stream.gop_jobs).
STREAM_JOB = 16
# Env override for the memory the video may use (bytes, or with a K/M/G/T suffix): for
# machines whose free memory is not what the process may really use, and for tests.
MEMORY_ENV = "VIDEOROUTER_MEMORY_LIMIT"


@dataclass
class VideoClip:
    """Sampled, preprocessed frames of one video."""
    pixel_values: torch.Tensor          # float32 [T, 3, size, size], normalised with mean/std
    frame_indices: List[int]            # source frame numbers (presentation order), increasing
    timestamps_s: List[float]           # their presentation times, s from the start of the file
    fps: float                          # mean frame rate
    total_frames: int
    requested: int                      # frames asked for (T actually used may be fewer)
    note: Optional[str] = None          # e.g. "the video has 20 frames; 64 were asked for"
    path: Optional[str] = None
    decode_s: float = 0.0               # wall time spent decoding + preprocessing
    decoder: Optional[str] = None       # backend that decoded it: "decord" or "pyav"
    codec: Optional[str] = None         # FFmpeg codec name, e.g. "h264", "av1"
    # (real path, file identity, num_frames, time_window, decoder, seek): the runtime's visual
    # cache keys a clip by the file it came from, as it keys that file's path
    source_key: Optional[tuple] = None
    seek: str = "exact"                 # "exact" or "keyframe" (vr_runtime.video.decoders.SEEKS)
    decode_workers: int = 1             # parallel decoders used

    @property
    def num_frames(self) -> int:
        return len(self.frame_indices)


# ----------------------------------------------------------------------------- sampling

def sample_indices(total_frames: int, num_frames: int, fps: float,
                   time_window: Optional[Tuple[float, float]] = None) -> List[int]:
    """InternVL's ``get_index``: the middle frame of each of ``num_frames`` equal segments of
    ``[start_idx, end_idx]`` (the whole clip, or ``time_window`` in seconds at a constant
    ``fps``).

    If the range holds fewer than ``num_frames`` frames, every frame in it is returned (so
    the result may be shorter than ``num_frames``). Indices are increasing and lie in
    ``[start_idx, end_idx]``."""
    _check_count(num_frames, "num_frames")
    if isinstance(total_frames, bool) or not isinstance(total_frames, int) or total_frames < 1:
        raise VideoError(f"the video has no frames (total_frames={total_frames!r})")
    start_idx, end_idx = _window_range(total_frames, fps, time_window)
    return _segments(start_idx, end_idx, num_frames)


def _segments(start_idx: int, end_idx: int, num_frames: int) -> List[int]:
    """InternVL's formula over the inclusive range; all of it if it is not longer."""
    if end_idx - start_idx + 1 <= num_frames:
        return list(range(start_idx, end_idx + 1))
    seg_size = float(end_idx - start_idx) / num_frames
    # Python's round() is round-half-to-even like np.round in InternVL's code.
    idx = [start_idx + int(seg_size / 2 + round(seg_size * i)) for i in range(num_frames)]
    return [min(max(i, start_idx), end_idx) for i in idx]


def sample_window(pts_s: Sequence[float], num_frames: int, time_window: Tuple[float, float],
                  fps: Optional[float] = None) -> List[int]:
    """Frames of a ``time_window`` = (start_s, end_s), sampled by time (module docstring).

    ``pts_s``: every frame's presentation time in seconds, increasing; ``fps``: the mean frame
    rate (default: from ``pts_s``). Returns increasing, distinct frame indices: all frames on
    screen during the window if there are at most ``num_frames``, else the frame on screen at
    each of ``num_frames`` evenly spaced times."""
    _check_count(num_frames, "num_frames")
    t = np.asarray(pts_s, dtype=np.float64)
    if t.ndim != 1 or t.size < 1:
        raise VideoError("the video has no frames")
    if fps is None:
        fps = (t.size - 1) / (t[-1] - t[0]) if t.size > 1 and t[-1] > t[0] else 1.0
    if not fps or fps <= 0 or not math.isfinite(fps):
        raise VideoError(f"time_window needs the frame rate, but the video reports fps={fps!r}")
    duration = _duration(t, fps)
    slots = max(1, int(round(duration * fps)))
    start_slot, end_slot = _window_range(slots, fps, time_window, duration, t.size)
    eps = 1e-6

    def on_screen(time_s: float) -> int:
        return max(int(np.searchsorted(t, time_s + eps, side="right")) - 1, 0)

    first = on_screen(start_slot / fps)
    last = on_screen(end_slot / fps)
    if last - first + 1 <= num_frames:
        return list(range(first, last + 1))
    slot_idx = _segments(start_slot, end_slot, num_frames)
    out = sorted({on_screen(s / fps) for s in slot_idx})
    return [min(max(i, first), last) for i in out]


def rate_frames(duration_s: float, fps: float, min_frames: int = MIN_FRAMES,
                max_frames: int = MAX_FRAMES) -> int:
    """Frames to sample at ``fps`` frames a second from ``duration_s`` seconds, clamped to
    [``min_frames``, ``max_frames``] (Qwen2.5-VL/Qwen3-VL's ``fps`` sampling: their processors'
    defaults are 2 fps, 4 to 768 frames)."""
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not fps > 0 \
            or not math.isfinite(fps):
        raise VideoError(f"fps: expected frames a second > 0, got {fps!r}")
    _check_count(min_frames, "min_frames")
    _check_count(max_frames, "max_frames")
    if min_frames > max_frames:
        raise VideoError(f"min_frames {min_frames} is above max_frames {max_frames}")
    return int(min(max(round(duration_s * fps), min_frames), max_frames))


def sample_rate_indices(first: int, last: int, n: int) -> List[int]:
    """``n`` frames evenly spread over ``[first, last]``, both ends included (Qwen's
    ``linspace(0, total - 1, n).round()``); all of them if the range is not longer."""
    if last - first + 1 <= n:
        return list(range(first, last + 1))
    return sorted({int(i) for i in np.linspace(first, last, n).round()})


def _validate_window(time_window, duration: float, total_frames: int, fps: float):
    try:
        start_s, end_s = (float(v) for v in time_window)
    except (TypeError, ValueError):
        raise VideoError(f"time_window: expected (start_s, end_s) in seconds, got {time_window!r}")
    if not (math.isfinite(start_s) and math.isfinite(end_s)):
        raise VideoError(f"time_window: {time_window!r} must be finite seconds")
    if start_s < 0 or start_s >= end_s:
        raise VideoError(f"time_window: need 0 <= start < end, got ({start_s:g}, {end_s:g}) s")
    # One frame of slack: a window ending "at the end" of a 10.0 s clip must not be refused
    # because the last frame starts at 9.96 s.
    if start_s >= duration or end_s > duration + 1.0 / fps:
        raise VideoError(f"time_window ({start_s:g}, {end_s:g}) s is outside the video, which "
                         f"lasts {duration:.2f} s ({total_frames} frames at {fps:g} fps)")
    return start_s, end_s


def _window_range(total_frames: int, fps: float, time_window: Optional[Tuple[float, float]],
                  duration: Optional[float] = None,
                  real_frames: Optional[int] = None) -> Tuple[int, int]:
    """First and last frame index (inclusive) of the clip or of ``time_window`` on a grid of
    ``total_frames`` slots at ``fps`` (``duration``/``real_frames``: the video's own, for the
    bounds check and its message; default the grid's)."""
    max_frame = total_frames - 1
    if time_window is None:
        return 0, max_frame
    if not fps or fps <= 0 or not math.isfinite(fps):
        raise VideoError(f"time_window needs the frame rate, but the video reports fps={fps!r}")
    start_s, end_s = _validate_window(time_window,
                                      total_frames / fps if duration is None else duration,
                                      total_frames if real_frames is None else real_frames, fps)
    start_idx = max(0, round(start_s * fps))
    end_idx = min(round(end_s * fps), max_frame)
    if end_idx < start_idx:  # a window shorter than one frame: take the frame it falls in
        end_idx = start_idx = min(int(start_s * fps), max_frame)
    return start_idx, end_idx


def _check_count(n, name: str) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise VideoError(f"{name} must be an integer >= 1, got {n!r}")


# ----------------------------------------------------------------------------- preprocessing

def preprocess_frames(frames: np.ndarray, size: int = 448, mean: Sequence[float] = IMAGENET_MEAN,
                      std: Sequence[float] = IMAGENET_STD) -> torch.Tensor:
    """uint8 RGB ``[T, H, W, 3]`` -> float32 ``[T, 3, size, size]``, normalised with
    ``mean`` / ``std`` (per channel, on the 0..1 scale; ImageNet's by default).

    A non-square frame (16:9, 4:3, 9:16 footage) is *squeezed* to size x size, the whole frame
    kept and each axis scaled on its own, as InternVL's single-tile video transform does: no
    crop, no letterbox (the synthetic task v2 trains and measures routing on exactly this).

    This is InternVL's transform (PIL bicubic resize to size x size, ToTensor, Normalize) with
    PIL itself doing the resize: torch's bicubic ``F.interpolate`` (even with ``antialias``)
    differs from PIL by up to ~20 grey levels on detailed content when upsampling, and the
    model was trained on PIL's output. PIL also releases the GIL, so the background decode
    thread does not stall the caller."""
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise VideoError(f"expected RGB frames [T, H, W, 3], got shape {tuple(frames.shape)}")
    mean_t, std_t = _norm(mean, "mean"), _norm(std, "std")
    if not bool((std_t > 0).all()):
        raise VideoError(f"std must be > 0, got {tuple(std)}")
    frames = np.ascontiguousarray(frames, dtype=np.uint8)
    if frames.shape[1:3] != (size, size):
        frames = np.stack([resize_frame(f, size) for f in frames])
    # In place: the same arithmetic as (x - mean) / std, one float copy fewer at the peak.
    return normalise(torch.from_numpy(frames).permute(0, 3, 1, 2), mean_t, std_t).contiguous()


def _norm(v, name) -> torch.Tensor:
    try:
        t = torch.tensor([float(x) for x in v], dtype=torch.float32)
    except (TypeError, ValueError):
        raise VideoError(f"{name} must be 3 numbers (R, G, B), got {v!r}") from None
    if t.numel() != 3 or not bool(torch.isfinite(t).all()):
        raise VideoError(f"{name} must be 3 finite numbers (R, G, B), got {v!r}")
    return t.view(1, 3, 1, 1)


# ----------------------------------------------------------------------------- memory

def estimate_memory(num_frames: int, size: int, width: int, height: int, bits: int = 8,
                    workers: int = 1, streaming: bool = False) -> int:
    """Bytes that loading ``num_frames`` frames of a ``width`` x ``height`` video at ``size``
    needs at its peak; an upper estimate (bench/results/video_cpu.md compares it with the
    measured peak, decord and PyAV, 448p to 4K):

    * the clip, float32 ``[T, 3, size, size]``, counted twice: the caller's model takes a
      device/dtype copy of it (none on CPU in fp32, a full one on CUDA). ``streaming`` (the
      runtime's frame stream, :mod:`vr_runtime.video.stream`) holds no clip: instead its
      reorder window of resized uint8 frames ((workers + 1) jobs of ``STREAM_JOB`` frames) and
      one chunk normalised to float32, whatever ``num_frames`` is;
    * one chunk of staging: ``CHUNK`` decoded frames at the reduced decode size, their PIL
      resized copies, and four float32 temporaries of the normalisation;
    * the decoder's own frames at full source resolution: reference frames plus
      frame-threading buffers, taken as 32 frames of YUV 4:2:0 (2 bytes a sample above 8 bits);
    * with ``workers`` parallel decoders (``decode_workers``), each holds its own decoder's
      frames and one converted frame waiting for the staging;
    * a fixed 100 MB for the decoding libraries' contexts and allocator slack."""
    w2, h2 = scaled_size(width, height, size)
    workers = max(1, int(workers))
    if streaming:
        frame = 3 * size * size
        clip = (workers + 1) * STREAM_JOB * frame + STREAM_JOB * frame * 4
    else:
        clip = 2 * int(num_frames) * 3 * size * size * 4
    staging = CHUNK * (w2 * h2 * 3 + size * size * 3 + 4 * 3 * size * size * 4)
    sample_bytes = 2 if bits > 8 else 1
    decoder = workers * (32 * int(width * height * 1.5) * sample_bytes + w2 * h2 * 3)
    return clip + staging + decoder + 100 * 2 ** 20


def available_memory() -> Optional[int]:
    """Bytes this process may still allocate: ``$VIDEOROUTER_MEMORY_LIMIT`` if set, else the
    smaller of the machine's available memory (/proc/meminfo MemAvailable) and the room left
    under a cgroup memory limit (containers, CI); None where neither can be read."""
    env = os.environ.get(MEMORY_ENV, "").strip()
    if env:
        return _parse_bytes(env)
    cands = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    cands.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    for limit_f, usage_f in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                             ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                              "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_f) as f:
                lim = f.read().strip()
            with open(usage_f) as f:
                used = int(f.read().strip())
            if lim.isdigit() and int(lim) < 2 ** 60:
                cands.append(max(int(lim) - used, 0))
            break
        except (OSError, ValueError):
            continue
    if not cands:
        try:  # macOS and other POSIX: free pages (an underestimate, which errs safe)
            cands.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            return None
    return min(cands)


def _parse_bytes(text: str) -> int:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)i?b?\s*", text.lower())
    if not m:
        raise VideoError(f"{MEMORY_ENV}={text!r}: expected bytes, e.g. 8G or 512M")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} TB"  # pragma: no cover


def _check_memory(path: str, info: "VideoIndex", n: int, size: int,
                  limit: Optional[int], workers: int = 1, streaming: bool = False) -> int:
    """Refuse before allocating when ``n`` frames cannot fit in memory; returns the parallel
    decoders that fit (``workers``, or fewer when each one's frames would not)."""
    avail = available_memory() if limit is None else int(limit)
    if avail is None:
        return workers
    for w in range(max(1, workers), 0, -1):
        if estimate_memory(n, size, info.width, info.height, info.bits, w, streaming) <= avail:
            return w
    need = estimate_memory(n, size, info.width, info.height, info.bits, 1, streaming)
    if streaming:
        raise VideoError(f"{path}: streaming frames at {size}x{size} need about "
                         f"{_fmt_bytes(need)} of memory (one decoder and a window of frames, "
                         f"whatever the frame count) but only {_fmt_bytes(avail)} is "
                         f"available; free some memory first")
    per_frame = estimate_memory(2, size, info.width, info.height, info.bits) - \
        estimate_memory(1, size, info.width, info.height, info.bits)
    fixed = need - n * per_frame
    fit = max(int((avail - fixed) // per_frame), 0)
    advice = (f"ask for at most {fit} frames (--frames {fit})" if fit >= 1 else
              "free some memory first")
    raise VideoError(f"{path}: {n} frames at {size}x{size} need about {_fmt_bytes(need)} of "
                     f"memory but only {_fmt_bytes(avail)} is available; {advice}, or use a "
                     f"time window (--time-window START,END)")


# ----------------------------------------------------------------------------- opening

_FD_DIRS = ("/dev/fd/", "/proc/self/fd/", "/dev/stdin")


def _not_regular(path: str, mode: int) -> Optional[str]:
    """What a non-regular file is, as one line naming it and what to do (None: regular)."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return f"{path}: is a directory, not a video file"
    if stat.S_ISFIFO(mode):
        if path.startswith(_FD_DIRS) or re.match(r"^/proc/\d+/fd/", path):
            return (f"{path}: is a pipe (process substitution or stdin), which cannot be "
                    f"seeked: process substitution: pass a file (save the stream first)")
        return f"{path}: is a named pipe (FIFO), not a video file; pass a regular file"
    kind = ("a character device" if stat.S_ISCHR(mode) else "a block device"
            if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
    return f"{path}: is {kind}, not a video file; pass a regular file"


class VideoFile:
    """A video file opened once: the descriptor is checked with ``fstat`` (a regular file,
    not empty) and every later reader -- the probe, the decoders, on any thread -- opens
    ``source``, ``/proc/self/fd/N``, which is that same file whatever happens to its name
    afterwards (a folder swapped for a symlink, the file replaced). FIFOs, devices and sockets
    are refused from ``stat`` before any open, so nothing blocks. The descriptor closes when
    the object (and every index or clip holding it) is gone, or on :meth:`close`."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self.fd: Optional[int] = None
        try:
            st = os.stat(self.path)    # never blocks, whatever the file is
        except FileNotFoundError:
            raise VideoError(f"{self.path}: no such file") from None
        except OSError as e:
            raise VideoError(f"{self.path}: cannot read the file ({_reason(e)})") from None
        why = _not_regular(self.path, st.st_mode)
        if why:
            raise VideoError(why)
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | \
            getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.path, flags)
        except OSError as e:
            raise VideoError(f"{self.path}: cannot read the file ({_reason(e)})") from None
        try:
            st = os.fstat(fd)          # what was opened, not what the name pointed at before
            why = _not_regular(self.path, st.st_mode)
            if why:
                raise VideoError(why)
            if st.st_size == 0:
                real = os.path.realpath(self.path)
                if real.startswith(("/proc/", "/sys/")):
                    raise VideoError(f"{self.path}: is a virtual file of the kernel "
                                     f"({real.split('/')[1]}), not a video file")
                raise VideoError(f"{self.path}: the file is empty (0 bytes)")
        except BaseException:
            os.close(fd)
            raise
        self.fd, self.stat = fd, st
        proc = f"/proc/self/fd/{fd}"
        self.source = proc if os.path.exists(proc) else self.path

    @property
    def identity(self) -> tuple:
        """(device, inode, size, mtime, ctime) of the opened file: changes when its content
        does, even when size and mtime are kept (``cp -p``, ``rsync -t``, ``tar``)."""
        st = self.stat
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    @property
    def real_path(self) -> str:
        """Where the opened file is now (the descriptor's own link, not the name's)."""
        try:
            return os.readlink(self.source) if self.source != self.path else \
                os.path.realpath(self.path)
        except OSError:
            return os.path.realpath(self.path)

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def __del__(self):
        self.close()


def open_video(path, file: Optional[VideoFile] = None,
               limits: Optional["Limits"] = None) -> "VideoIndex":
    """Validate ``path`` and index it: returns the :class:`vr_runtime.video.decoders.VideoIndex`
    (codec, size, rotation, every frame's timestamp), which holds the file open
    (:class:`VideoFile`; ``file``: one already opened). Raises ``VideoError`` for a missing,
    empty, corrupt or non-video file, a pipe, device or socket, an undecodable codec, a frame
    over the pixel cap and for zero frames (``limits``: :class:`vr_runtime.video.decoders.Limits`,
    default the process's)."""
    path = os.fspath(path)
    f = file if file is not None else VideoFile(path)
    info = probe(path, source=f.source, limits=limits)
    info.handle = f
    return info


# ----------------------------------------------------------------------------- loading

@dataclass
class _Plan:
    info: "VideoIndex"
    path: str
    indices: List[int]
    num_frames: int
    size: int
    note: Optional[str]
    decoder: str
    mean: Sequence[float]
    std: Sequence[float]
    time_window: Optional[tuple] = None
    should_stop: Optional[object] = None
    seek: str = "exact"
    workers: int = 1
    rate: Optional[tuple] = None     # (fps, min_frames, max_frames) when sampled by rate


def _rate_plan(info, rate: tuple, time_window) -> Tuple[List[int], int, str]:
    """``rate`` = (fps, min_frames, max_frames): the frames a rate gives over the clip or the
    window (sampled by time inside a window), their count, and a note saying so."""
    fps, lo, hi = rate
    if time_window is None:
        span = info.duration_s
        n = rate_frames(span, fps, lo, hi)
        indices = sample_rate_indices(0, info.num_frames - 1, n)
    else:
        start_s, end_s = _validate_window(time_window, info.duration_s, info.num_frames,
                                          info.fps)
        span = min(end_s, info.duration_s) - start_s
        n = rate_frames(span, fps, lo, hi)
        indices = sample_window(info.pts_s, n, time_window, info.fps)
    return indices, n, (f"sampled at {fps:g} fps: {span:.1f} s -> {n} frames "
                        f"(between {lo} and {hi})")


def _plan(info, num_frames: int, time_window, seek: str = "exact",
          rate: Optional[tuple] = None) -> Tuple[List[int], Optional[str], int]:
    """-> (the sampled indices, a note or None, the frames asked for: ``num_frames``, or the
    count the ``rate`` gives)."""
    total = info.num_frames
    note = None
    if rate is not None:
        indices, num_frames, note = _rate_plan(info, rate, time_window)
    elif time_window is None:
        indices = sample_indices(total, num_frames, info.fps)
    else:
        indices = sample_window(info.pts_s, num_frames, time_window, info.fps)
    if len(indices) < num_frames:
        where = "the video has" if time_window is None else "the time window holds"
        frames = "frame" if len(indices) == 1 else "frames"
        few = (f"{where} only {len(indices)} {frames}; {num_frames} were asked for, "
               f"so all {len(indices)} are used")
        note = few if note is None else f"{note}; {few}"
    if seek == "keyframe":
        sampled = len(indices)
        indices = keyframe_indices(info, indices)
        if not info.has_pts:
            kf = "the file has no timestamps, so no keyframe index: its frames were decoded exactly"
        elif len(indices) < sampled:
            m = len(indices)
            kf = (f"seek keyframe: the {sampled} sampled times fall nearest to {m} distinct "
                  f"keyframe{'s' if m != 1 else ''}, so {m} frame{'s are' if m != 1 else ' is'} "
                  f"used")
        else:
            kf = None
        if kf:
            note = kf if note is None else f"{note}; {kf}"
    # A cut-off file decodes up to the cut (as ffmpeg does); say so rather than silently
    # sampling from the part that survived.
    decodable = info.duration_s
    declared = info.declared_s
    if info.truncated or (declared and decodable < declared - max(0.5, 0.05 * declared)):
        cut = ("the file is truncated or damaged part-way" if not declared else
               f"the file declares {declared:.1f} s but only {decodable:.1f} s decode "
               f"(truncated?)") + "; sampling from the decodable part"
        note = cut if note is None else f"{note}; {cut}"
    return indices, note, num_frames


@dataclass(frozen=True)
class _Access:
    """How a file may be read, besides what is sampled: the memory the frames may use, the
    caller's deadline, the probe's limits, the decoding threads, and whether the frames are
    streamed (a bounded window held) rather than decoded into one clip."""
    memory_limit: Optional[int] = None
    should_stop: Optional[object] = None
    limits: Optional["Limits"] = None
    decode_workers: Optional[int] = None
    streaming: bool = False


def _prepare(path, sampling: Sampling, spec: FrameSpec, access: _Access = _Access()) -> _Plan:
    """The cheap part: argument checks, probing/indexing, the sampling plan and the memory
    check (before anything large is allocated)."""
    size, mean, std = spec.size[0], spec.mean, spec.std
    _check_count(sampling.num_frames, "num_frames")
    _check_count(size, "size")
    _norm(mean, "mean")
    if not bool((_norm(std, "std") > 0).all()):
        raise VideoError(f"std must be > 0, got {tuple(std)}")
    decoder = resolve_decoder(sampling.decoder)
    seek = resolve_seek(sampling.seek)
    workers = resolve_workers(access.decode_workers)
    path = os.fspath(path)
    with cancel_scope(access.should_stop):
        info = open_video(path, limits=access.limits)
    indices, note, num_frames = _plan(info, sampling.num_frames, sampling.time_window, seek,
                                      sampling.rate)
    workers = _check_memory(path, info, len(indices), size, access.memory_limit, workers,
                            access.streaming)
    return _Plan(info, path, indices, num_frames, size, note, decoder, mean, std,
                 sampling.window, access.should_stop, seek, workers, sampling.rate)


def _load_plan(args: dict) -> _Plan:
    """The plan of a :func:`load_video` call, from its arguments by name."""
    return _prepare(args["path"],
                    Sampling(args["num_frames"], args["time_window"], decoder=args["decoder"],
                             seek=args["seek"]),
                    FrameSpec.square(args["size"], args["mean"], args["std"]),
                    _Access(args["memory_limit"], args["should_stop"], args["limits"],
                            args["decode_workers"]))


def _progress_bar(n: int):
    # delay: the bar shows only when decoding takes long enough to be worth watching.
    return tqdm(total=n, desc="decoding", unit="frame", file=sys.stderr,
                leave=False, dynamic_ncols=True, delay=1.0)


def _finish(plan: _Plan, progress: bool, t0: float) -> VideoClip:
    """Decode the plan's frames into a :class:`VideoClip`: the frame stream's frames (decoded
    and resized on ``plan.workers`` threads, :mod:`vr_runtime.video.stream`), normalised
    ``CHUNK`` at a time into one float32 clip."""
    info = plan.info
    n = len(plan.indices)
    mean, std = _norm(plan.mean, "mean"), _norm(plan.std, "std")
    out = torch.empty(n, 3, plan.size, plan.size, dtype=torch.float32)
    bar = _progress_bar(n) if progress and n > CHUNK else None
    try:
        with FrameStream(info, plan.indices, plan.size, plan.decoder, plan.seek,
                         plan.workers, job_frames=STREAM_JOB,
                         should_stop=plan.should_stop) as stream:
            for i in range(0, n, CHUNK):
                m = min(CHUNK, n - i)
                u8 = torch.stack([torch.from_numpy(stream.take(i + j)).permute(2, 0, 1)
                                  for j in range(m)])
                out[i:i + m] = normalise(u8, mean, std)
                if bar is not None:
                    bar.update(m)
        used = stream.used or plan.decoder   # after close: every worker joined
    finally:
        if bar is not None:
            bar.close()
    return _clip(plan, out, used, t0)


def _clip(plan: _Plan, pixel_values: torch.Tensor, used: str, t0: float) -> VideoClip:
    """The decoded clip with what it came from (``used``: the decoder) and its cache key."""
    info = plan.info
    t = info.pts_s
    f = info.handle
    key = None if f is None else (f.real_path, f.identity, int(plan.num_frames),
                                  plan.time_window, plan.decoder, plan.seek)
    return VideoClip(pixel_values=pixel_values, frame_indices=list(plan.indices),
                     timestamps_s=[float(t[i]) for i in plan.indices], fps=info.fps,
                     total_frames=info.num_frames, requested=plan.num_frames, note=plan.note,
                     path=plan.path, decode_s=time.perf_counter() - t0, decoder=used,
                     codec=info.codec, source_key=key, seek=plan.seek,
                     decode_workers=plan.workers)


def load_video(path, num_frames: int = NUM_FRAMES, time_window: Optional[Tuple[float, float]] = None,
               size: int = 448, progress: bool = False, *, decoder: str = "auto",
               mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
               memory_limit: Optional[int] = None, should_stop=None,
               limits: Optional["Limits"] = None, seek: str = "exact",
               decode_workers: Optional[int] = None) -> VideoClip:
    """Decode ``num_frames`` frames of ``path`` with InternVL's sampling (optionally within
    ``time_window`` = (start_s, end_s), sampled by time) and preprocess them to
    ``[T, 3, size, size]`` normalised with ``mean`` / ``std``.

    ``decoder``: "auto" (decord where it handles the codec, else PyAV; PyAV also when decord
    fails), "pyav" or "decord". ``memory_limit``: bytes the clip may use (default: what the
    machine has free, see :func:`available_memory`); a request that cannot fit raises
    ``VideoError`` before decoding. ``should_stop()``: asked between packets and frames; a
    reason (a string) stops the decode with a ``VideoError`` (a deadline). ``limits``:
    :class:`vr_runtime.video.decoders.Limits` (default the process's: ``--max-frame-pixels``).

    ``seek``: "exact" (the sampled frames themselves, the paper's setting) or "keyframe" (the
    keyframe nearest each sampled time, one decoded frame a sample; at most half a GOP away,
    and ``timestamps_s`` are the keyframes' own times). ``decode_workers``: parallel exact
    decoders, each on its own share of the GOPs (default: the cores this process may use,
    cgroup quota included; fewer when memory would not hold them all)."""
    t0 = time.perf_counter()
    plan = _load_plan(locals())   # every argument, by name (prefetch_video binds the same)
    return _finish(plan, progress, t0)


# At most two decodes at once (answer_batch decodes the next file while the current one is
# answered); more would only compete for the same cores and memory.
_decode_slots = threading.BoundedSemaphore(2)


def _submit(fn, *args) -> "cf.Future":
    """Run ``fn(*args)`` on a daemon thread and return its Future.

    Not a ThreadPoolExecutor: the interpreter joins an executor's threads at exit, so a Ctrl-C
    in the caller (a script, a notebook being closed) waited for a long decode to finish, and
    a second Ctrl-C during that join printed "Exception ignored ... KeyboardInterrupt". A
    daemon thread is simply dropped at exit. A Future cancelled before its turn never runs."""
    future: cf.Future = cf.Future()

    def run():
        with _decode_slots:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args)
            except BaseException as e:  # delivered to whoever waits on the Future
                future.set_exception(e)
            else:
                future.set_result(result)

    threading.Thread(target=run, name="vr-decode", daemon=True).start()
    return future


def prefetch_video(path, *args, **kwargs) -> "cf.Future[VideoClip]":
    """Start :func:`load_video` (the same arguments) on a background thread and return its
    Future.

    The cheap checks run here, synchronously, so a missing, empty or non-video file, an
    undecodable codec, a bad window, a request that does not fit in memory, or a file damaged
    at its last sampled frame raises ``VideoError`` at once (before a caller spends seconds
    loading a model); the decoding and resizing, which release the GIL in FFmpeg and PIL,
    overlap whatever the caller does next."""
    t0 = time.perf_counter()
    call = inspect.signature(load_video).bind(path, *args, **kwargs)   # load_video's arguments
    call.apply_defaults()
    plan = _load_plan(call.arguments)
    # A damaged file usually fails on its last frames: find out now, not after loading. With
    # "auto", PyAV checks (one seek; decord would re-index the whole file first), and a
    # decord-only failure later still falls back to PyAV.
    last = plan.indices[-1]
    scale = scaled_size(plan.info.width, plan.info.height, min(plan.size, 64))
    decode_frames(plan.info, [last], scale, lambda i, f: None,
                    "pyav" if plan.decoder == "auto" else plan.decoder, seek=plan.seek)
    return _submit(_finish, plan, call.arguments["progress"], t0)
