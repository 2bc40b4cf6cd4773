"""The needle task: long clips (5-20 minutes) in which the answer is on screen for 2 seconds.

A clip (default 384x216, 4 fps, H.264) shows a plain background with sensor noise and one small
*distractor* that wanders across the frame on most frames (absent in a few gaps), in a color no
target has. Three *targets*, of three distinct colors and three distinct shapes, are each on
screen for 2 seconds (8 frames at 4 fps), at a random place and a random time, never two at
once. One question a target: "What shape is the {color} object?" (options circle / square /
triangle / none). A sampler that misses the 2 seconds, or a prompt that loses them, cannot
answer; a prompt of hundreds of frames that keeps them may still fail (the long-prompt
planners, ``planning/long_prompt.py``).

Generation is fast by design: low resolution and frame rate, the shapes and noise drawn with
numpy, and a keyframe every ``gop_s`` seconds so that decoding a sampled frame never decodes
more than one GOP. Everything is deterministic given the seed (noise seeded per frame).
"""
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import List, Optional, Tuple

import av
import numpy as np

from .synthetic_videos import BACKGROUNDS, COLORS, SHAPES, shape_mask

TEMPLATE = "What shape is the {color} object?"
OPTIONS = SHAPES + ("none",)
EVENT_S = 2.0          # each target's time on screen
TARGET_R = (0.22, 0.30)      # radius as a fraction of the shorter side (the tiny model's task)
DISTRACTOR_R = (0.08, 0.11)
DISTRACTOR_ON = 0.8    # the share of frames the distractor is on screen


@dataclass
class Target:
    color: str
    shape: str
    start: int          # first frame on screen
    frames: int         # frames on screen
    cx: int
    cy: int
    r: int


@dataclass
class NeedleSpec:
    duration_s: float
    fps: float = 4.0
    width: int = 384
    height: int = 216
    background: str = "black"
    targets: List[Target] = field(default_factory=list)
    distractor: Tuple[str, str, int] = ("yellow", "circle", 20)   # color, shape, radius
    path_seed: int = 0      # the distractor's wandering
    noise: float = 4.0      # Gaussian std in grey levels
    noise_seed: int = 0
    gop_s: float = 2.0      # seconds between keyframes
    crf: int = 30

    @property
    def num_frames(self) -> int:
        return int(round(self.duration_s * self.fps))

    def to_dict(self) -> dict:
        return asdict(self)

    def questions(self) -> List[dict]:
        """One question a target: its color named, its shape the answer."""
        return [{"question": TEMPLATE.format(color=t.color), "answer": t.shape,
                 "color": t.color, "start_s": t.start / self.fps,
                 "end_s": (t.start + t.frames) / self.fps} for t in self.targets]


def sample_needle(rng: random.Random, duration_s: float, fps: float = 4.0, width: int = 384,
                  height: int = 216, noise: float = 4.0) -> NeedleSpec:
    """A clip of ``duration_s`` seconds: three targets (distinct colors and shapes) at random
    times at least their own length apart, a distractor of a fourth color."""
    T = int(round(duration_s * fps))
    n = max(1, int(round(EVENT_S * fps)))
    if T < 6 * n:
        raise ValueError(f"duration_s {duration_s}: a needle clip needs at least "
                         f"{6 * n / fps:g} s (three {EVENT_S:g} s events apart)")
    colors = rng.sample(sorted(COLORS), 4)
    shapes = rng.sample(SHAPES, 3)
    side = min(width, height)
    # three sorted draws in the room left once the spacing is set aside: always feasible,
    # where drawing starts one by one and retrying can paint itself into a corner
    room = T - n - 4 * n
    starts = [u + 2 * n * i for i, u in enumerate(sorted(rng.randint(0, room) for _ in range(3)))]
    targets = []
    for c, sh, s in zip(colors, shapes, starts):
        r = rng.randint(math.ceil(TARGET_R[0] * side), int(TARGET_R[1] * side))
        targets.append(Target(c, sh, s, n, rng.randint(r + 2, width - r - 3),
                              rng.randint(r + 2, height - r - 3), r))
    dr = rng.randint(math.ceil(DISTRACTOR_R[0] * side), int(DISTRACTOR_R[1] * side))
    return NeedleSpec(duration_s, fps, width, height, rng.choice(sorted(BACKGROUNDS)), targets,
                      (colors[3], rng.choice(SHAPES), dr), rng.randrange(2 ** 31), noise,
                      rng.randrange(2 ** 31))


