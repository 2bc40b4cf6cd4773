"""PyAV's decoding paths: exact (by presentation time, or by count where a file has no usable
timestamps), keyframes only, and GOP-parallel exact decoding over threads.

Exact decoding costs the frames from each sample's keyframe to it (about half a keyframe
interval a sample: ~125 frames on libx264's defaults), so this path (1) skips the unsampled
frames no other frame references (``skip_frame="NONREF"`` packet by packet, on the codecs in
``_NONREF_CODECS``) and (2) with ``workers`` > 1 splits the samples by keyframe interval over
threads, each with its own demuxer and decoder (:func:`split_by_gop`). ``seek="keyframe"``
instead decodes only the keyframe nearest each sample
(:func:`vr_runtime.video.decoders.keyframe_indices`): its packet alone, the decoder drained,
one frame a sample.
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import av
import numpy as np

from ..errors import VideoError
from .probe import (OnFrame, VideoIndex, _cancel, _check_cancel, _check_pixels, _clean_reason,
                    _is_attached_pic, _orient, _reason, cancel_scope)
from .workers import default_workers

__all__ = ["split_by_gop", "decode_pyav"]


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


def decode_pyav(info: VideoIndex, indices: List[int], scale: Tuple[int, int], on_frame: OnFrame,
                workers: int = 1, seek: str = "exact") -> None:
    """PyAV's backend of :func:`vr_runtime.video.decoders.decode_frames`: in parallel over
    GOPs where ``workers`` > 1, else on this thread by pts (or keyframes), else by count."""
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
    outer = getattr(_cancel, "fn", None)        # the caller's deadline, for every worker
    failed: List[BaseException] = []
    stop = threading.Event()

    def should_stop():
        if stop.is_set():
            return _STOPPED
        return outer() if outer is not None else None

    def work(share: List[int]) -> None:
        holder = [None]
        try:
            with cancel_scope(should_stop):
                holder[0] = av.open(info.open_path, metadata_errors="ignore")
                _decode_share(holder, info, indices, share, rgb, on_frame, threads, seek)
        except BaseException as e:  # kept for the caller, which raises the first
            failed.append(e)
            stop.set()
        finally:
            if holder[0] is not None:
                holder[0].close()

    _run_all([threading.Thread(target=work, args=(sh,), name=f"vr-decode-{i}", daemon=True)
              for i, sh in enumerate(shares)], stop)
    if failed:
        raise _first_failure(info, failed)


# Why a worker stops when another one failed (told apart from the failure itself).
_STOPPED = "another decoding worker stopped"


def _decode_share(holder: list, info: VideoIndex, indices: List[int], share: List[int], rgb,
                  on_frame, threads: int, seek: str) -> None:
    """One parallel worker's decode of its share (positions in ``indices``)."""
    if seek == "keyframe":
        _pyav_keyframes(holder, info, [indices[p] for p in share], rgb, on_frame,
                        positions=share)
    else:
        _pyav_by_pts(holder, info, [indices[p] for p in share], rgb, on_frame,
                     seek=seek, threads=threads, positions=share)


def _run_all(ts: List[threading.Thread], stop: threading.Event) -> None:
    """Start the threads and join every one started, also when interrupted (Ctrl-C while
    waiting sets ``stop`` so the workers end at their next packet, then re-raises)."""
    try:
        for t in ts:
            t.start()
    finally:
        try:
            for t in ts:
                if t.ident is not None:
                    t.join()
        except BaseException:
            stop.set()
            for t in ts:
                if t.ident is not None:
                    t.join()
            raise


def _first_failure(info: VideoIndex, failed: List[BaseException]) -> BaseException:
    """The error to raise for failed workers: the one that failed first on its own, not one
    stopped because of it, as one line naming the file."""
    real = [e for e in failed if not (isinstance(e, VideoError) and _STOPPED in str(e))]
    e = (real or failed)[0]
    if isinstance(e, (_NotByPts, VideoError)):
        return e
    if isinstance(e, av.error.FFmpegError):
        return VideoError(f"{info.path}: decoding the {info.codec_name} video failed; the file "
                          f"is corrupt or truncated ({_reason(e)})")
    return VideoError(f"{info.path}: a decoding worker failed ({_clean_reason(e)})")


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
