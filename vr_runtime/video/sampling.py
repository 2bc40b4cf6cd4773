"""What a request asks of a video file, in two small values: :class:`Sampling` (which frames,
and how they are decoded) and :class:`FrameSpec` (how a decoded frame becomes model input).
The defaults of both live here, once; the request, the CLI, the server and the evaluation
read them from here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: ``fps`` sampling's bounds on the frame count (Qwen2.5-VL's and Qwen3-VL's processors)
MIN_FRAMES = 4
MAX_FRAMES = 768
#: the paper's frame count
NUM_FRAMES = 64


@dataclass(frozen=True)
class FrameSpec:
    """How a decoded RGB frame becomes model input: resized to ``size`` (H, W), scaled to [0, 1]
    and normalised with ``mean`` / ``std`` per channel."""
    size: Tuple[int, int]
    mean: Tuple[float, float, float]
    std: Tuple[float, float, float]

    @classmethod
    def square(cls, size: int = 448, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> "FrameSpec":
        """``size`` x ``size`` frames (InternVL's 448 and ImageNet's statistics by default).
        The values are kept as given: the loader checks them and says what is wrong."""
        return cls((size, size), mean, std)


@dataclass(frozen=True)
class Sampling:
    """Which frames of a file to read: ``num_frames`` spread over the file (or its
    ``time_window`` = (start_s, end_s)); or, with ``fps``, that many frames a second, between
    ``min_frames`` and ``max_frames``. ``decoder`` and ``seek``: how they are decoded
    (:func:`vr_runtime.video.load.load_video`)."""
    num_frames: int = NUM_FRAMES
    time_window: Optional[Tuple[float, float]] = None
    fps: Optional[float] = None
    min_frames: int = MIN_FRAMES
    max_frames: int = MAX_FRAMES
    decoder: str = "auto"
    seek: str = "exact"

    @property
    def rate(self) -> Optional[tuple]:
        """(fps, min_frames, max_frames) when sampled by rate, else None."""
        return None if self.fps is None else (self.fps, self.min_frames, self.max_frames)

    @property
    def window(self) -> Optional[tuple]:
        return None if self.time_window is None else tuple(self.time_window)


__all__ = ["FrameSpec", "Sampling", "IMAGENET_MEAN", "IMAGENET_STD", "MIN_FRAMES", "MAX_FRAMES",
           "NUM_FRAMES"]