def distractor_track(spec: NeedleSpec) -> List[Optional[Tuple[int, int]]]:
    """The distractor's centre on each frame (None: off screen): a random walk that bounces
    off the edges, absent in a few gaps that add up to about 1 - DISTRACTOR_ON of the clip."""
    rng = np.random.default_rng(spec.path_seed)
    T, r = spec.num_frames, spec.distractor[2]
    lo = np.array([r + 1, r + 1], float)
    hi = np.array([spec.width - r - 2, spec.height - r - 2], float)
    pos = lo + rng.random(2) * (hi - lo)
    vel = rng.normal(0, 6, 2)
    on = np.ones(T, bool)
    gap = max(1, int(4 * spec.fps))
    for _ in range(int(round((1 - DISTRACTOR_ON) * T / gap))):
        s = int(rng.integers(0, max(1, T - gap)))
        on[s:s + gap] = False
    out: List[Optional[Tuple[int, int]]] = []
    for t in range(T):
        vel = 0.9 * vel + rng.normal(0, 2, 2)
        pos = pos + vel
        for k in range(2):   # bounce off the edges
            if pos[k] < lo[k] or pos[k] > hi[k]:
                vel[k] = -vel[k]
                pos[k] = min(max(pos[k], lo[k]), hi[k])
        out.append((int(pos[0]), int(pos[1])) if on[t] else None)
    return out


def _paint(img: np.ndarray, shape: str, cx: int, cy: int, r: int, color: str) -> None:
    h, w = img.shape[:2]
    x0, y0 = max(cx - r, 0), max(cy - r, 0)
    x1, y1 = min(cx + r + 1, w), min(cy + r + 1, h)
    if x1 > x0 and y1 > y0:
        box = shape_mask(shape, cx - x0, cy - y0, r, x1 - x0, y1 - y0)
        img[y0:y1, x0:x1][box] = COLORS[color]


def render(spec: NeedleSpec, t: int, track=None) -> np.ndarray:
    """Frame ``t`` as uint8 [height, width, 3] RGB."""
    img = np.empty((spec.height, spec.width, 3), np.uint8)
    img[:] = BACKGROUNDS[spec.background]
    where = (track or distractor_track(spec))[t]
    if where is not None:
        color, shape, r = spec.distractor
        _paint(img, shape, where[0], where[1], r, color)
    for g in spec.targets:
        if g.start <= t < g.start + g.frames:
            _paint(img, g.shape, g.cx, g.cy, g.r, g.color)
    if spec.noise > 0:
        noise = np.random.default_rng([spec.noise_seed, t]).standard_normal(img.shape,
                                                                           dtype=np.float32)
        img = np.clip(np.rint(img.astype(np.float32) + noise * np.float32(spec.noise)),
                      0, 255).astype(np.uint8)
    return img


def write_needle_video(path: str, spec: NeedleSpec) -> str:
    """``spec`` as an H.264 mp4 (PyAV), a keyframe every ``spec.gop_s`` seconds."""
    if spec.width % 2 or spec.height % 2:
        raise ValueError(f"frame size {spec.width}x{spec.height}: yuv420p needs even sides")
    track = distractor_track(spec)
    with av.open(path, mode="w") as container:
        stream = container.add_stream("libx264", rate=Fraction(spec.fps).limit_denominator(1000))
        stream.width, stream.height = spec.width, spec.height
        stream.pix_fmt = "yuv420p"
        gop = max(1, int(round(spec.gop_s * spec.fps)))
        stream.codec_context.gop_size = gop
        stream.options = {"crf": str(spec.crf), "preset": "veryfast", "keyint_min": str(gop),
                          "sc_threshold": "0", "bf": "0"}
        for t in range(spec.num_frames):
            frame = av.VideoFrame.from_ndarray(render(spec, t, track), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


__all__ = ["NeedleSpec", "Target", "sample_needle", "render", "write_needle_video",
           "distractor_track", "TEMPLATE", "OPTIONS", "EVENT_S"]
