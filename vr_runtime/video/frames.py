"""The frames of one request: what the runtime knows before any pixel (how many, which source
frames, their times, the decoder's notes) and a way to get their pixels a chunk at a time.

A :class:`FrameSource` is opened cheaply (a file: checked, indexed, sampled; see
:func:`open_frames`) and read with :meth:`FrameSource.chunks`: normalised float32 ``[n, 3, S, S]``
chunks of the positions asked for, in order. A file decodes and resizes on worker threads
while the caller encodes the chunk before (:mod:`vr_runtime.video.stream`), so only a bounded
window of frames is ever held; a tensor or an already-decoded clip is sliced. The runtime's
vision stage reads every video this one way.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence

import torch

from .load import _Access, _norm, _Plan, _prepare, available_memory
from .sampling import FrameSpec, Sampling
from .stream import FrameStream, normalise

__all__ = ["FrameSource", "TensorSource", "FileSource", "open_frames", "Frames", "unit_groups"]


class FrameSource:
    """Sampled frames: ``indices`` (source frame numbers), ``times_s`` (seconds, or None),
    ``note`` (what sampling had to say), the ``decoder``/``codec``/``seek`` that made them."""
    indices: List[int]
    times_s: Optional[List[float]]
    note: Optional[str] = None
    decoder: Optional[str] = None
    codec: Optional[str] = None
    seek: Optional[str] = None
    size: tuple = ()
    #: wall seconds of the last :meth:`chunks`, from its start to its last frame (None: no
    #: decoding, or not finished)
    decode_s: Optional[float] = None
    #: the most decoded frames held at once by the last :meth:`chunks`
    held_peak: int = 0

    def __len__(self) -> int:
        return len(self.indices)

    def chunks(self, positions: Sequence[int], chunk: int,
               device=None) -> Iterator[torch.Tensor]:
        """Normalised float32 pixels ``[n, 3, H, W]`` of ``positions`` (non-decreasing; a
        position may repeat), ``chunk`` positions at a time, on ``device`` (default CPU)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the source holds open (a file)."""


def _check_positions(positions: Sequence[int], n: int) -> List[int]:
    pos = [int(p) for p in positions]
    if any(b < a for a, b in zip(pos, pos[1:])) or (pos and (pos[0] < 0 or pos[-1] >= n)):
        raise ValueError(f"positions: expected non-decreasing positions in [0, {n}), got "
                         f"{pos[:4]}...")
    return pos


class TensorSource(FrameSource):
    """Frames given as a normalised ``[T, 3, H, W]`` tensor (or a decoded clip's); ``channels``:
    3 a frame, or 3k for routing units of k frames (``Frames.pixel_values``)."""

    def __init__(self, pixel_values: torch.Tensor, indices=None, times_s=None,
                 channels: int = 3):
        if pixel_values.ndim != 4 or pixel_values.shape[1] != channels:
            raise ValueError(f"video: a tensor must be [T, {channels}, H, W] frames, got "
                             f"{tuple(pixel_values.shape)}")
        self.pixel_values = pixel_values
        T = int(pixel_values.shape[0])
        self.indices = list(range(T)) if indices is None else [int(i) for i in indices]
        self.times_s = None if times_s is None else [float(t) for t in times_s]
        self.size = tuple(pixel_values.shape[-2:])

    @classmethod
    def of_clip(cls, clip) -> "TensorSource":
        """A decoded clip's frames (a :class:`~vr_runtime.video.load.VideoClip`, or anything
        with its ``pixel_values``, ``frame_indices`` and ``timestamps_s``), with what it says
        of its decoding."""
        src = cls(clip.pixel_values, clip.frame_indices, clip.timestamps_s)
        for name in ("note", "decoder", "codec", "seek", "decode_s"):
            setattr(src, name, getattr(clip, name, None))
        return src

    def chunks(self, positions, chunk, device=None):
        pos = _check_positions(positions, len(self.indices))
        pv = self.pixel_values
        for i in range(0, len(pos), chunk):
            part = pos[i:i + chunk]
            # a run of consecutive positions is a view, not a copy
            x = pv[part[0]:part[-1] + 1] if part == list(range(part[0], part[-1] + 1)) \
                else pv[part]
            yield x if device is None else x.to(device, non_blocking=True)


class FileSource(FrameSource):
    """A video file, checked, indexed and sampled (``plan``: the loader's); its frames are
    decoded only when :meth:`chunks` asks for them, on ``plan.workers`` threads."""

    def __init__(self, plan: _Plan):
        self.plan = plan
        info = plan.info
        self.indices = list(plan.indices)
        self.times_s = [float(info.pts_s[i]) for i in plan.indices]
        self.note, self.decoder, self.codec = plan.note, plan.decoder, info.codec
        self.seek, self.size = plan.seek, (plan.size, plan.size)
        self.mean, self.std = _norm(plan.mean, "mean"), _norm(plan.std, "std")
        self.fps, self.total_frames = info.fps, info.num_frames

    @property
    def path(self) -> str:
        return self.plan.path

    @property
    def source_key(self) -> Optional[tuple]:
        """(real path, file identity, frames, window, decoder, seek[, rate]): the visual
        cache's key (a path's, for frames sampled by count; a rate samples other frames)."""
        p, f = self.plan, self.plan.info.handle
        rate = () if p.rate is None else (("fps",) + p.rate,)
        return None if f is None else (f.real_path, f.identity, int(p.num_frames),
                                       p.time_window, p.decoder, p.seek) + rate

    _prefetch: Optional[FrameStream] = None
    _t_prefetch: Optional[float] = None      # when the prefetch started (decode_s counts it)
    #: ``on_frame(source_index, frame)``, called on the decoding workers with each resized
    #: uint8 [S, S, 3] frame (vr_runtime.video.thumbnails); set it before the first read
    on_frame = None

    @property
    def display_aspect(self) -> float:
        """Width / height of the video as shown (the frames the tower reads are square)."""
        w, h = self.plan.info.display_size
        return w / h if w > 0 and h > 0 else 1.0

    def stream(self, ranks: Sequence[int], job_frames: int = 16,
               window: Optional[int] = None) -> FrameStream:
        """A :class:`FrameStream` of the sampled frames at ``ranks`` (increasing, distinct)."""
        p = self.plan
        return FrameStream(p.info, [p.indices[r] for r in ranks], p.size, p.decoder,
                           p.seek, p.workers, job_frames=job_frames, window=window,
                           should_stop=p.should_stop, on_frame=self.on_frame)

    def prefetch(self, frames: int, should_stop=None, wait: bool = True) -> "FileSource":
        """Decode the first ``frames`` sampled frames now, before the caller's turn on the
        model (the server does this off the model's lock; ``ask`` while the model loads): the
        frames the vision stage then reads come from here first, and the stream goes on from
        there. At most ``frames`` resized frames are held meanwhile. ``wait``: return once they
        are decoded (a failure is raised here); else at once."""
        frames = min(int(frames), len(self.indices), self._frames_that_fit())
        if self._prefetch is None and frames > 0:
            self._t_prefetch = time.perf_counter()
            self._prefetch = self.stream(range(len(self.indices)),
                                         window=max(int(frames), 1))
        if self._prefetch is None or not wait:
            return self
        try:
            self._prefetch.wait_filled(frames, should_stop)
        except BaseException:
            self.close_prefetch()
            raise
        return self

    def _frames_that_fit(self) -> int:
        """Resized frames that half the memory still free would hold (a prefetch takes fewer
        frames rather than fail: the rest stream later)."""
        avail = available_memory()
        return 1 << 30 if avail is None else int(avail // 2 // (3 * self.size[0] * self.size[1]))

    def close_prefetch(self) -> None:
        s, self._prefetch = self._prefetch, None
        if s is not None:
            s.close()

    def _frames_of(self, ranks: List[int], chunk: int) -> Iterator:
        """(rank, frame) of ``ranks`` (increasing, distinct) in order: from the prefetched
        stream (its frames already decoded first; it goes on when every frame is wanted), then
        from a stream of the rest."""
        pre, start = self._prefetch, 0
        if pre is not None:
            self._prefetch = None
            wanted = set(ranks)
            every = len(ranks) == len(self.indices)
            try:
                with pre:
                    r = 0
                    while r < len(self.indices) and (every or pre.ready(r)):
                        frame = pre.take(r)
                        if r in wanted:
                            yield r, frame
                        r += 1
                    self.held_peak = pre.held_peak
            finally:   # once the workers are joined: the decoder that delivered, not "auto"
                self.decoder = pre.used or self.decoder
            start = next((i for i, x in enumerate(ranks) if x >= r), len(ranks))
        rest = ranks[start:]
        if rest:
            s = self.stream(rest, max(chunk, 8))
            try:
                with s:
                    for i, r in enumerate(rest):
                        yield r, s.take(i)
                    self.held_peak = max(self.held_peak, s.held_peak)
            finally:
                self.decoder = s.used or self.decoder

    def chunks(self, positions, chunk, device=None):
        pos = _check_positions(positions, len(self.indices))
        last_use = {p: i for i, p in enumerate(pos)}
        t0 = self._t_prefetch if self._prefetch is not None else None
        t0 = time.perf_counter() if t0 is None else t0
        self.decode_s = None
        frames = self._frames_of(sorted(set(pos)), chunk)
        try:
            held = {}
            for i in range(0, len(pos), chunk):
                part = pos[i:i + chunk]
                out = torch.empty(len(part), 3, *self.size, dtype=torch.uint8)
                for j, p in enumerate(part):
                    while p not in held:      # frames come in rank order
                        r, f = next(frames)
                        held[r] = f
                    out[j] = torch.from_numpy(held[p]).permute(2, 0, 1)
                    if last_use[p] == i + j:
                        del held[p]
                if i + chunk >= len(pos):
                    self.decode_s = time.perf_counter() - t0
                yield normalise(out, self.mean, self.std, device)
                del out
        finally:
            frames.close()      # stops and joins the decoding workers

    def close(self) -> None:
        self.close_prefetch()
        f = self.plan.info.handle
        if f is not None:
            f.close()


def open_frames(path, sampling: Optional[Sampling] = None, spec: Optional[FrameSpec] = None,
                *, memory_limit: Optional[int] = None, should_stop=None, limits=None,
                decode_workers: Optional[int] = None) -> FileSource:
    """Check, index and sample ``path`` as ``sampling`` asks (default: the paper's 64 frames)
    for a model that takes frames as ``spec`` says (a backbone's ``frame_spec``; default
    InternVL's 448x448 ImageNet-normalised frames) -> a :class:`FileSource` that decodes
    nothing until it is read. Every check of :func:`~vr_runtime.video.load.load_video` runs
    here: a bad file or argument raises ``VideoError`` at once."""
    plan = _prepare(path, sampling or Sampling(), spec or FrameSpec.square(),
                    _Access(memory_limit, should_stop, limits, decode_workers, streaming=True))
    return FileSource(plan)


@dataclass
class Frames:
    """The frames of one request as the model's stages see them: routing units of ``k``
    consecutive sampled frames (``k`` > 1 for a backbone with a temporal patch; the last unit
    padded with the last frame), each unit's first source index and time, and the source that
    gives their pixels. ``pixel_values`` (units ``[T, 3k, H, W]``) is filled only for a scorer
    that reads pixels; otherwise no pixel outlives the vision stage."""
    source: FrameSource
    indices: List[int]
    times_s: Optional[List[float]]
    notes: List[str]
    k: int = 1
    pixel_values: Optional[torch.Tensor] = None
    #: wall seconds of opening and decoding the frames (None: none decoded for this request)
    decode_s: Optional[float] = None
    open_s: float = 0.0

    @classmethod
    def of(cls, source: FrameSource, units, notes: Optional[List[str]] = None,
           open_s: float = 0.0) -> "Frames":
        """``units(pixel_values, indices, times)``: the backbone's grouping of frames into
        units (``Backbone.units``), asked here for the units' first indices and times only."""
        n = len(source)
        probe = torch.zeros(n, 3, 1, 1)
        pv, indices, times = units(probe, source.indices, source.times_s)
        k = int(pv.shape[1]) // 3
        base = [source.note] if source.note else []
        return cls(source, list(indices), None if times is None else list(times),
                   base + list(notes or []), k, None, source.decode_s, open_s)

    @property
    def T(self) -> int:
        return len(self.indices)

    @property
    def decoder(self) -> Optional[str]:
        return self.source.decoder

    @property
    def codec(self) -> Optional[str]:
        return self.source.codec

    @property
    def seek(self) -> Optional[str]:
        return self.source.seek

    def positions(self, units: Sequence[int]) -> List[int]:
        """The sampled frames' positions of ``units``, unit by unit (padding repeats)."""
        groups = unit_groups(len(self.source), self.k)
        return [p for u in units for p in groups[u]]

    def unit_chunks(self, units: Sequence[int], chunk: int, device=None) -> Iterator:
        """Normalised pixels of ``units``, ``chunk`` units at a time, as ``[n, 3k, H, W]``
        (frames of a unit side by side on the channel axis, as ``Backbone.units`` lays them).
        Closing this generator stops the source's decoding workers."""
        if self.pixel_values is not None:   # units [T, 3k, H, W], held whole
            yield from TensorSource(self.pixel_values, channels=3 * self.k).chunks(
                list(units), chunk, device)
            return
        k = self.k
        gen = self.source.chunks(self.positions(units), chunk * k, device)
        try:
            for x in gen:
                yield x if k == 1 else x.reshape(x.shape[0] // k, 3 * k, *x.shape[-2:])
        finally:
            gen.close()

    def all_pixels(self, chunk: int = 16) -> torch.Tensor:
        """Every unit's pixels ``[T, 3k, H, W]`` on the CPU, held at once (a scorer that reads
        pixels; tests): the whole clip's memory, which the vision stage never needs."""
        if self.pixel_values is None:
            self.pixel_values = torch.cat(list(self.unit_chunks(range(self.T), chunk)))
            self.finished()
        return self.pixel_values

    def finished(self) -> None:
        """Record the source's decoding time once its stream has ended."""
        if self.source.decode_s is not None:
            self.decode_s = self.open_s + self.source.decode_s


def unit_groups(n: int, k: int) -> List[List[int]]:
    """Positions of each unit of ``k`` consecutive frames among ``n``; the last one padded with
    the last frame (as Qwen's processor pads a video to a multiple of its temporal patch)."""
    return [[min(i + j, n - 1) for j in range(k)] for i in range(0, n, k)]
