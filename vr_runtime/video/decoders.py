"""Video decoding backends: one probe (PyAV) that indexes a file, and interchangeable decoders
that turn a list of frame indices into small RGB frames.

Why a layer: no single library decodes everything users hand over. decord (named by the
design) has no AV1 decoder in its bundled FFmpeg, fails on real-time VP9 and animated GIF,
returns wrong frames from MPEG-TS and from HEVC when it seeks, mishandles rotation, and has no
aarch64 / Apple-arm64 wheel. PyAV (always installed) ships an FFmpeg with every common decoder
(dav1d for AV1). ``decoder="auto"`` uses decord only where the corpus tests show it gives
ffmpeg's frames (``DECORD_CODECS`` / ``DECORD_CONTAINERS``), when it is installed, and PyAV for
everything else and as the fallback whenever decord fails on a file.

The probe demuxes every packet of the video stream once (no decoding, except the first frame
for its rotation; decord does the same to build its index) and keeps the presentation
timestamps, sorted. Containers without presentation times (raw streams, AVI with B-frames)
are decoded by frame count instead, at ``i / fps``. Frame ``i`` is the ``i``-th
frame in presentation order and ``VideoIndex.pts_s[i]`` its real time in seconds from the
start of the file, which is what ffmpeg/ffprobe report (``pts_time - start_time``). That makes
times right on variable-frame-rate files (phone and browser recordings), where ``i / fps`` is
not.

Frames are decoded straight to a reduced resolution (``scaled_size``: each side capped at
twice the model's input size) by the decoder's scaler, one frame at a time, so a 4K file holds
no full-resolution RGB frames (bench/results/video_cpu.md: 32 frames of 4K cost ~0.1 GB more
than of 448p). Rotation metadata (phone
videos) is applied, as ffmpeg does by default.

Exact decoding costs the frames from each sample's keyframe to it (about half a keyframe
interval a sample: ~125 frames on libx264's defaults), so PyAV's path (1) skips the unsampled
frames no other frame references (``skip_frame="NONREF"`` packet by packet, on the codecs in
``_NONREF_CODECS``) and (2) with ``workers`` > 1 splits the samples by keyframe interval over
threads, each with its own demuxer and decoder (:func:`split_by_gop`). ``seek="keyframe"``
instead decodes only the keyframe nearest each sample (:func:`keyframe_indices`): its packet
alone, the decoder drained, one frame a sample.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import VideoError

__all__ = ["VideoIndex", "probe", "decode_frames", "DECODERS", "available_decoders",
           "scaled_size", "resolve_decoder", "Limits", "limits", "set_limits", "cancel_scope",
           "SEEKS", "resolve_seek", "keyframe_indices", "default_workers", "resolve_workers",
           "split_by_gop"]

DECODERS = ("auto", "pyav", "decord")
# How sampled times become frames: "exact" decodes the sampled frame itself (InternVL's
# sampling, the paper's setting); "keyframe" takes the keyframe nearest each sampled time and
# decodes only it (one frame a sample; at most half a GOP from the exact frame).
SEEKS = ("exact", "keyframe")


@dataclass(frozen=True)
class Limits:
    """What one video may cost, checked from its headers before decoding and again as frames
    are demuxed and decoded (a file that declares nothing is counted as it goes):

    * ``max_frame_pixels``: the coded frame size (width x height; a GIF's logical screen,
      which its decoder fills for every frame). Default 8K UHD, 7680 x 4320.
    * ``max_seconds``: the duration, declared or counted while indexing (None: no cap).
    * ``max_frames``: frames in the index (a flood of tiny frames costs memory per frame)."""
    max_frame_pixels: int = 7680 * 4320
    max_seconds: Optional[float] = None
    max_frames: int = 2_000_000


_limits = Limits()


def limits() -> Limits:
    return _limits


def set_limits(**kw) -> Limits:
    """Set the process's video limits (``ask --max-frame-pixels``, ``serve
    --max-frame-pixels``/``--max-video-seconds``); returns the previous ones."""
    global _limits
    old = _limits
    _limits = dataclasses.replace(_limits, **{k: v for k, v in kw.items()})
    return old


_cancel = threading.local()


@contextlib.contextmanager
def cancel_scope(should_stop: Optional[Callable[[], Optional[str]]]):
    """Within it, on this thread, the probe and the decoders call ``should_stop()`` between
    packets and frames; a non-None answer (the reason) stops them with a ``VideoError``: how a
    deadline bounds a decode in progress."""
    prev = getattr(_cancel, "fn", None)
    _cancel.fn = should_stop
    try:
        yield
    finally:
        _cancel.fn = prev


def _check_cancel(path: str) -> None:
    fn = getattr(_cancel, "fn", None)
    if fn is not None:
        why = fn()
        if why:
            raise VideoError(f"{path}: decoding stopped: {why}")


def _check_pixels(path: str, width: int, height: int, what: str = "frame size",
                  lim: Optional[Limits] = None) -> None:
    cap = (lim or _limits).max_frame_pixels
    if cap and int(width) * int(height) > cap:
        raise VideoError(f"{path}: the {what} is {width}x{height} ({int(width) * int(height):,} "
                         f"pixels), over the limit of {cap:,} pixels (--max-frame-pixels; "
                         f"default 8K UHD, 7680x4320); downscale the video first")

# Codecs and containers for which decord's bundled FFmpeg gives ffmpeg's frames (checked by
# tests/runtime/test_video_corpus.py). Everything else goes to PyAV: decord has no AV1, fails
# on real-time VP9 and GIF, returns wrong frames from MPEG-TS, and from HEVC when it seeks
# (sparse sampling gave frames up to 255 levels off ffmpeg's).
DECORD_CODECS = frozenset({"h264", "mjpeg"})
DECORD_CONTAINERS = ("mov", "matroska", "avi")

# Human names for the codecs users meet, for error messages.
_CODEC_NAMES = {"h264": "H.264", "hevc": "HEVC/H.265", "av1": "AV1", "vp9": "VP9", "vp8": "VP8",
                "mpeg2video": "MPEG-2", "mpeg4": "MPEG-4 Part 2", "mjpeg": "Motion JPEG",
                "prores": "ProRes", "gif": "GIF"}


@dataclass
class VideoIndex:
    """What the probe learnt about a file: codec, geometry and every frame's timestamp."""
    path: str
    container: str                 # FFmpeg demuxer name, e.g. "mov,mp4,m4a,3gp,3g2,mj2"
    codec: str                     # FFmpeg codec name, e.g. "h264", "av1"
    width: int                     # coded frame size (before rotation)
    height: int
    rotation: int                  # degrees counter-clockwise to apply for display (0/90/180/270)
    pts: np.ndarray                # int64 [N] presentation timestamps, stream time base, sorted
    time_base: float               # seconds per pts unit
    start: int                     # pts of time 0 (the file's start time), stream time base
    keyframe: np.ndarray           # int64 [N]: index of the keyframe to seek to for frame i
    has_pts: bool                  # False: pts were synthesised (raw streams); decode by count
    fps: float                     # average frame rate (frames / duration)
    declared_s: Optional[float]    # duration the container declares, seconds
    truncated: bool = False        # demuxing stopped on a read error before the end
    bits: int = 8                  # bits per sample of the source (10 for 10-bit HDR etc.)
    source: Optional[str] = None   # what the decoders open (/proc/self/fd/N of the opened file)
    handle: object = None          # keeps that file open (vr_runtime.video.load.VideoFile)

    @property
    def open_path(self) -> str:
        return self.source or self.path

    @property
    def num_frames(self) -> int:
        return int(self.pts.shape[0])

    @property
    def pts_s(self) -> np.ndarray:
        """float64 [N]: each frame's presentation time in seconds from the start of the file."""
        return (self.pts - self.start).astype(np.float64) * self.time_base

    @property
    def duration_s(self) -> float:
        """From time 0 to the end of the last frame (shown as long as the one before it)."""
        return _duration(self.pts_s, self.fps)

    @property
    def display_size(self) -> Tuple[int, int]:
        """(width, height) as shown, after rotation."""
        return (self.height, self.width) if self.rotation % 180 else (self.width, self.height)

    @property
    def codec_name(self) -> str:
        return _CODEC_NAMES.get(self.codec, self.codec)


