"""The synthetic evidence task: short videos whose answers need known frames.

Each video (default 16 frames, 448x448, 2 fps) has a plain background. Frames either stay empty
or show one big saturated shape. The *target* shape (one color, one shape kind) appears in 2-3
known frames; distractor shapes of other colors appear in other frames.

- Fragment questions ("What shape is the red object?") need the frames where the queried color
  appears: those frames are labelled 1, all others 0; policy label 1 (Fragment). The router has
  to read the color named in the question, so relevance is query-dependent.
- Global questions ("What is the background color?") are about the whole video: policy label 0
  (Global) and no frame labels in the Stage 3 file (the Image Router is only used under the
  Fragment policy); ``questions()`` reports all-zero labels for them.

The frozen vision tower of the tiny model has random weights, which act roughly as a random
projection of each 28x28 patch: large flat saturated regions survive it, fine texture does not,
so the shapes are big and the colors far apart. Everything is deterministic given the seed.
"""
from __future__ import annotations

import os
import random
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Dict, List, Optional

import numpy as np

from .data import write_jsonl

COLORS: Dict[str, tuple] = {
    "red": (230, 25, 25), "green": (25, 200, 40), "blue": (30, 60, 235),
    "yellow": (240, 220, 20), "magenta": (220, 30, 220), "cyan": (20, 210, 220),
}
BACKGROUNDS: Dict[str, tuple] = {"black": (0, 0, 0), "white": (255, 255, 255),
                                 "gray": (128, 128, 128)}
SHAPES = ("circle", "square", "triangle")

FRAGMENT_TEMPLATES = (
    "What shape is the {color} object?",
    "Which shape has the color {color}?",
    "The {color} thing appears briefly. What shape is it?",
)
GLOBAL_TEMPLATES = (
    "What is the background color?",
    "What color is the background of the video?",
    "Across the whole video, which color fills the background?",
)


@dataclass
class Shape:
    frame: int
    shape: str
    color: str
    cx: int
    cy: int
    r: int            # half the side / the radius, in pixels


@dataclass
class VideoSpec:
    num_frames: int = 16
    size: int = 448
    fps: float = 2.0
    background: str = "black"
    shapes: List[Shape] = field(default_factory=list)
    target_color: Optional[str] = None
    target_shape: Optional[str] = None

    def frames_with(self, color: str) -> List[int]:
        return sorted({s.frame for s in self.shapes if s.color == color})

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "VideoSpec":
        d = dict(d)
        d["shapes"] = [Shape(**s) for s in d.get("shapes", [])]
        return cls(**d)


def _mask(shape: str, cx: int, cy: int, r: int, size: int) -> np.ndarray:
    yy, xx = np.mgrid[0:size, 0:size]
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
    """Frame t as uint8 [size, size, 3] RGB."""
    img = np.empty((spec.size, spec.size, 3), np.uint8)
    img[:] = BACKGROUNDS[spec.background]
    for s in spec.shapes:
        if s.frame == t:
            img[_mask(s.shape, s.cx, s.cy, s.r, spec.size)] = COLORS[s.color]
    return img


