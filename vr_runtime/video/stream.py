"""Sampled frames as a stream: decoded and resized on worker threads, handed over in order, a
bounded window at a time.

Why: a long video (768 to 2,048 sampled frames, as Qwen3-VL and LLaVA-OneVision users sample)
held whole before the vision tower sees any frame costs 2.4 MB a frame as float32 at 448x448
(4.9 GB at 2,048 frames), and a resize behind one lock leaves every other core idle. Here:

* the sampled frames are cut into *jobs*: runs of frames that share no keyframe with the next
  run (so no GOP is decoded twice), of about ``job_frames`` frames each;
* ``workers`` threads take the jobs in order; each decodes its job with its own demuxer and
  decoder (:func:`~vr_runtime.video.decoders.decode_frames`) and resizes each frame right
  there (PIL releases the GIL), so decoding and resizing run on every core;
* a frame waits in a reorder buffer until the consumer asks for it, in order; a worker whose
  frame lies more than ``window`` frames ahead of the consumer waits, so at most ``window``
  resized uint8 frames (0.6 MB each at 448x448) are held, however long the video;
* the consumer (the vision stage) gets uint8 ``[n, 3, size, size]`` chunks and normalises them
  where the tower runs (:func:`normalise`), a chunk at a time.

The frames are the loader's byte for byte: the same decoders, PIL's bicubic resize of each
frame, and the normalisation's float32 arithmetic unchanged (tests compare them with
:func:`vr_runtime.video.load.preprocess_frames`).

A worker that fails stops the stream: the other workers stop at their next packet or frame,
every thread is joined, and the consumer raises the first failure as one line naming the file.
``close`` (the consumer is done, failed, or was interrupted) does the same, so no thread
outlives the request.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np
import torch
from PIL import Image

from ..errors import VideoError
from .decoders import cancel_scope, decode_frames, scaled_size
from .probe import VideoIndex

__all__ = ["FrameStream", "resize_frame", "normalise", "gop_jobs"]

_BICUBIC = getattr(getattr(Image, "Resampling", Image), "BICUBIC")
# How long a waiting thread sleeps before it looks again at a stop or a Ctrl-C.
_POLL_S = 0.05


def resize_frame(frame: np.ndarray, size: int) -> np.ndarray:
    """One uint8 RGB frame [H, W, 3] -> [size, size, 3] by PIL's bicubic resize (InternVL's
    transform: a non-square frame is squeezed, the whole frame kept); a frame already of that
    size is returned as it is."""
    frame = np.ascontiguousarray(frame, dtype=np.uint8)
    if frame.shape[:2] == (size, size):
        return frame
    # np.array: a writable array (torch refuses to wrap a read-only one without a warning)
    return np.array(Image.fromarray(frame).resize((size, size), _BICUBIC))


def normalise(frames: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
              device=None) -> torch.Tensor:
    """uint8 ``[n, 3, H, W]`` -> float32 normalised ``(x - mean) / std`` on the 0..255 scale,
    on ``device`` (the uint8 frames cross to it first: 4x fewer bytes than float32). ``mean``
    and ``std``: float32 ``[1, 3, 1, 1]`` on the 0..1 scale. The loader's arithmetic exactly:
    a float32 subtraction and a division, each correctly rounded on CPU and CUDA alike."""
    x = frames.to(device, non_blocking=True) if device is not None else frames
    x = x.float()
    return x.sub_((mean * 255.0).to(x.device)).div_((std * 255.0).to(x.device))


def gop_jobs(info: VideoIndex, indices: Sequence[int], job_frames: int) -> List[List[int]]:
    """Ranks 0..n-1 of the sampled ``indices`` cut into jobs of about ``job_frames`` frames,
    each cut between two frames of different keyframes (a GOP is decoded by one job only).
    A file without a keyframe index is one job (it decodes by count, from the top)."""
    n = len(indices)
    if n == 0:
        return []
    if not info.has_pts:
        return [list(range(n))]
    jobs: List[List[int]] = [[0]]
    for r in range(1, n):
        same_gop = int(info.keyframe[indices[r]]) == int(info.keyframe[indices[r - 1]])
        if len(jobs[-1]) >= job_frames and not same_gop:
            jobs.append([])
        jobs[-1].append(r)
    return jobs


class _Stopped(Exception):
    """The stream was closed while a worker waited to hand over a frame."""


class FrameStream:
    """The frames at ``indices`` of ``info`` (increasing, distinct), decoded by ``decoder``,
    scaled by the decoder to the frame's aspect (``scaled_size``) and resized to ``size`` x
    ``size``.

    Iterate :meth:`take` over ranks 0, 1, ... in order (each once), then :meth:`close`; or use
    it as a context manager. ``should_stop()``: the caller's deadline, asked between packets
    (a reason string stops the stream with a ``VideoError``). ``on_frame(index, frame)``: called
    on the worker with each resized frame and its source frame index, before it is handed
    over (the pages' thumbnails, made from this decode rather than a second one)."""

    def __init__(self, info: VideoIndex, indices: Sequence[int], size: int,
                 decoder: str = "auto", seek: str = "exact", workers: int = 1,
                 job_frames: int = 16, window: Optional[int] = None,
                 should_stop: Optional[Callable[[], Optional[str]]] = None,
                 on_frame: Optional[Callable[[int, np.ndarray], None]] = None):
        self.info, self.indices = info, [int(i) for i in indices]
        self.on_frame = on_frame
        # the decoder scales to the frame's aspect first (video.decoders.scaled_size)
        self.scale = scaled_size(info.width, info.height, int(size))
        self.size, self.seek = int(size), seek
        self.jobs = gop_jobs(info, self.indices, max(1, int(job_frames)))
        self.workers = max(1, min(int(workers), len(self.jobs) or 1))
        # One job: the decoder chosen for the file (decord where "auto" would take it); several:
        # PyAV, whose seeks are exact and cheap (decord re-indexes the file for every reader).
        # (as decode_frames chooses for parallel workers)
        parallel = int(workers) > 1 or len(self.jobs) > 1
        self.decoder = "pyav" if decoder == "auto" and parallel and info.has_pts else decoder
        if decoder not in ("auto", "pyav") and len(self.jobs) > 1:
            self.jobs = [list(range(len(self.indices)))]
            self.workers = 1
        longest = max((len(j) for j in self.jobs), default=1)
        # Room for every worker's job at once, so that no worker waits on another's turn.
        self.window = int(window) if window is not None else (self.workers + 1) * longest
        self._outer = should_stop
        self._cond = threading.Condition()
        self._frames: Dict[int, np.ndarray] = {}
        self._next = 0                 # the rank the consumer takes next
        self._next_job = 0
        self._failed: List[BaseException] = []
        self._closed = False
        self.used: Optional[str] = None        # the decoder that delivered
        self.t0 = time.perf_counter()
        self.wall_s: Optional[float] = None    # start to the last frame handed over
        self.held_peak = 0                     # the most resized frames held at once
        self._threads = [threading.Thread(target=self._work, name=f"vr-frames-{i}", daemon=True)
                         for i in range(self.workers)]
        for t in self._threads:
            t.start()

    def __len__(self) -> int:
        return len(self.indices)

    # ------------------------------------------------------------------ workers
    def _stop_reason(self) -> Optional[str]:
        if self._closed:
            return "the frame stream was closed"
        return self._outer() if self._outer is not None else None

    def _claim_job(self) -> Optional[List[int]]:
        with self._cond:
            if self._closed or self._next_job >= len(self.jobs):
                return None
            job = self.jobs[self._next_job]
            self._next_job += 1
            return job

    def _work(self) -> None:
        try:
            with cancel_scope(self._stop_reason):
                while True:
                    job = self._claim_job()
                    if job is None:
                        return
                    self._decode_job(job)
        except _Stopped:
            return
        except BaseException as e:   # handed to the consumer, which raises the first
            with self._cond:
                if not self._closed:
                    self._failed.append(e)
                self._closed = True
                self._cond.notify_all()

    def _decode_job(self, job: List[int]) -> None:
        first = job[0]

        def on_frame(i: int, frame: np.ndarray) -> None:
            resized = resize_frame(frame, self.size)
            if self.on_frame is not None:
                self.on_frame(self.indices[first + i], resized)
            self._put(first + i, resized)

        used = decode_frames(self.info, [self.indices[r] for r in job], self.scale, on_frame,
                             self.decoder, workers=1, seek=self.seek)
        with self._cond:
            self.used = self.used or used
            missing = [r for r in job if r >= self._next and r not in self._frames]
            if missing:
                k = self.indices[missing[0]]
                raise VideoError(f"{self.info.path}: frame {k} of the {self.info.codec_name} "
                                 f"video did not decode; the file is corrupt or truncated")

    def _put(self, rank: int, frame: np.ndarray) -> None:
        with self._cond:
            while rank >= self._next + self.window and not self._closed:
                self._cond.wait(_POLL_S)
            if self._closed:
                raise _Stopped()
            if rank >= self._next:      # a restarted decode may deliver a taken frame again
                self._frames[rank] = frame
                self.held_peak = max(self.held_peak, len(self._frames))
                self._cond.notify_all()

    # ------------------------------------------------------------------ the consumer
    def ready(self, rank: int) -> bool:
        """Whether the frame of ``rank`` is decoded and waiting (``take`` would not wait)."""
        with self._cond:
            return rank in self._frames

    def wait_filled(self, frames: int, should_stop=None) -> None:
        """Wait until the first ``frames`` frames are decoded (or the stream failed: raised
        here), asking ``should_stop()`` between looks (a reason stops the wait with a
        ``VideoError``)."""
        n = min(int(frames), len(self.indices))
        with self._cond:
            while not all(r in self._frames for r in range(self._next, n)):
                if self._failed:
                    raise self._failure()
                why = should_stop() if should_stop is not None else None
                if why or (self._closed and not self._failed):
                    raise VideoError(f"{self.info.path}: decoding stopped: "
                                     f"{why or 'the frame stream was closed'}")
                if not any(t.is_alive() for t in self._threads):
                    return      # take() names the missing frame
                self._cond.wait(_POLL_S)

    def take(self, rank: int) -> np.ndarray:
        """The resized frame of rank ``rank`` ([size, size, 3] uint8), the ranks taken in
        order; waits for it (a Ctrl-C meanwhile is raised here)."""
        with self._cond:
            if rank != self._next:
                raise ValueError(f"FrameStream.take: rank {rank} out of order (next is "
                                 f"{self._next})")
            while rank not in self._frames:
                if self._failed:
                    raise self._failure()
                if self._closed:
                    raise VideoError(f"{self.info.path}: the frame stream was closed")
                if not any(t.is_alive() for t in self._threads):
                    raise VideoError(f"{self.info.path}: frame {self.indices[rank]} was never "
                                     f"decoded; the file is corrupt or truncated")
                self._cond.wait(_POLL_S)
            frame = self._frames.pop(rank)
            self._next = rank + 1
            if self._next == len(self.indices):
                self.wall_s = time.perf_counter() - self.t0
            self._cond.notify_all()
            return frame

    def _failure(self) -> BaseException:
        e = self._failed[0]
        if isinstance(e, VideoError):
            return e
        return VideoError(f"{self.info.path}: a decoding worker failed ({type(e).__name__}: {e})")

    def close(self) -> None:
        """Stop the workers (at their next packet or frame) and join them; drop held frames."""
        with self._cond:
            self._closed = True
            self._frames.clear()
            self._cond.notify_all()
        for t in self._threads:
            if t.ident is not None and t is not threading.current_thread():
                t.join()

    def __enter__(self) -> "FrameStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __iter__(self) -> Iterator[np.ndarray]:
        for r in range(len(self.indices)):
            yield self.take(r)