def _duration(t: np.ndarray, fps: float) -> float:
    if t.size > 1 and t[-1] > t[-2]:
        return float(t[-1] + (t[-1] - t[-2]))
    return float(t[-1] + 1.0 / fps) if fps > 0 else float(t[-1])


def scaled_size(width: int, height: int, size: int) -> Tuple[int, int]:
    """The resolution frames are decoded to for a ``size`` x ``size`` model input: each side
    capped at ``2 * size`` (the final resize, InternVL's PIL bicubic, then shrinks by at most
    2x, so its result stays within a grey level or two of resizing the full frame; see
    tests/runtime/test_video_corpus.py). Sources already that small are not scaled."""
    cap = 2 * int(size)
    return min(int(width), cap), min(int(height), cap)


# ----------------------------------------------------------------------------- probing

def _reason(e: BaseException) -> str:
    msg = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return " ".join(str(msg).split())[:200]


def probe(path: str, source: Optional[str] = None, limits: Optional[Limits] = None) -> VideoIndex:
    """Open ``path`` (or ``source``, the same file already opened: messages still name
    ``path``) with PyAV, reject what is not a decodable video with one clear
    :class:`VideoError`, and index every frame's presentation timestamp. ``limits``: the
    caps to check (default: the process's, :func:`set_limits`)."""
    import av
    try:
        container = av.open(source or path, metadata_errors="ignore")
    except Exception as e:  # av.error.FFmpegError and friends
        if source and source != path and path.lower().endswith(_TTY_EXTS) \
                and _looks_like_text(source):
            # (opened by descriptor, ffmpeg cannot see the .txt that makes it "tty")
            raise VideoError(f"{path}: this is a text file, not a video") from None
        raise VideoError(f"{path}: not a readable video (unknown format, corrupt or truncated "
                         f"file: {_reason(e)})") from None
    try:
        info = _index(container, path, limits or _limits)
        info.source = source
        return info
    finally:
        container.close()