def make_video(path: str, spec: VideoSpec) -> str:
    """Write ``spec`` as an H.264 mp4 with PyAV (flat frames compress to a few kB)."""
    import av

    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    rate = Fraction(spec.fps).limit_denominator(1000)
    with av.open(path, mode="w") as container:
        stream = container.add_stream("libx264", rate=rate)
        stream.width = stream.height = spec.size
        stream.pix_fmt = "yuv420p"
        # Near-lossless: colors must survive 4:2:0 encoding, and flat frames stay tiny anyway.
        stream.options = {"crf": "12", "preset": "veryfast"}
        for t in range(spec.num_frames):
            frame = av.VideoFrame.from_ndarray(render_frame(spec, t), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def sample_spec(rng: random.Random, num_frames: int = 16, size: int = 448, fps: float = 2.0,
                n_target=(2, 3), n_distractor=(4, 8), target_r=(0.25, 0.29),
                distractor_r=(0.08, 0.125)) -> VideoSpec:
    """A random video: target in 2-3 frames, distractors (other colors) in 4-8 other frames.

    Radii are fractions of the frame size. Distractors are smaller than the target by default:
    with the tiny model's random, frozen vision tower and a CPU-sized training budget, the
    router could not learn to match a color *word* against same-size shapes of other colors
    (it stayed at the prior), while a salient target is learnable. Pass
    ``distractor_r=target_r`` for the harder, purely query-conditioned variant."""
    if num_frames < n_target[1] + n_distractor[1]:
        raise ValueError(f"num_frames: need >= {n_target[1] + n_distractor[1]} frames, "
                         f"got {num_frames}")
    spec = VideoSpec(num_frames=num_frames, size=size, fps=fps,
                     background=rng.choice(sorted(BACKGROUNDS)))
    colors = sorted(COLORS)
    spec.target_color = rng.choice(colors)
    spec.target_shape = rng.choice(SHAPES)
    order = list(range(num_frames))
    rng.shuffle(order)
    k = rng.randint(*n_target)
    m = rng.randint(*n_distractor)
    others = [c for c in colors if c != spec.target_color]

    def place(t, shape, color, rr):
        r = rng.randint(int(rr[0] * size), int(rr[1] * size))
        cx = rng.randint(r + 4, size - r - 5)
        cy = rng.randint(r + 4, size - r - 5)
        spec.shapes.append(Shape(t, shape, color, cx, cy, r))

    for t in order[:k]:
        place(t, spec.target_shape, spec.target_color, target_r)
    for t in order[k:k + m]:
        place(t, rng.choice(SHAPES), rng.choice(others), distractor_r)
    spec.shapes.sort(key=lambda s: s.frame)
    return spec


def questions(spec: VideoSpec, rng: random.Random) -> List[dict]:
    """One Fragment and one Global question for ``spec`` with answers and labels."""
    T = spec.num_frames
    rel = set(spec.frames_with(spec.target_color))
    frag = {"question": rng.choice(FRAGMENT_TEMPLATES).format(color=spec.target_color),
            "answer": spec.target_shape, "frame_labels": [int(t in rel) for t in range(T)],
            "policy": 1, "category": "object_shape"}
    glob = {"question": rng.choice(GLOBAL_TEMPLATES), "answer": spec.background,
            "frame_labels": [0] * T, "policy": 0, "category": "background"}
    return [frag, glob]


def demo_spec() -> VideoSpec:
    """The bundled demo: a big red circle in frames 5-7 of 16 among smaller distractors of other
    colors, black background.

    Ask it "What shape is the red object?" (Fragment: frames 5-7 kept at full resolution,
    answer "circle") or "What is the background color?" (Global, answer "black")."""
    rng = random.Random(1234)
    spec = VideoSpec(num_frames=16, background="black", target_color="red",
                     target_shape="circle")
    distractors = {0: ("square", "blue"), 2: ("triangle", "green"), 3: ("square", "yellow"),
                   9: ("circle", "cyan"), 11: ("triangle", "magenta"), 13: ("square", "green")}
    for t in range(16):
        if t in (5, 6, 7):
            shape, color = "circle", "red"
        elif t in distractors:
            shape, color = distractors[t]
        else:
            continue
        r = rng.randint(112, 128) if color == "red" else rng.randint(36, 56)
        spec.shapes.append(Shape(t, shape, color, rng.randint(r + 4, 443 - r),
                                 rng.randint(r + 4, 443 - r), r))
    return spec


DEMO_QUESTIONS = {"fragment": "What shape is the red object?",
                  "global": "What is the background color?"}


def generate(out_dir: str, num_videos: int, seed: int = 0, num_frames: int = 16,
             size: int = 448, fps: float = 2.0, split: str = "train") -> Dict[str, str]:
    """Write ``num_videos`` videos and the three JSONL files; returns their paths.

    Files: ``{split}_relevance.jsonl`` (Fragment questions; Stage 1),
    ``{split}_policy.jsonl`` (both kinds; Stage 2) and ``{split}_conversations.jsonl``
    (both kinds, InternVL conversation format with labels; Stage 3)."""
    if num_videos < 1:
        raise ValueError(f"num_videos: expected >= 1, got {num_videos}")
    rng = random.Random(f"{seed}-{split}")
    rel, pol, conv = [], [], []
    vdir = os.path.join(out_dir, split)
    for i in range(num_videos):
        spec = sample_spec(rng, num_frames=num_frames, size=size, fps=fps)
        name = f"{split}/{split}_{i:05d}.mp4"
        path = os.path.join(out_dir, name)
        if not os.path.isfile(path):  # same seed -> same spec: keep the file (and its mtime,
            make_video(path, spec)    # which keys the feature cache) when growing a split
        for j, q in enumerate(questions(spec, rng)):
            ex_id = f"{split}_{i:05d}_{j}"
            base = {"id": ex_id, "video": name, "question": q["question"], "answer": q["answer"],
                    "category": q["category"]}
            if q["policy"] == 1:
                rel.append({**base, "frame_labels": q["frame_labels"]})
            pol.append({**base, "policy": "fragment" if q["policy"] else "global"})
            line = {"id": ex_id, "video": name, "conversations": [
                {"from": "human", "value": "<video>\n" + q["question"]},
                {"from": "gpt", "value": q["answer"]}], "policy": q["policy"]}
            if q["policy"] == 1:
                # Only Fragment questions carry frame labels (L_img): the Image Router is only
                # consulted under the Fragment policy, and an all-zero target for Global
                # questions would fight the relevance learned in Stage 1.
                line["frame_labels"] = q["frame_labels"]
            conv.append(line)
    os.makedirs(vdir, exist_ok=True)
    paths = {k: os.path.join(out_dir, f"{split}_{k}.jsonl")
             for k in ("relevance", "policy", "conversations")}
    write_jsonl(paths["relevance"], rel)
    write_jsonl(paths["policy"], pol)
    write_jsonl(paths["conversations"], conv)
    return paths
