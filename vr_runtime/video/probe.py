"""The probe: open a file with PyAV, reject what is not a decodable video with one clear
:class:`~vr_runtime.errors.VideoError`, and index every frame (:class:`VideoIndex`); plus what
the probe and every decoder share: the process's :class:`Limits`, the cancellation scope a
deadline reaches decoding through, and the display rotation.

The probe demuxes every packet of the video stream once (no decoding, except the first frame
for its rotation; decord does the same to build its index) and keeps the presentation
timestamps, sorted. Containers without presentation times (raw streams, AVI with B-frames)
are decoded by frame count instead, at ``i / fps``. Frame ``i`` is the ``i``-th
frame in presentation order and ``VideoIndex.pts_s[i]`` its real time in seconds from the
start of the file, which is what ffmpeg/ffprobe report (``pts_time - start_time``). That makes
times right on variable-frame-rate files (phone and browser recordings), where ``i / fps`` is
not.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

import av
import numpy as np

from ..errors import VideoError

__all__ = ["VideoIndex", "probe", "scaled_size", "Limits", "limits", "set_limits",
           "cancel_scope", "OnFrame"]


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
    tests/video/test_video_corpus.py). Sources already that small are not scaled."""
    cap = 2 * int(size)
    return min(int(width), cap), min(int(height), cap)

# What a decoder calls for each decoded frame: (position in the requested indices, uint8 RGB
# frame [H, W, 3]).
OnFrame = Callable[[int, np.ndarray], None]


# ----------------------------------------------------------------------------- probing

def _reason(e: BaseException) -> str:
    msg = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return " ".join(str(msg).split())[:200]


def probe(path: str, source: Optional[str] = None, limits: Optional[Limits] = None) -> VideoIndex:
    """Open ``path`` (or ``source``, the same file already opened: messages still name
    ``path``) with PyAV, reject what is not a decodable video with one clear
    :class:`VideoError`, and index every frame's presentation timestamp. ``limits``: the
    caps to check (default: the process's, :func:`set_limits`)."""
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
    fmt = (container.format.name or "").lower()
    stream = _main_stream(container, path)
    ctx = stream.codec_context
    codec = _canonical(ctx)
    _check_is_video(path, fmt, codec)
    width, height = int(ctx.width or 0), int(ctx.height or 0)
    if width < 1 or height < 1:
        raise VideoError(f"{path}: the video stream declares no frame size (corrupt header?)")
    # Before anything is decoded: the decoder allocates frames of this size (a GIF's logical
    # screen, whatever the size of the images drawn on it).
    _check_pixels(path, width, height, "frame size" if codec != "gif" else "GIF's logical screen",
                  lim)
    tb = float(stream.time_base) if stream.time_base else 0.0
    declared = _declared_seconds(container, stream, tb)
    if lim.max_seconds is not None and declared is not None and declared > lim.max_seconds:
        raise _too_long(path, declared, lim.max_seconds)
    demuxed = _demux(container, stream, path, lim, tb)
    if not demuxed.pts:
        raise VideoError(f"{path}: the video has zero frames"
                         + (" (the file is corrupt or truncated)" if demuxed.truncated else ""))
    has_pts = demuxed.missing_pts == 0 and tb > 0
    if fmt == "avi" and _reorders(codec):
        # AVI stores no presentation times: with B-frames its packet "pts" are decode-order
        # guesses that the decoded frames do not carry. Frames are told apart by count there.
        has_pts = False
    t = _timeline(container, stream, demuxed, has_pts, tb)
    return VideoIndex(path=path, container=fmt, codec=codec, width=width, height=height,
                      rotation=int(round((demuxed.rotation or 0) / 90.0)) % 4 * 90, pts=t.pts,
                      time_base=t.time_base, start=t.start, keyframe=t.keyframe,
                      has_pts=t.has_pts, fps=t.fps, declared_s=declared,
                      truncated=demuxed.truncated, bits=_bit_depth(ctx))


def _main_stream(container, path: str):
    """The first video stream that is not a cover picture (mp4/mkv "attached_pic" artwork)."""
    streams = list(container.streams.video)
    if not streams:
        kinds = sorted({s.type for s in container.streams})
        raise VideoError(f"{path}: the file has no video stream"
                         + (f" (only {', '.join(kinds)})" if kinds else ""))
    return next((s for s in streams if not _is_attached_pic(s)), streams[0])


def _check_is_video(path: str, fmt: str, codec: str) -> None:
    """Reject text, still images and codecs this FFmpeg build cannot decode."""
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


def _declared_seconds(container, stream, tb: float) -> Optional[float]:
    """The video stream's own duration where the container keeps one (mp4), else the file's
    (mkv, ts): an audio track that runs on after the picture must not look like a cut."""
    declared = container.duration / 1e6 if container.duration and container.duration > 0 else None
    if stream.duration and stream.duration > 0 and tb > 0:
        declared = float(stream.duration) * tb
    return declared


