"""The synthetic evidence task: short videos whose answers need known frames.

Each video (default 16 frames, 448x448, 2 fps) has a plain background. Frames either stay empty
or show one saturated shape: two big *targets* of different colors, each in its own 2-3 frames,
and small distractors of other colors in 3-6 other frames; at least one color is absent.

- Object questions ("What shape is the red object?") need the frames where the named color
  appears: those frames are labelled 1, all others 0; policy 1 (Fragment). With two targets in
  disjoint frames, the router has to read the color named in the question.
- Absent-color questions: Fragment, no frame relevant (the runtime's Global fallback), "none".
- Global questions ("What is the background color?") are about the whole video: policy 0 and no
  frame labels in the Stage 3 file; ``questions()`` reports all-zero labels for them.

Question wording comes from a template grammar with a held-out split (below). Everything is
deterministic given the seed.

That is task v1, the default. Task v2 (``write_dataset(task="v2")``) widens it to what real
footage varies, one recorded value of each factor a video (``FACTORS``; ``sample_spec_v2``):
aspect ratio (written at 448x336, 640x360, 360x640 and squeezed to the square model input by the
loader), codec (H.264, VP9, AV1 at a high CRF) and sensor noise, moving and resizing objects,
one to three targets, 8 to 64 sampled of 16 to 256 source frames (labels per *sampled* frame,
from the runtime's own ``sample_indices``), and distractors that share a target's color (small,
another shape, never labelled; the questions then say "large"/"big") or its shape (target-sized,
another color). Its training split draws every factor at random; its held-out split varies one
factor at a time around a base setting (``heldout_settings``).
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import os
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Dict, List, Optional

import av
import numpy as np

from .jsonl import write_jsonl

COLORS: Dict[str, tuple] = {
    "red": (230, 25, 25), "green": (25, 200, 40), "blue": (30, 60, 235),
    "yellow": (240, 220, 20), "magenta": (220, 30, 220), "cyan": (20, 210, 220),
}
BACKGROUNDS: Dict[str, tuple] = {"black": (0, 0, 0), "white": (255, 255, 255),
                                 "gray": (128, 128, 128)}
SHAPES = ("circle", "square", "triangle")

# --- question wording: a small template grammar ------------------------------------------------
# Fragment (object) questions: every lead x attribute word x noun; Global (background) questions:
# every lead x background word. A fixed quarter of each family (chosen by a hash of the template,
# so it does not depend on the order below) is *held out*: never written to a training split,
# used only in held-out questions, so the Semantic Router / Image Router / answers can be
# reported on wordings they never saw. Every single word of a held-out template still occurs in
# some training template (only the combination is new), and the original three wordings of each
# family stay in training.
_FRAG_LEADS = (
    "What {attr} is the {color} {noun}?",
    "What is the {attr} of the {color} {noun}?",
    "Tell me the {attr} of the {color} {noun}.",
    "Identify the {attr} of the {color} {noun}.",
    "Name the {attr} of the {color} {noun}.",
    "Which {attr} does the {color} {noun} have?",
    "The {color} {noun} appears briefly. What {attr} is it?",
    "Look for the {color} {noun}: what {attr} is it?",
    "In the video, what {attr} is the {color} {noun}?",
    "Describe the {attr} of the {color} {noun}.",
)
_FRAG_ATTRS = ("shape", "form", "outline", "geometry")
_FRAG_NOUNS = ("object", "thing", "item", "figure")
_GLOBAL_LEADS = (
    "What is the {bg} color?",
    "What color is the {bg} of the video?",
    "Across the whole video, which color fills the {bg}?",
    "Tell me the color of the {bg}.",
    "Identify the color of the {bg}.",
    "Name the {bg} color.",
    "Which color is the {bg} throughout the video?",
    "Describe the color of the {bg}.",
    "What color fills the {bg} in every frame?",
    "In the video, what is the color of the {bg}?",
)
_GLOBAL_BGS = ("background", "backdrop", "scene background", "canvas")
# the wordings of the original task: always in the training split
_ALWAYS_TRAIN = {"What shape is the {color} object?", "Which shape has the color {color}?",
                 "The {color} thing appears briefly. What shape is it?",
                 "What is the background color?", "What color is the background of the video?",
                 "Across the whole video, which color fills the background?"}


def _heldout(template: str) -> bool:
    if template in _ALWAYS_TRAIN:
        return False
    return int(hashlib.sha1(template.encode()).hexdigest(), 16) % 4 == 0


def _expand_fragment() -> List[str]:
    out = ["Which shape has the color {color}?"]
    for lead in _FRAG_LEADS:
        for attr in _FRAG_ATTRS:
            for noun in _FRAG_NOUNS:
                out.append(lead.replace("{attr}", attr).replace("{noun}", noun))
    return sorted(set(out))


def _expand_global() -> List[str]:
    return sorted({lead.replace("{bg}", bg) for lead in _GLOBAL_LEADS for bg in _GLOBAL_BGS})


_ALL_FRAG, _ALL_GLOBAL = _expand_fragment(), _expand_global()
# {"train"|"heldout": templates}; Fragment templates hold one {color} slot
FRAGMENT_PHRASINGS = {"train": tuple(t for t in _ALL_FRAG if not _heldout(t)),
                      "heldout": tuple(t for t in _ALL_FRAG if _heldout(t))}
GLOBAL_PHRASINGS = {"train": tuple(t for t in _ALL_GLOBAL if not _heldout(t)),
                    "heldout": tuple(t for t in _ALL_GLOBAL if _heldout(t))}
ABSENT_ANSWER = "none"   # the answer to a question about a color that is not in the video


@dataclass
class Shape:
    frame: int
    shape: str
    color: str
    cx: int
    cy: int
    r: int            # half the side / the radius, in pixels
    role: str = ""    # task v2: "target" or "distractor" (v1 shapes leave it empty)


@dataclass
class VideoSpec:
    num_frames: int = 16          # frames in the file (v2: the *source* frames)
    size: int = 448               # the side of a square frame (v1); v2 sets width and height
    fps: float = 2.0
    background: str = "black"
    shapes: List[Shape] = field(default_factory=list)
    target_color: Optional[str] = None    # the first target (kept for one-target callers)
    target_shape: Optional[str] = None
    targets: List[List[str]] = field(default_factory=list)   # [[color, shape], ...], big shapes
    # task v2 (the defaults are task v1's video: square, near-lossless H.264, clean, T = S)
    width: int = 0                # 0: ``size``
    height: int = 0               # 0: ``size``
    codec: str = "h264"           # a key of CODECS
    crf: int = 12
    noise: float = 0.0            # Gaussian sensor noise, std in grey levels (0: none)
    noise_seed: int = 0
    sampled_frames: int = 0       # T the runtime samples (labels index these); 0: num_frames
    factors: dict = field(default_factory=dict)   # v2: the factor values it was drawn with
    size_word: str = ""           # v2 same-colour distractors: "large"/"big" in object questions

    @property
    def frame_size(self):
        """(width, height) of the written frames."""
        return (self.width or self.size, self.height or self.size)

    @property
    def frames_sampled(self) -> int:
        return self.sampled_frames or self.num_frames

    def sampled_indices(self) -> List[int]:
        """The source frames the runtime decodes for ``frames_sampled`` frames: the runtime's
        own sampling function (InternVL's segment middles), so labels index what it sees."""
        from vr_runtime.video.load import sample_indices
        return sample_indices(self.num_frames, self.frames_sampled, self.fps)

    def colors(self) -> List[str]:
        return sorted({s.color for s in self.shapes})

    def absent_colors(self) -> List[str]:
        return [c for c in sorted(COLORS) if c not in self.colors()]

    def frames_with(self, color: str) -> List[int]:
        return sorted({s.frame for s in self.shapes if s.color == color})

    def target_labels(self, color: str) -> List[int]:
        """0/1 per *sampled* frame: 1 where the target of ``color`` is on screen in the source
        frame the runtime samples there. v1 (no roles): any shape of that color, every frame
        sampled; v2: only shapes with role "target" (a same-color distractor is not evidence
        for "the large red object")."""
        roles = any(s.role for s in self.shapes)
        on = {s.frame for s in self.shapes
              if s.color == color and (not roles or s.role == "target")}
        return [int(t in on) for t in self.sampled_indices()]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "VideoSpec":
        d = dict(d)
        d["shapes"] = [Shape(**s) for s in d.get("shapes", [])]
        return cls(**d)


def shape_mask(shape: str, cx: int, cy: int, r: int, size: int,
               height: Optional[int] = None) -> np.ndarray:
    """Boolean [height, size] mask of one shape (what ``render_frame`` paints); ``height``
    defaults to ``size`` (a square frame)."""
    yy, xx = np.mgrid[0:size if height is None else height, 0:size]
    if shape == "circle":
        return (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r
    if shape == "square":
        return (abs(xx - cx) <= r) & (abs(yy - cy) <= r)
    if shape == "triangle":  # apex up, base at cy + r, width 2r at the base
        inside_y = (yy >= cy - r) & (yy <= cy + r)
        half = (yy - (cy - r)) / 2.0
        return inside_y & (abs(xx - cx) <= half)
    raise ValueError(f"shape: expected one of {SHAPES}, got {shape!r}")


def render_frame(spec: VideoSpec, t: int) -> np.ndarray:
    """Frame t as uint8 [height, width, 3] RGB (square [size, size, 3] for task v1), with the
    spec's sensor noise (deterministic: seeded by ``noise_seed`` and t)."""
    w, h = spec.frame_size
    img = np.empty((h, w, 3), np.uint8)
    img[:] = BACKGROUNDS[spec.background]
    for s in spec.shapes:
        if s.frame == t:
            # the mask within the shape's bounding box (the same pixels as shape_mask on the
            # whole frame, without building a full-frame grid per shape)
            x0, y0 = max(s.cx - s.r, 0), max(s.cy - s.r, 0)
            x1, y1 = min(s.cx + s.r + 1, w), min(s.cy + s.r + 1, h)
            if x1 > x0 and y1 > y0:
                box = shape_mask(s.shape, s.cx - x0, s.cy - y0, s.r, x1 - x0, y1 - y0)
                img[y0:y1, x0:x1][box] = COLORS[s.color]
    if spec.noise > 0:
        # float32 draws: a 640x360 frame's noise in a few ms (float64 normal() took 3x that)
        noise = np.random.default_rng([spec.noise_seed, t]).standard_normal(img.shape,
                                                                           dtype=np.float32)
        noisy = img.astype(np.float32) + noise * np.float32(spec.noise)
        img = np.clip(np.rint(noisy), 0, 255).astype(np.uint8)
    return img


# codec name -> (PyAV encoder, options besides the CRF). Task v1 writes near-lossless H.264
# (crf 12); task v2 writes each codec at a high CRF (CODEC_CRF), as footage arrives.
CODECS = {"h264": ("libx264", {"preset": "veryfast"}),
          "vp9": ("libvpx-vp9", {"b": "0", "deadline": "realtime", "cpu-used": "8"}),
          # Preset 8, not the faster 10-12: at preset 12 (run as M11) SVT-AV1 4.1 wrote 10 of the
          # 344 AV1 videos of the v2 data (all long) that dav1d cannot decode to the end (up to
          # 43 bad packets, or a frame silently dropped); preset 8 decoded all 10 whole.
          "av1": ("libsvtav1", {"preset": "8"})}
CODEC_CRF = {"h264": 30, "vp9": 48, "av1": 48}


def make_video(path: str, spec: VideoSpec) -> str:
    """Write ``spec`` as an mp4 with PyAV: H.264 (task v1: near-lossless, flat frames compress
    to a few kB), VP9 or AV1 (``spec.codec``, at ``spec.crf``). Width and height must be even
    (4:2:0 chroma)."""
    if spec.codec not in CODECS:
        raise ValueError(f"codec: expected one of {sorted(CODECS)}, got {spec.codec!r}")
    w, h = spec.frame_size
    if w % 2 or h % 2:
        raise ValueError(f"frame size {w}x{h}: yuv420p needs even width and height")
    encoder, options = CODECS[spec.codec]
    if encoder not in av.codecs_available:
        raise ValueError(f"codec {spec.codec}: this PyAV build has no {encoder} encoder; install "
                         f"PyAV's binary wheels (they bundle libx264, libvpx and SVT-AV1)")
    if spec.codec == "av1":
        os.environ.setdefault("SVT_LOG", "1")   # SVT-AV1 prints its config banner otherwise
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    # Two SVT-AV1 encoders at once in one process can deadlock ("Svt[error]: bug, no frame in
    # undisplayed queue", then a writer thread that never returns): a data-generation run hung
    # on its 610th video with _write_videos' two threads. AV1 files are encoded one at a time;
    # H.264 and VP9 still run in parallel.
    if spec.codec != "av1":
        return _encode(path, spec, encoder, options)
    with _AV1_LOCK, same_scheduling():
        return _encode(path, spec, encoder, options)


_AV1_LOCK = threading.Lock()


@contextlib.contextmanager
def same_scheduling():
    """Give the calling thread back its scheduling policy. Run as root (a container, CI),
    SVT-AV1 switches the thread that opens an encoder to real-time SCHED_FIFO at priority 99 and
    leaves it so; every thread and process that thread starts afterwards inherits it, and on a
    small machine their busy waits starve the rest: a test run stalled for minutes in an
    unrelated decode, and an ffmpeg it spawned timed out."""
    if not hasattr(os, "sched_getscheduler"):   # not Linux
        yield
        return
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        yield
    finally:   # setting back the policy a thread already has needs no privilege
        os.sched_setscheduler(0, policy, param)


def _encode(path: str, spec: VideoSpec, encoder: str, options: dict) -> str:
    w, h = spec.frame_size
    rate = Fraction(spec.fps).limit_denominator(1000)
    with av.open(path, mode="w") as container:
        stream = container.add_stream(encoder, rate=rate)
        stream.width, stream.height = w, h
        stream.pix_fmt = "yuv420p"
        # v1: near-lossless, colors must survive 4:2:0 encoding, and flat frames stay tiny.
        stream.options = {"crf": str(spec.crf), **options}
        for t in range(spec.num_frames):
            frame = av.VideoFrame.from_ndarray(render_frame(spec, t), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def sample_spec(rng: random.Random, num_frames: int = 16, size: int = 448, fps: float = 2.0,
                n_targets: int = 2, n_target=(2, 3), n_distractor=(3, 6), target_r=(0.25, 0.29),
                distractor_r=(0.08, 0.125), distractor_colors=(1, 3)) -> VideoSpec:
    """A random video with the hard cases of the query-adaptive task.

    ``n_targets`` big targets (radius ``target_r`` of the side), each one color and one shape
    kind, each on screen in its own 2-3 frames (targets never share a frame, so which frames
    matter depends on the color the question names); small distractors (``distractor_r``) in
    3-6 other frames, drawn from 1-3 colors that no target uses, so at least one of the six
    colors is absent from the video (questions about it have no relevant frame)."""
    need = n_targets * n_target[1] + n_distractor[1]
    if num_frames < need:
        raise ValueError(f"num_frames: need >= {need} frames, got {num_frames}")
    if not 1 <= n_targets <= 2:
        raise ValueError(f"n_targets: expected 1 or 2, got {n_targets}")
    spec = VideoSpec(num_frames=num_frames, size=size, fps=fps,
                     background=rng.choice(sorted(BACKGROUNDS)))
    colors = sorted(COLORS)
    tcolors = rng.sample(colors, n_targets)
    spec.targets = [[c, rng.choice(SHAPES)] for c in tcolors]
    spec.target_color, spec.target_shape = spec.targets[0]
    order = list(range(num_frames))
    rng.shuffle(order)
    others = [c for c in colors if c not in tcolors]
    palette = rng.sample(others, min(rng.randint(*distractor_colors), len(others) - 1))

    def place(t, shape, color, rr):
        r = rng.randint(math.ceil(rr[0] * size), int(rr[1] * size))
        cx = rng.randint(r + 4, size - r - 5)
        cy = rng.randint(r + 4, size - r - 5)
        spec.shapes.append(Shape(t, shape, color, cx, cy, r))

    pos = 0
    for color, shape in spec.targets:
        k = rng.randint(*n_target)
        for t in order[pos:pos + k]:
            place(t, shape, color, target_r)
        pos += k
    m = rng.randint(*n_distractor)
    for t in order[pos:pos + m]:
        place(t, rng.choice(SHAPES), rng.choice(palette), distractor_r)
    spec.shapes.sort(key=lambda s: s.frame)
    return spec


# --- task v2: the factors real footage varies -----------------------------------------------
# Every v2 video is drawn from one value of each factor; the values are recorded on every JSONL
# line ("factors"). The training split draws every factor at random; the held-out split
# (``heldout_settings``) keeps all factors at BASE and varies one factor at a time.
ASPECTS = {"1:1": (448, 448), "4:3": (448, 336), "16:9": (640, 360), "9:16": (360, 640)}
NOISE_LEVELS = (0, 4, 10)                 # Gaussian std in grey levels
SOURCE_FRAMES = (16, 32, 64, 128, 256)
SAMPLED_FRAMES = (8, 16, 32, 64)
FACTORS = {
    "aspect": tuple(ASPECTS),
    "codec": tuple(CODECS),
    "noise": NOISE_LEVELS,
    "motion": ("static", "moving"),
    "n_targets": (1, 2, 3),
    # "source/sampled" frames; training draws any T <= S of SOURCE_FRAMES x SAMPLED_FRAMES
    "frames": ("16/16", "16/8", "64/32", "256/8", "256/64"),
    "distractors": ("plain", "same_color", "same_shape"),
}
BASE = {"aspect": "1:1", "codec": "h264", "noise": 0, "motion": "static", "n_targets": 2,
        "frames": "16/16", "distractors": "plain"}
# per sampled-frame count T: sampled frames a target spans, and the number of distractors
TARGET_SPAN = {8: (1, 2), 16: (2, 3), 32: (2, 4), 64: (3, 6)}
DISTRACTORS = {8: (1, 2), 16: (3, 6), 32: (4, 8), 64: (6, 12)}
TARGET_R = (0.22, 0.30)        # radius as a fraction of the frame's shorter side
DISTRACTOR_R = (0.08, 0.125)
SIZE_WORDS = ("large", "big")


def frames_value(source: int, sampled: int) -> str:
    return f"{source}/{sampled}"


def parse_frames(value: str):
    """"S/T" -> (source frames S, sampled frames T)."""
    s, t = (int(x) for x in str(value).split("/"))
    return s, t


def random_factors(rng: random.Random) -> dict:
    """A training video's factors: every factor at random (frames: any T <= S)."""
    f = {k: rng.choice(v) for k, v in FACTORS.items() if k != "frames"}
    pairs = [(s, t) for s in SOURCE_FRAMES for t in SAMPLED_FRAMES if t <= s]
    f["frames"] = frames_value(*rng.choice(pairs))
    return f


# Harder videos like real footage (the videos this setting imitates stay private, a fair test):
# 16:9, lossy VP9 with mild noise, three targets that move across several frames, 64 source frames
# and 32 sampled. The "footage" split holds this one combined setting, every factor off its
# base at once, where the held-out split varies one factor at a time.
FOOTAGE = {"aspect": "16:9", "codec": "vp9", "noise": 4, "motion": "moving", "n_targets": 3,
           "frames": "64/32", "distractors": "plain"}


def heldout_settings() -> List[tuple]:
    """The held-out layout: [(varies, factors)], first the base setting ("base", BASE), then
    for each factor each of its non-base values with every other factor at BASE."""
    out = [("base", dict(BASE))]
    for name, values in FACTORS.items():
        for v in values:
            if v != BASE[name]:
                out.append((name, dict(BASE, **{name: v})))
    return out


def _runs(rng: random.Random, lengths: List[int], T: int) -> List[tuple]:
    """Place runs of consecutive sampled frames (``lengths``, in random order) disjointly in
    [0, T) with random gaps; returns [(first, last)] in the order of ``lengths``."""
    free = T - sum(lengths)
    if free < 0:
        raise ValueError(f"runs of {sum(lengths)} frames do not fit in {T}")
    order = list(range(len(lengths)))
    rng.shuffle(order)
    cuts = sorted(rng.randint(0, free) for _ in order)   # gap sizes by stars and bars
    gaps = [b - a for a, b in zip([0] + cuts, cuts)]
    out, pos = [None] * len(lengths), 0
    for i, g in zip(order, gaps):
        pos += g
        out[i] = (pos, pos + lengths[i] - 1)
        pos += lengths[i]
    return out


def _segments(rng: random.Random, idx: List[int], S: int) -> List[tuple]:
    """The source frames that belong to each sampled frame: a random cut between consecutive
    sampled indices, so sampled frame i owns [start_i, end_i] and owns idx[i]. An object on
    screen over whole segments is in exactly the sampled frames it was placed in, and also in
    unsampled frames around them (as a real object is)."""
    cuts = [rng.randint(a + 1, b) for a, b in zip(idx, idx[1:])]
    starts = [0] + cuts
    ends = [c - 1 for c in cuts] + [S - 1]
    return list(zip(starts, ends))


def sample_spec_v2(rng: random.Random, factors: Optional[dict] = None,
                   fps: float = 2.0) -> VideoSpec:
    """A task-v2 video with the given factor values (default: ``random_factors``).

    Layout in *sampled* frames: each target spans TARGET_SPAN[T] consecutive sampled frames,
    each distractor one, all disjoint (one object on screen at a time, as in v1); each object
    is on screen over the whole source segments of its sampled frames (``_segments``), so the
    labels, computed with the runtime's sampling, mark exactly those frames.

    - motion "moving": every object goes from one centre and radius to another across its
      source frames (linear, at least a fifth of the shorter side apart, radius changed by
      >= 15%); "static": one centre and radius.
    - distractors "plain": small, of 1-3 colors no target uses (v1); "same_color": small, each
      with a target's color and another shape (questions then say "large"/"big", and labels
      mark only the target's frames); "same_shape": target-sized, a target's shape, a color no
      target uses. At least one color stays absent from the video."""
    f = dict(factors or random_factors(rng))
    S, T = _check_factors(f)
    w, h = ASPECTS[f["aspect"]]
    side = min(w, h)
    spec = VideoSpec(num_frames=S, size=max(w, h), fps=fps, width=w, height=h,
                     background=rng.choice(sorted(BACKGROUNDS)), codec=f["codec"],
                     crf=CODEC_CRF[f["codec"]], noise=float(f["noise"]),
                     noise_seed=rng.randrange(2 ** 31), sampled_frames=T, factors=f)
    n = f["n_targets"]
    colors = sorted(COLORS)
    tcolors = rng.sample(colors, n)
    spec.targets = [[c, rng.choice(SHAPES)] for c in tcolors]
    spec.target_color, spec.target_shape = spec.targets[0]
    others = [c for c in colors if c not in tcolors]
    kind = f["distractors"]
    if kind == "same_color":
        spec.size_word = rng.choice(SIZE_WORDS)
    spans = [rng.randint(*TARGET_SPAN[T]) for _ in range(n)]
    m = min(rng.randint(*DISTRACTORS[T]), T - sum(spans))
    palette = rng.sample(others, min(rng.randint(1, 3), len(others) - 1))
    objects = [(shape, color, TARGET_R, "target") for color, shape in spec.targets]
    objects += _distractors(rng, spec.targets, kind, m, palette)
    runs = _runs(rng, spans + [1] * m, T)
    seg = _segments(rng, spec.sampled_indices(), S)
    for (shape, color, rr, role), (a, b) in zip(objects, runs):
        first, last = seg[a][0], seg[b][1]
        (x0, y0, r0), (x1, y1, r1) = _track(rng, rr, w, h, side, f["motion"] == "moving")
        for t in range(first, last + 1):
            u = (t - first) / max(last - first, 1)
            spec.shapes.append(Shape(t, shape, color, round(x0 + u * (x1 - x0)),
                                     round(y0 + u * (y1 - y0)), round(r0 + u * (r1 - r0)),
                                     role))
    spec.shapes.sort(key=lambda s: s.frame)
    return spec


def _check_factors(f: dict):
    """``ValueError`` unless ``f`` names every factor once with an allowed value; returns the
    (source, sampled) frame counts of its ``frames``."""
    unknown = set(f) ^ set(FACTORS)
    if unknown:
        raise ValueError(f"factors: expected exactly {sorted(FACTORS)}, got {sorted(f)}")
    for k, v in f.items():
        if k == "frames":
            S, T = parse_frames(v)
            if T not in TARGET_SPAN or T > S or S < 2:
                raise ValueError(f"frames {v!r}: expected S/T with T in {sorted(TARGET_SPAN)}, "
                                 f"T <= S")
        elif v not in FACTORS[k]:
            raise ValueError(f"factor {k}: expected one of {FACTORS[k]}, got {v!r}")
    return S, T


def _distractors(rng: random.Random, targets, kind: str, m: int, palette) -> list:
    """``m`` distractors as (shape, color, radius, "distractor"), of the ``kind`` the factor
    names (see ``sample_spec_v2``)."""
    out = []
    for _ in range(m):
        tc, ts = rng.choice(targets)
        if kind == "same_color":
            out.append((rng.choice([x for x in SHAPES if x != ts]), tc, DISTRACTOR_R,
                        "distractor"))
        elif kind == "same_shape":
            out.append((ts, rng.choice(palette), TARGET_R, "distractor"))
        else:
            out.append((rng.choice(SHAPES), rng.choice(palette), DISTRACTOR_R, "distractor"))
    return out


def _track(rng: random.Random, rr, w: int, h: int, side: int, moving: bool):
    """Start and end (cx, cy, r) of one object, inside the frame at both ends."""
    lo, hi = math.ceil(rr[0] * side), int(rr[1] * side)

    def point(r):
        return rng.randint(r + 4, w - r - 5), rng.randint(r + 4, h - r - 5), r

    r0 = rng.randint(lo, hi)
    start = point(r0)
    if not moving:
        return start, start
    for _ in range(100):
        r1 = rng.randint(lo, hi)
        end = point(r1)
        if abs(r1 - r0) >= 0.15 * r0 and math.dist(start[:2], end[:2]) >= side / 5:
            return start, end
    # rare: keep the last draw but force the size change
    r1 = lo if r0 - lo > hi - r0 else hi
    return start, point(r1)


def phrasings(split: str):
    """(Fragment templates, Global templates) of a phrasing split: 'train' or 'heldout'."""
    if split not in FRAGMENT_PHRASINGS:
        raise ValueError(f"phrasing split: expected 'train' or 'heldout', got {split!r}")
    return FRAGMENT_PHRASINGS[split], GLOBAL_PHRASINGS[split]


def _object_question(template: str, color: str, size_word: str = "") -> str:
    """A Fragment template filled with a color; with ``size_word`` (v2 videos whose small
    distractors share a target's color) the question names the big object: "What shape is the
    large red object?"."""
    if not size_word:
        return template.format(color=color)
    if template == "Which shape has the color {color}?":   # the one template without a noun
        return f"Which {size_word} shape has the color {color}?"
    return template.format(color=f"{size_word} {color}")


def questions(spec: VideoSpec, rng: random.Random, phrasing: str = "train") -> List[dict]:
    """The questions of one video, with answers, frame labels, policy and category.

    - one ``object_shape`` question per target ("What shape is the red object?"): Fragment,
      frames showing that color labelled 1, answer the target's shape;
    - one ``absent_color`` question about a color not in the video: Fragment (its category
      needs local evidence), no frame labelled 1 (the runtime falls back to the Global plan),
      answer ``"none"``;
    - one ``background`` question: Global, all-zero labels, answer the background color.
    ``phrasing``: 'train' draws wordings from the training templates, 'heldout' from the held-out
    ones, 'mixed' picks one of the two per question (recorded in each question's ``phrasing``)."""
    if phrasing not in ("train", "heldout", "mixed"):
        raise ValueError(f"phrasing: expected 'train', 'heldout' or 'mixed', got {phrasing!r}")
    T = spec.frames_sampled
    out = []

    def words():
        split = phrasing if phrasing != "mixed" else rng.choice(("train", "heldout"))
        return split, phrasings(split)

    for color, shape in (spec.targets or [[spec.target_color, spec.target_shape]]):
        split, (frag, _) = words()
        out.append({"question": _object_question(rng.choice(frag), color, spec.size_word),
                    "answer": shape, "frame_labels": spec.target_labels(color), "policy": 1,
                    "category": "object_shape", "phrasing": split, "color": color})
    absent = spec.absent_colors()
    if absent:
        color = rng.choice(absent)
        split, (frag, _) = words()
        out.append({"question": _object_question(rng.choice(frag), color, spec.size_word),
                    "answer": ABSENT_ANSWER,
                    "frame_labels": [0] * T, "policy": 1, "category": "absent_color",
                    "phrasing": split, "color": color})
    split, (_, glob) = words()
    out.append({"question": rng.choice(glob), "answer": spec.background, "frame_labels": [0] * T,
                "policy": 0, "category": "background", "phrasing": split, "color": None})
    return out


def demo_spec() -> VideoSpec:
    """The bundled demo: two big targets in disjoint frames -- a red circle in frames 5-7 and a
    blue square in frames 11-12 -- among small distractors (green, yellow), black background.

    Ask "What shape is the red object?" (frames 5-7 kept at full resolution, answer "circle"),
    "What shape is the blue object?" (frames 11-12, answer "square") or "What is the background
    color?" (Global, answer "black"). Magenta and cyan are absent."""
    rng = random.Random(1234)
    spec = VideoSpec(num_frames=16, background="black", target_color="red",
                     target_shape="circle", targets=[["red", "circle"], ["blue", "square"]])
    big = {5: ("circle", "red"), 6: ("circle", "red"), 7: ("circle", "red"),
           11: ("square", "blue"), 12: ("square", "blue")}
    small = {0: ("square", "green"), 2: ("triangle", "yellow"), 3: ("circle", "green"),
             9: ("triangle", "green"), 14: ("square", "yellow")}
    for t in range(16):
        if t in big:
            (shape, color), rr = big[t], (112, 128)   # 25-29% of 448
        elif t in small:
            (shape, color), rr = small[t], (36, 56)   # 8-12.5% of 448
        else:
            continue
        r = rng.randint(*rr)
        spec.shapes.append(Shape(t, shape, color, rng.randint(r + 4, 443 - r),
                                 rng.randint(r + 4, 443 - r), r))
    return spec


DEMO_QUESTIONS = {"fragment": "What shape is the red object?",
                  "fragment_2": "What shape is the blue object?",
                  "global": "What is the background color?"}
# The shipped tiny weights (task v9) name a shape after its color: "red circle"
# (training/layouts.py, color_first).
DEMO_ANSWERS = {"fragment": "red circle", "fragment_2": "blue square", "global": "black"}


TASKS = ("v1", "v2")


def check_decodes(path: str, num_frames: int) -> None:
    """Decode every frame of ``path``; ValueError unless all ``num_frames`` come back without a
    decoding error. An encoder can write a file that opens but cannot be read to its end
    (SVT-AV1 at preset 12 did); such a video would fail training hours later, or, worse, lose
    its last frames silently, so the writer checks each file before it keeps it (about 0.1 s
    for a 256-frame video)."""
    decoded = errors = 0
    try:
        container = av.open(path)
    except av.error.FFmpegError as e:
        raise ValueError(f"the encoded video does not open ({e.strerror})") from None
    with container:
        stream = container.streams.video[0]
        for packet in container.demux(stream):
            try:
                decoded += len(stream.codec_context.decode(packet))
            except av.error.FFmpegError:
                errors += 1
    if errors or decoded != num_frames:
        raise ValueError(f"the encoded video decodes to {decoded} of {num_frames} frames "
                         f"({errors} packets failed to decode)")


def _write_videos(todo) -> None:
    """Render and encode [(path, spec)] on up to two threads (numpy and the encoders release
    the GIL); the specs were all drawn first, so the files do not depend on the order. A
    file is written under a temporary name and renamed, so a killed run leaves no torn video
    that a rerun would keep, and a file that does not decode whole (check_decodes) is an error,
    never a training video."""
    def one(item):
        path, spec = item
        root, ext = os.path.splitext(path)
        tmp = f"{root}.tmp{ext}"
        make_video(tmp, spec)
        try:
            check_decodes(tmp, spec.num_frames)
        except ValueError as e:
            os.remove(tmp)
            raise ValueError(f"{path}: {e}; not written (encoder {CODECS[spec.codec][0]} "
                             f"{CODECS[spec.codec][1]}, crf {spec.crf})") from None
        os.replace(tmp, path)

    if len(todo) < 2:
        for item in todo:
            one(item)
        return
    with ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        list(pool.map(one, todo))


def _video_spec(rng: random.Random, i: int, split: str, settings, v2: bool, num_frames: int,
                size: int, fps: float):
    """Video ``i`` of a split: (its spec, its path under the output folder, the fields every
    line about it carries besides the question's)."""
    if not v2:
        spec = sample_spec(rng, num_frames=num_frames, size=size, fps=fps)
        return spec, f"{split}/{split}_{i:05d}.mp4", {}
    varies, factors = settings[i % len(settings)] if settings else (None, None)
    spec = sample_spec_v2(rng, factors, fps=fps)
    extra = {"task": "v2", "num_frames": spec.frames_sampled,
             "source_frames": spec.num_frames, "factors": spec.factors}
    if varies:
        extra["varies"] = varies
    return spec, f"{split}/{split}_v2_{i:05d}.mp4", extra


def _add_lines(q: dict, ex_id: str, name: str, extra: dict, rel: list, pol: list,
               conv: list) -> None:
    """One question's lines: the relevance (Fragment questions only), policy and conversation
    files'."""
    base = {"id": ex_id, "video": name, "question": q["question"], "answer": q["answer"],
            "category": q["category"], "phrasing": q["phrasing"], **extra}
    if q["policy"] == 1:
        rel.append({**base, "frame_labels": q["frame_labels"]})
    pol.append({**base, "policy": "fragment" if q["policy"] else "global"})
    line = {"id": ex_id, "video": name, "conversations": [
        {"from": "human", "value": "<video>\n" + q["question"]},
        {"from": "gpt", "value": q["answer"]}], "policy": q["policy"],
        "category": q["category"], "phrasing": q["phrasing"], **extra}
    if q["policy"] == 1:
        # Only Fragment questions carry frame labels (L_img): the Image Router is only
        # consulted under the Fragment policy, and an all-zero target for Global
        # questions would fight the relevance learned in Stage 1. (Absent-color
        # questions are Fragment with all-zero labels: nothing is relevant.)
        line["frame_labels"] = q["frame_labels"]
    conv.append(line)


def write_dataset(out_dir: str, num_videos: int, seed: int = 0, num_frames: int = 16,
                  size: int = 448, fps: float = 2.0, split: str = "train",
                  phrasing: Optional[str] = None, task: str = "v1") -> Dict[str, str]:
    """Write ``num_videos`` videos and the three JSONL files; returns their paths.

    Files: ``{split}_relevance.jsonl`` (Fragment questions, absent colors included; Stage 1),
    ``{split}_policy.jsonl`` (all questions; Stage 2) and ``{split}_conversations.jsonl``
    (all questions, InternVL conversation format with labels; Stage 3). Every line carries its
    ``category`` and ``phrasing`` ('train' or 'heldout' wording). ``phrasing`` defaults to
    'train' for the train split and 'mixed' (half held-out wordings) for any other split.

    ``task``: 'v1' (the default: square 448x448, near-lossless H.264, ``num_frames`` frames all
    sampled, static targets) or 'v2' (the factors real footage varies, ``sample_spec_v2``;
    ``num_frames`` and ``size`` do not apply). v2 videos are named ``{split}_v2_NNNNN.mp4``
    (never a v1 file), and every v2 line also carries ``task``, its ``num_frames`` T (the frames
    to sample; labels index them), ``source_frames`` S and the video's ``factors``. The v2 train
    split draws every factor at random; the "footage" split holds ``FOOTAGE``, every factor off
    its base at once (``varies``: "footage"); any other v2 split is the one-factor-at-a-time
    layout (``heldout_settings``, video i takes setting i mod its length) and its lines say which
    factor they vary (``varies``: a factor name, or "base")."""
    if num_videos < 1:
        raise ValueError(f"num_videos: expected >= 1, got {num_videos}")
    if task not in TASKS:
        raise ValueError(f"task: expected one of {TASKS}, got {task!r}")
    if phrasing is None:
        phrasing = "train" if split == "train" else "mixed"
    v2 = task == "v2"
    rng = random.Random(f"{seed}-{split}" + ("-v2" if v2 else ""))
    settings = None
    if v2 and split != "train":
        settings = [("footage", dict(FOOTAGE))] if split == "footage" else heldout_settings()
    rel, pol, conv, todo = [], [], [], []
    vdir = os.path.join(out_dir, split)
    for i in range(num_videos):
        spec, name, extra = _video_spec(rng, i, split, settings, v2, num_frames, size, fps)
        path = os.path.join(out_dir, name)
        if not os.path.isfile(path):  # same seed -> same spec: keep the file (and its mtime,
            todo.append((path, spec))  # which keys the feature cache) when growing a split
        for j, q in enumerate(questions(spec, rng, phrasing)):
            ex_id = f"{split}_{'v2_' if v2 else ''}{i:05d}_{j}"
            _add_lines(q, ex_id, name, extra, rel, pol, conv)
    _write_videos(todo)
    os.makedirs(vdir, exist_ok=True)
    paths = {k: os.path.join(out_dir, f"{split}_{k}.jsonl")
             for k in ("relevance", "policy", "conversations")}
    write_jsonl(paths["relevance"], rel)
    write_jsonl(paths["policy"], pol)
    write_jsonl(paths["conversations"], conv)
    return paths
