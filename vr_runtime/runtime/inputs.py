"""The frames stage of :class:`~vr_runtime.runtime.pipeline.VideoRouter`: a request's video input
(a path, an opened FileSource, a [T,3,H,W] tensor, a VideoClip or a Future of one) opened as a
:class:`~vr_runtime.video.frames.FrameSource` and grouped into the backbone's routing units
(:class:`~vr_runtime.video.frames.Frames`). Nothing is decoded here: the vision stage streams the
frames. ``fps`` sampling is resolved here too, since it needs the opened file's duration."""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import pathlib
import time
from typing import Optional

import torch

from ..errors import VideoError
from ..request import Request
from ..telemetry.timing import StageTimer
from ..video import frames as video_frames   # looked up per call: tests swap its functions
from ..video.frames import FileSource, Frames, FrameSource, TensorSource
from ..video.sampling import Sampling
from .cache import VisualEntry


def open_source(lm, video, sampling: Sampling) -> FrameSource:
    """A FrameSource of a video input for backbone ``lm``: a path (opened: checked, indexed,
    sampled as ``sampling`` says, at ``lm``'s frame spec), a FileSource, a [T,3,H,W] tensor, a
    VideoClip or a Future of one. The one place a video is opened for a backbone."""
    if isinstance(video, torch.Tensor):
        if sampling.time_window is not None:
            raise ValueError("time_window: only applies to a video file, not to a frame tensor")
        return TensorSource(video)
    if isinstance(video, FrameSource):
        return video
    if isinstance(video, (str, pathlib.Path)):
        return video_frames.open_frames(str(video), sampling, lm.frame_spec)
    if isinstance(video, cf.Future):  # from vr_runtime.video.load.prefetch_video
        video = video.result()
    if hasattr(video, "pixel_values") and hasattr(video, "frame_indices"):
        return TensorSource.of_clip(video)
    raise VideoError(f"video: expected a path, a VideoClip, a Future of one or a "
                     f"[T,3,H,W] tensor, got {type(video).__name__}")


def with_rate(lm, req: Request) -> Request:
    """``fps`` sampling: the file is opened now, its duration gives the frame count, and the
    request reads those frames of the opened file (the budget and ``scales="auto"`` are then
    those of the real count). A request without ``fps`` is returned as it is."""
    if req.fps is None:
        return req
    source = req.video
    if isinstance(source, (str, pathlib.Path)):
        source = open_source(lm, source, req.sampling)
    elif not isinstance(source, FileSource):   # (a FileSource: opened by rate already)
        raise ValueError("fps: samples a video file by rate; give a path (frames given as "
                         "a tensor or a clip are already sampled)")
    opts = dataclasses.replace(req.options, num_frames=source.plan.num_frames, fps=None,
                               time_window=None)
    return Request.build(source, req.question, opts, lm=lm)


def request_frames(lm, req: Request, timer: StageTimer,
                   state: Optional[VisualEntry] = None) -> Frames:
    """The request's frames, opened (timed as "frames"; nothing is decoded before the vision
    stage streams it), or the video cache's (``state``: its entry, which then keeps them); as
    routing units."""
    if state is not None and state.frames is not None:
        f = state.frames
        return dataclasses.replace(f, notes=list(f.notes), decode_s=None, open_s=0.0)
    t0 = time.perf_counter()
    with timer.stage("frames"):
        source = open_source(lm, req.video, req.sampling)
    if tuple(source.size) != tuple(lm.frame_spec.size):
        raise ValueError(f"video: frames are {tuple(source.size)}, the model expects "
                         f"{tuple(lm.frame_spec.size)}")
    if len(source) == 0:
        raise ValueError("video: no frames to answer from")
    notes = []
    if isinstance(req.video, torch.Tensor) and len(source) != req.num_frames:
        notes.append(f"{len(source)} frames were given as a tensor; "
                     f"num_frames={req.num_frames} was not applied")
    frames = Frames.of(source, lm.units, notes, time.perf_counter() - t0)
    if state is not None:
        state.frames = frames
    return frames


__all__ = ["open_source", "with_rate", "request_frames"]