@dataclass
class _Demuxed:
    """What demuxing the video stream found, packet by packet (in decode order)."""
    pts: List[int] = field(default_factory=list)      # each packet's pts (dts where it has none)
    key_pts: List[int] = field(default_factory=list)  # the keyframes' among them
    missing_pts: int = 0            # packets without pts
    truncated: bool = False         # a read error ended demuxing before the end of the file
    rotation: Optional[int] = None  # the first decoded frame's display rotation
    start_pts: Optional[int] = None  # the earliest pts so far, to count seconds against the cap


def _demux(container, stream, path: str, lim: Limits, tb: float) -> _Demuxed:
    """Demux (no decoding) to list every frame. A read error part-way (a cut-off or damaged
    file) ends the index there; what came before is still a video. Undeclared (or
    understated) lengths are counted as it goes: the packets' times against max_seconds,
    their number against max_frames."""
    d = _Demuxed()
    try:
        for pkt in container.demux(stream):
            if pkt.size == 0 or pkt.is_discard:  # flush packet / edit-list pre-roll
                continue
            t = pkt.pts
            if t is None:
                # (AVI, raw streams): such frames also come out of the decoder without pts,
                # so they are told apart by count, below.
                d.missing_pts += 1
                t = pkt.dts if pkt.dts is not None else -1
            d.pts.append(int(t))
            _check_demux_limits(d, pkt, stream, path, lim, tb)
            if pkt.is_keyframe:
                d.key_pts.append(int(t))
            if d.rotation is None and len(d.pts) <= 32:
                d.rotation = _first_rotation(pkt)
    except (av.error.FFmpegError, OSError):
        d.truncated = True
    return d


def _check_demux_limits(d: _Demuxed, pkt, stream, path: str, lim: Limits, tb: float) -> None:
    """After each packet: the caller's cancellation, then the frame and length caps."""
    if len(d.pts) % 256 == 0:
        _check_cancel(path)
    if len(d.pts) > lim.max_frames:
        raise VideoError(f"{path}: the video has more than {lim.max_frames:,} frames; "
                         f"cut it (e.g. ffmpeg -t) or lower its frame rate")
    if lim.max_seconds is not None:
        if tb > 0 and pkt.pts is not None:
            d.start_pts = pkt.pts if d.start_pts is None else min(d.start_pts, pkt.pts)
            counted = (pkt.pts - d.start_pts) * tb
        else:   # no timestamps (raw streams): frames at the stream's rate
            counted = len(d.pts) / (_rate(stream) or 25.0)
        if counted > lim.max_seconds:
            raise _too_long(path, counted, lim.max_seconds, counted=True)


def _first_rotation(pkt) -> Optional[int]:
    """The display matrix reaches PyAV on decoded frames only: decode until the first frame
    comes out (a few packets at most), then just demux. None: no frame from this packet."""
    try:
        for frame in pkt.decode():
            return int(frame.rotation or 0)
    except av.error.FFmpegError:
        pass
    return None


@dataclass
class _Timeline:
    """Frames in presentation order: their pts, time base, time 0, keyframes and rate."""
    pts: np.ndarray
    time_base: float
    start: int
    keyframe: np.ndarray
    has_pts: bool
    fps: float


def _timeline(container, stream, d: _Demuxed, has_pts: bool, tb: float) -> _Timeline:
    """Sort the demuxed frames by time, or number them where their times cannot be used."""
    p = np.sort(np.asarray(d.pts, np.int64), kind="stable") if has_pts else None
    # Duplicate pts (broken muxers) would make frames indistinguishable by time.
    if has_pts and np.any(np.diff(p) <= 0):
        has_pts = False
    fps = _rate(stream)
    if has_pts:
        start, fps, keyframe = _timed(container, p, d.key_pts, tb, fps)
    else:
        # No usable timestamps (raw elementary streams): frame i is the i-th frame out of the
        # decoder, its time i / fps.
        fps = fps if fps > 0 else 25.0
        tb = 1.0 / fps
        p = np.arange(len(d.pts), dtype=np.int64)
        start = 0
        keyframe = np.zeros(len(d.pts), np.int64)
    if not (fps > 0 and math.isfinite(fps)):
        fps = 1.0 / tb if tb > 0 else 25.0
    return _Timeline(pts=p, time_base=tb, start=start, keyframe=keyframe, has_pts=has_pts,
                     fps=float(fps))


def _timed(container, p: np.ndarray, key_pts: List[int], tb: float,
           fps: float) -> Tuple[int, float, np.ndarray]:
    """For frames with usable pts (``p``, sorted): time 0, the mean frame rate, and each
    frame's keyframe to seek to."""
    n = len(p)
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
    return start, fps, keyframe

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
    try:
        return bool(av.codec.Codec(codec, "r").reorder)
    except Exception:
        return True


def _has_decoder(codec: str) -> bool:
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