# The names ffmpeg's "tty" (ANSI art) demuxer claims by extension alone.
_TTY_EXTS = (".txt", ".ans", ".art", ".asc", ".diz", ".ice", ".nfo", ".vt")


def _looks_like_text(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
        text = head.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return bool(text) and all(c.isprintable() or c in "\r\n\t\f" for c in text)


def _index(container, path: str, lim: Limits) -> VideoIndex:
    import av
    fmt = (container.format.name or "").lower()
    streams = list(container.streams.video)
    if not streams:
        kinds = sorted({s.type for s in container.streams})
        raise VideoError(f"{path}: the file has no video stream"
                         + (f" (only {', '.join(kinds)})" if kinds else ""))
    # The first stream that is not a cover picture (mp4/mkv "attached_pic" artwork).
    stream = next((s for s in streams if not _is_attached_pic(s)), streams[0])
    ctx = stream.codec_context
    codec = _canonical(ctx)
    if fmt == "tty":  # ffmpeg renders .txt/.ans files as "ANSI art" video
        raise VideoError(f"{path}: this is a text file, not a video")
    # Still images come through ffmpeg's image demuxers ("png_pipe", "jpeg_pipe", "image2");
    # MJPEG or PNG frames inside a real container (avi, mov, mkv) are a video.
    if fmt.endswith("_pipe") or fmt == "image2":
        raise VideoError(f"{path}: this is an image ({codec or fmt}), not a video")
    if not codec or codec == "none" or not _has_decoder(codec):
        raise VideoError(f"{path}: cannot decode this video: its codec "
                         f"({_CODEC_NAMES.get(codec, codec or 'unknown')}) has no decoder in "
                         f"this FFmpeg build; re-encode it, e.g. "
                         f"'ffmpeg -i INPUT -c:v libx264 -crf 18 out.mp4'")
    width, height = int(ctx.width or 0), int(ctx.height or 0)
    if width < 1 or height < 1:
        raise VideoError(f"{path}: the video stream declares no frame size (corrupt header?)")
    # Before anything is decoded: the decoder allocates frames of this size (a GIF's logical
    # screen, whatever the size of the images drawn on it).
    _check_pixels(path, width, height, "frame size" if codec != "gif" else "GIF's logical screen",
                  lim)
    tb = float(stream.time_base) if stream.time_base else 0.0
    # The video stream's own duration where the container keeps one (mp4), else the file's
    # (mkv, ts): an audio track that runs on after the picture must not look like a cut.
    declared = container.duration / 1e6 if container.duration and container.duration > 0 else None
    if stream.duration and stream.duration > 0 and tb > 0:
        declared = float(stream.duration) * tb
    if lim.max_seconds is not None and declared is not None and declared > lim.max_seconds:
        raise _too_long(path, declared, lim.max_seconds)
    # Undeclared (or understated) lengths are counted while demuxing: the packets' times
    # against max_seconds, their number against max_frames.
    start_pts = None

    pts: List[int] = []
    key_pts: List[int] = []
    missing_pts = 0
    truncated = False
    rotation: Optional[int] = None
    # Demux (no decoding) to list every frame. A read error part-way (a cut-off or damaged
    # file) ends the index there; what came before is still a video.
    try:
        for pkt in container.demux(stream):
            if pkt.size == 0 or pkt.is_discard:  # flush packet / edit-list pre-roll
                continue
            t = pkt.pts
            if t is None:
                # (AVI, raw streams): such frames also come out of the decoder without pts,
                # so they are told apart by count, below.
                missing_pts += 1
                t = pkt.dts if pkt.dts is not None else -1
            pts.append(int(t))
            if len(pts) % 256 == 0:
                _check_cancel(path)
            if len(pts) > lim.max_frames:
                raise VideoError(f"{path}: the video has more than {lim.max_frames:,} frames; "
                                 f"cut it (e.g. ffmpeg -t) or lower its frame rate")
            if lim.max_seconds is not None:
                if tb > 0 and pkt.pts is not None:
                    start_pts = pkt.pts if start_pts is None else min(start_pts, pkt.pts)
                    counted = (pkt.pts - start_pts) * tb
                else:   # no timestamps (raw streams): frames at the stream's rate
                    counted = len(pts) / (_rate(stream) or 25.0)
                if counted > lim.max_seconds:
                    raise _too_long(path, counted, lim.max_seconds, counted=True)
            if pkt.is_keyframe:
                key_pts.append(int(t))
            if rotation is None and len(pts) <= 32:
                # The display matrix reaches PyAV on decoded frames only: decode until the
                # first frame comes out (a few packets at most), then just demux.
                try:
                    for frame in pkt.decode():
                        rotation = int(frame.rotation or 0)
                        break
                except av.error.FFmpegError:
                    pass
    except (av.error.FFmpegError, OSError):
        truncated = True
    if not pts:
        raise VideoError(f"{path}: the video has zero frames"
                         + (" (the file is corrupt or truncated)" if truncated else ""))
    has_pts = missing_pts == 0 and tb > 0
    if fmt == "avi" and _reorders(codec):
        # AVI stores no presentation times: with B-frames its packet "pts" are decode-order
        # guesses that the decoded frames do not carry. Frames are told apart by count there.
        has_pts = False
    n = len(pts)
    if has_pts:
        order = np.argsort(np.asarray(pts, np.int64), kind="stable")
        p = np.asarray(pts, np.int64)[order]
        # Duplicate pts (broken muxers) would make frames indistinguishable by time.
        if np.any(np.diff(p) <= 0):
            has_pts = False
    fps = _rate(stream)
    if has_pts:
        # First-frame time 0 is the file's start (ffmpeg's start_time), not the first video
        # frame: a video that starts after its audio keeps its real offset.
        start_us = container.start_time  # microseconds; None when the container has none
        start = int(p[0])
        if start_us is not None and tb > 0:
            start = min(start, int(round(start_us / 1e6 / tb)))
        span = float(p[-1] - p[0]) * tb
        if n > 1 and span > 0:
            fps = (n - 1) / span  # mean spacing, so duration_s = span + one mean frame
        keys = np.asarray(sorted(set(key_pts)), np.int64)
        # Frame i seeks to the last keyframe whose pts is <= its own.
        pos = np.searchsorted(keys, p, side="right") - 1 if keys.size else np.full(n, -1)
        key_idx = np.searchsorted(p, keys[np.maximum(pos, 0)]) if keys.size else np.zeros(n)
        keyframe = np.where(pos >= 0, key_idx, 0).astype(np.int64)
    else:
        # No usable timestamps (raw elementary streams): frame i is the i-th frame out of the
        # decoder, its time i / fps.
        fps = fps if fps > 0 else 25.0
        tb = 1.0 / fps
        p = np.arange(n, dtype=np.int64)
        start = 0
        keyframe = np.zeros(n, np.int64)
    if not (fps > 0 and math.isfinite(fps)):
        fps = 1.0 / tb if tb > 0 else 25.0
    bits = _bit_depth(ctx)
    return VideoIndex(path=path, container=fmt, codec=codec, width=width, height=height,
                      rotation=int(round((rotation or 0) / 90.0)) % 4 * 90, pts=p, time_base=tb, start=start,
                      keyframe=keyframe, has_pts=has_pts, fps=float(fps), declared_s=declared,
                      truncated=truncated, bits=bits)


def _too_long(path: str, seconds: float, cap: float, counted: bool = False) -> VideoError:
    how = "runs past" if counted else "lasts"
    return VideoError(f"{path}: the video {how} {seconds:.1f} s; at most {cap:g} s are "
                      f"accepted (--max-video-seconds)")


def _is_attached_pic(stream) -> bool:
    try:
        return bool(stream.disposition & 0x0400)  # AV_DISPOSITION_ATTACHED_PIC
    except Exception:
        return False


def _canonical(ctx) -> str:
    """The codec's FFmpeg name ("av1"), not the decoder's ("libdav1d")."""
    try:
        return (ctx.codec.canonical_name or ctx.name or "").lower()
    except Exception:
        return (getattr(ctx, "name", "") or "").lower()


def _reorders(codec: str) -> bool:
    """Whether the codec can reorder frames (B-frames), from FFmpeg's codec descriptor."""
    import av
    try:
        return bool(av.codec.Codec(codec, "r").reorder)
    except Exception:
        return True


def _has_decoder(codec: str) -> bool:
    import av
    try:
        av.codec.Codec(codec, "r")
        return True
    except Exception:
        return False


def _rate(stream) -> float:
    # guessed_rate first: FFmpeg's best guess (the bitstream's timing info for a raw stream,
    # where average_rate is the demuxer's 25 fps default). Files with timestamps replace this
    # with the mean rate of their frames.
    for r in (stream.guessed_rate, stream.average_rate, stream.base_rate):
        try:
            v = float(r)
        except (TypeError, ValueError, ZeroDivisionError):
            continue
        if v > 0 and math.isfinite(v):
            return v
    return 0.0


def _bit_depth(ctx) -> int:
    try:
        return max(c.bits for c in ctx.format.components)
    except Exception:
        return 8


# ----------------------------------------------------------------------------- backends

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


def available_decoders() -> List[str]:
    """Backends that can be imported here (PyAV always: it is a core dependency)."""
    out = ["pyav"]
    if _decord_module() is not None:
        out.append("decord")
    return out


def _decord_module():
    try:
        import decord
        return decord
    except Exception:  # not installed (aarch64, Apple arm64) or broken
        return None


def resolve_decoder(decoder: str) -> str:
    """Check a ``decoder=`` / ``--decoder`` value."""
    if decoder not in DECODERS:
        raise VideoError(f"decoder: expected one of {', '.join(DECODERS)}, got {decoder!r}")
    if decoder == "decord" and _decord_module() is None:
        raise VideoError("decoder 'decord' is not installed here (it has no wheel for this "
                         "platform); use --decoder auto or pyav")
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


# cgroup v2's "QUOTA PERIOD" file, then v1's quota and period files
_CGROUP_CPU_FILES = (("/sys/fs/cgroup/cpu.max", None),
                     ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us"))


def _cgroup_cpus() -> Optional[float]:
    """The CPUs a cgroup quota allows (v2 cpu.max, v1 cfs quota/period); None if unlimited."""
    for quota_f, period_f in _CGROUP_CPU_FILES:
        try:
            with open(quota_f) as f:
                parts = f.read().split()
            if period_f is not None:
                with open(period_f) as f:
                    parts = parts[:1] + f.read().split()[:1]
            if not parts or parts[0] in ("max", "-1"):
                return None
            quota, period = float(parts[0]), float(parts[1]) if len(parts) > 1 else 100000.0
            if quota > 0 and period > 0:
                return quota / period
        except (OSError, ValueError, IndexError):
            continue
    return None


def default_workers() -> int:
    """Cores this process may use: its CPU affinity (taskset, container cpusets), capped by a
    cgroup CPU quota (docker --cpus, Kubernetes limits), at least 1."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _cgroup_cpus()
    if quota is not None:
        n = min(n, max(1, int(math.ceil(quota))))
    return max(1, n)


def resolve_workers(workers) -> int:
    """Check a ``decode_workers=`` value: None -> :func:`default_workers`, else an int >= 1."""
    if workers is None:
        return default_workers()
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise VideoError(f"decode_workers: expected an integer >= 1 (or None: the cores "
                         f"available), got {workers!r}")
    return int(workers)


def split_by_gop(info: VideoIndex, indices: Sequence[int], workers: int) -> List[List[int]]:
    """Positions in ``indices`` cut into at most ``workers`` contiguous shares for parallel
    exact decoding. Indices that share a keyframe stay in one share (its worker decodes that
    GOP once); shares are balanced by the frames each must decode (from each GOP's keyframe
    to its last sampled frame)."""
    n = len(indices)
    if n == 0:
        return []
    groups: List[List[int]] = []
    cost: List[int] = []
    last_key = None
    for pos, k in enumerate(indices):
        key = int(info.keyframe[k]) if info.has_pts else 0
        if key != last_key:
            groups.append([])
            cost.append(0)
            last_key = key
        groups[-1].append(pos)
        cost[-1] = int(k) - key + 1
    w = max(1, min(int(workers), len(groups)))
    total = float(sum(cost))
    shares: List[List[int]] = [[]]
    acc = 0.0
    for g, c in zip(groups, cost):
        # start a new share once this one holds its fair part of the work (and shares remain)
        if shares[-1] and len(shares) < w and acc >= total * len(shares) / w:
            shares.append([])
        shares[-1].extend(g)
        acc += c
    return shares


def _candidates(info: VideoIndex, decoder: str, workers: int = 1) -> List[str]:
    if decoder != "auto":
        return [decoder]
    # Several workers: PyAV's parallel decode (decord indexes the whole file per reader and
    # decodes one GOP at a time).
    if workers > 1 and info.has_pts:
        return ["pyav"]
    if (info.codec in DECORD_CODECS and info.container.startswith(DECORD_CONTAINERS)
            and info.has_pts and not info.rotation and _decord_module() is not None):
        return ["decord", "pyav"]
    return ["pyav"]


OnFrame = Callable[[int, np.ndarray], None]


def decode_frames(info: VideoIndex, indices: Sequence[int], scale: Tuple[int, int],
                  on_frame: OnFrame, decoder: str = "auto", workers: int = 1,
                  seek: str = "exact") -> str:
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
    next; an explicit backend's failure is the user's answer."""
    resolve_seek(seek)
    workers = max(1, int(workers))
    cands = _candidates(info, decoder, workers if seek == "exact" else 2)
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
                _pyav(info, list(indices), scale, counted, workers=workers, seek=seek)
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


def _clean_reason(e: Optional[BaseException]) -> str:
    """A library's error without its source paths and stack traces (decord prefixes
    "[hh:mm:ss] /path/to/source.cc:NN:" and appends a backtrace)."""
    if e is None:
        return "unknown error"
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    msg = lines[0] if lines else type(e).__name__
    for marker in (".cc:", ".cpp:", ".c:", ".h:"):
        if marker in msg:
            msg = msg.split(marker, 1)[1].split(":", 1)[-1]
    return " ".join(msg.split())[:200] or type(e).__name__


def _orient(frame: np.ndarray, rotation: int) -> np.ndarray:
    """Apply a counter-clockwise display rotation (the display matrix's convention)."""
    k = (rotation // 90) % 4
    return np.ascontiguousarray(np.rot90(frame, k)) if k else frame


# --- PyAV

def _pyav(info: VideoIndex, indices: List[int], scale: Tuple[int, int], on_frame: OnFrame,
          workers: int = 1, seek: str = "exact") -> None:
    import av
    w, h = scale
    interp = av.video.reformatter.Interpolation.AREA  # a box filter: right for shrinking

    def rgb(frame) -> np.ndarray:
        # a stream may change size part-way (a new sequence header): checked on every frame
        _check_pixels(info.path, frame.width, frame.height)
        if (frame.width, frame.height) == (w, h):
            arr = frame.to_ndarray(format="rgb24")
        else:
            arr = frame.to_ndarray(format="rgb24", width=w, height=h, interpolation=interp)
        return _orient(arr, info.rotation)

    if info.has_pts and workers > 1 and len(indices) > 1:
        shares = split_by_gop(info, indices, workers)
        if len(shares) > 1:
            threads = max(1, default_workers() // len(shares))
            try:
                _parallel(info, indices, shares, rgb, on_frame, threads, seek)
                return
            except _NotByPts:
                pass   # decoded frames lack the demuxer's pts: count them, below, on one thread
    holder = [av.open(info.open_path, metadata_errors="ignore")]
    try:
        if info.has_pts:
            try:
                if seek == "keyframe":
                    _pyav_keyframes(holder, info, indices, rgb, on_frame)
                else:
                    _pyav_by_pts(holder, info, indices, rgb, on_frame, seek=seek)
                return
            except _NotByPts:
                # Decoded frames do not carry the demuxer's timestamps: count them instead
                # (frames delivered so far are delivered again, from the first).
                holder[0].close()
                holder[0] = av.open(info.open_path, metadata_errors="ignore")
        _pyav_by_count(holder[0], info, indices, rgb, on_frame)
    except av.error.FFmpegError as e:
        raise VideoError(f"{info.path}: decoding the {info.codec_name} video failed; the file "
                         f"is corrupt or truncated ({_reason(e)})") from None
    finally:
        holder[0].close()


def _video_stream(container, info: VideoIndex, threads: Optional[int] = None):
    streams = list(container.streams.video)
    s = next((x for x in streams if not _is_attached_pic(x)), streams[0])
    s.thread_type = "AUTO"
    # Each frame thread holds frames of its own: a few threads are nearly as fast on the small
    # samples decoded here and keep a 4K decode's memory bounded on many-core machines.
    # ``threads``: a parallel decode's share of the cores, per worker.
    s.codec_context.thread_count = min(4, threads or default_workers())
    return s


# Codecs whose decoders honour skip_frame="NONREF" by dropping only frames no other frame
# references (H.264/HEVC nal_ref_idc / sub-layer non-reference NAL types, MPEG B-frames, VP8/VP9
# frames that refresh no reference slot); the video corpus tests check the frames are still
# ffmpeg's. Elsewhere every frame is decoded.
_NONREF_CODECS = frozenset({"h264", "hevc", "mpeg1video", "mpeg2video", "mpeg4", "vp8", "vp9"})


def _frames(container, stream, path: str, skip: Optional[Callable] = None) -> Iterator:
    """Decoded frames from where the container is. ``skip(packet)``: the codec's skip_frame
    for that packet ("DEFAULT", "NONREF", "NONKEY"), set before it is decoded."""
    ctx = stream.codec_context
    mode = "DEFAULT"
    for pkt in container.demux(stream):
        _check_cancel(path)
        if skip is not None:
            want = skip(pkt)
            if want != mode:
                ctx.skip_frame = mode = want
        for frame in pkt.decode():
            yield frame
    # demux ends with an empty packet whose decode() drains the decoder


def _skipper(info: VideoIndex, indices: Sequence[int], seek: str) -> Optional[Callable]:
    """What ``_frames`` may skip: in keyframe mode every non-keyframe; in exact mode the
    non-reference frames that are not sampled (nothing decodes from them, so the sampled
    frames are unchanged), on the codecs known to honour it."""
    if seek == "keyframe":
        return lambda pkt: "NONKEY"
    if info.codec not in _NONREF_CODECS:
        return None
    wanted = frozenset(int(info.pts[k]) for k in indices)

    def skip(pkt):
        # a packet without pts (or a sampled one) is decoded in full
        return "DEFAULT" if pkt.pts is None or pkt.pts in wanted else "NONREF"
    return skip


def _pyav_by_pts(holder: list, info: VideoIndex, indices: List[int], rgb, on_frame,
                 seek: str = "exact", threads: Optional[int] = None,
                 positions: Optional[Sequence[int]] = None) -> None:
    """``holder[0]``: the open container (replaced, and closed by the caller, if decoding has
    to restart from the top of the file). ``positions``: what ``on_frame`` is told for each
    of ``indices`` (default 0, 1, ...: a parallel worker's share says where it sits)."""
    import av
    container = holder[0]
    stream = _video_stream(container, info, threads)
    skip = _skipper(info, indices, seek)
    pts = info.pts
    gen: Optional[Iterator] = None
    pos = -1            # pts-order index of the last frame decoded in the current run
    for n, k in enumerate(indices):
        target = int(pts[k])
        key = int(info.keyframe[k])
        if gen is None or k <= pos or key > pos:
            # Seek only when the target's keyframe lies ahead of where decoding is: between
            # nearby targets, decoding on is cheaper than seeking back to the same keyframe.
            container.seek(int(pts[key]), stream=stream, backward=True, any_frame=False)
            gen, pos = _frames(container, stream, info.path, skip), -1
        frame = _advance(gen, target)
        back = 1.0
        while frame is None or frame.pts != target:
            # The seek landed past the target (inexact seeking in MPEG-TS/PS, or an index
            # that disagrees with the decoder), or the decoder skipped it: seek further back,
            # and in the end decode from the start of the file, which is always right.
            if back > 64 or frame is None:
                container.close()
                container = holder[0] = av.open(info.open_path, metadata_errors="ignore")
                stream = _video_stream(container, info, threads)
                gen = _frames(container, stream, info.path, skip)
                frame = _advance(gen, target)
                if frame is None or frame.pts != target:
                    raise _NotByPts()
                break
            offset = int(pts[key]) - int(back / info.time_base)
            container.seek(max(offset, 0), stream=stream, backward=True)
            gen = _frames(container, stream, info.path, skip)
            frame = _advance(gen, target)
            back *= 4
        pos = int(np.searchsorted(pts, frame.pts))
        on_frame(n if positions is None else positions[n], rgb(frame))


def _pyav_keyframes(holder: list, info: VideoIndex, indices: List[int], rgb, on_frame,
                    positions: Optional[Sequence[int]] = None) -> None:
    """Keyframes only: for each, seek to it, decode its packet alone and drain the decoder
    (a keyframe references nothing, so this is ffmpeg's frame; without the drain a decoder
    that reorders would hold it back until later frames arrive). A keyframe the demuxer does
    not land on goes through the general path (decoding on from the seek point)."""
    import av
    container = holder[0]
    stream = _video_stream(container, info, 1)   # one frame per seek: threads only add latency
    ctx = stream.codec_context
    for n, k in enumerate(indices):
        _check_cancel(info.path)
        target = int(info.pts[k])
        container.seek(target, stream=stream, backward=True, any_frame=False)
        frame = None
        for pkt in container.demux(stream):
            if pkt.size == 0 or pkt.pts is None:
                continue
            if pkt.pts == target:
                for f in list(ctx.decode(pkt)) + list(ctx.decode(None)):
                    if f.pts == target:
                        frame = f
                ctx.flush_buffers()
                break
            if pkt.is_keyframe and pkt.pts > target:
                break                  # the seek landed past it
        if frame is None:   # on a container of its own (this one's decoder is set up)
            sub = [av.open(info.open_path, metadata_errors="ignore")]
            try:
                _pyav_by_pts(sub, info, [k], rgb, on_frame, seek="keyframe",
                             positions=[n if positions is None else positions[n]])
            finally:
                sub[0].close()
            continue
        on_frame(n if positions is None else positions[n], rgb(frame))


def _parallel(info: VideoIndex, indices: List[int], shares: List[List[int]], rgb, on_frame,
              threads: int, seek: str) -> None:
    """Decode each share (positions in ``indices``) on its own thread with its own demuxer and
    decoder (PyAV releases the GIL while FFmpeg decodes). Every thread is joined before this
    returns or raises; the first failure stops the others at their next packet and is raised
    as one line naming the file."""
    import av
    outer = getattr(_cancel, "fn", None)        # the caller's deadline, for every worker
    failed: List[BaseException] = []
    stop = threading.Event()

    def should_stop():
        if stop.is_set():
            return "another decoding worker stopped"
        return outer() if outer is not None else None

    def work(share: List[int]) -> None:
        holder = [None]
        try:
            with cancel_scope(should_stop):
                holder[0] = av.open(info.open_path, metadata_errors="ignore")
                if seek == "keyframe":
                    _pyav_keyframes(holder, info, [indices[p] for p in share], rgb, on_frame,
                                    positions=share)
                else:
                    _pyav_by_pts(holder, info, [indices[p] for p in share], rgb, on_frame,
                                 seek=seek, threads=threads, positions=share)
        except BaseException as e:  # kept for the caller, which raises the first
            failed.append(e)
            stop.set()
        finally:
            if holder[0] is not None:
                holder[0].close()

    ts = [threading.Thread(target=work, args=(sh,), name=f"vr-decode-{i}", daemon=True)
          for i, sh in enumerate(shares)]
    try:
        for t in ts:
            t.start()
    finally:
        try:
            for t in ts:
                if t.ident is not None:
                    t.join()
        except BaseException:   # Ctrl-C while waiting: stop the workers, then let them end
            stop.set()
            for t in ts:
                if t.ident is not None:
                    t.join()
            raise
    if not failed:
        return
    # the worker that failed first on its own, not one stopped because of it
    real = [e for e in failed if not (isinstance(e, VideoError)
                                      and "another decoding worker stopped" in str(e))]
    e = (real or failed)[0]
    if isinstance(e, (_NotByPts, VideoError)):
        raise e
    if isinstance(e, av.error.FFmpegError):
        raise VideoError(f"{info.path}: decoding the {info.codec_name} video failed; the file "
                         f"is corrupt or truncated ({_reason(e)})") from None
    raise VideoError(f"{info.path}: a decoding worker failed ({_clean_reason(e)})") from None


class _NotByPts(Exception):
    """A frame of the index never came out of the decoder with its pts."""


def _advance(gen: Iterator, target: int):
    """The first frame whose pts is >= target (frames without pts are skipped)."""
    for frame in gen:
        if frame.pts is not None and frame.pts >= target:
            return frame
    return None


def _missing(info: VideoIndex, k: int) -> VideoError:
    return VideoError(f"{info.path}: frame {k} (at {info.pts_s[k]:.2f} s) of the "
                      f"{info.codec_name} video does not decode; the file is corrupt or "
                      f"truncated")


def _pyav_by_count(container, info: VideoIndex, indices: List[int], rgb, on_frame) -> None:
    stream = _video_stream(container, info)
    want: Dict[int, int] = {k: n for n, k in enumerate(indices)}
    got = 0
    for i, frame in enumerate(_frames(container, stream, info.path)):
        if i in want:
            on_frame(want[i], rgb(frame))
            got += 1
            if got == len(want):
                return
    raise _missing(info, indices[got] if got < len(indices) else indices[-1])


# --- decord

def _decord(info: VideoIndex, indices: List[int], scale: Tuple[int, int], on_frame: OnFrame) -> None:
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


_BACKENDS = {"pyav": _pyav, "decord": _decord}
