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
"""
from __future__ import annotations

import hashlib
import math
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
# kept for callers of the first version of the task
FRAGMENT_TEMPLATES = ("What shape is the {color} object?", "Which shape has the color {color}?",
                      "The {color} thing appears briefly. What shape is it?")
GLOBAL_TEMPLATES = ("What is the background color?", "What color is the background of the video?",
                    "Across the whole video, which color fills the background?")
ABSENT_ANSWER = "none"   # the answer to a question about a color that is not in the video


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
    target_color: Optional[str] = None    # the first target (kept for one-target callers)
    target_shape: Optional[str] = None
    targets: List[List[str]] = field(default_factory=list)   # [[color, shape], ...], big shapes

    def colors(self) -> List[str]:
        return sorted({s.color for s in self.shapes})

    def absent_colors(self) -> List[str]:
        return [c for c in sorted(COLORS) if c not in self.colors()]

    def frames_with(self, color: str) -> List[int]:
        return sorted({s.frame for s in self.shapes if s.color == color})

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "VideoSpec":
        d = dict(d)
        d["shapes"] = [Shape(**s) for s in d.get("shapes", [])]
        return cls(**d)


def shape_mask(shape: str, cx: int, cy: int, r: int, size: int) -> np.ndarray:
    """Boolean [size, size] mask of one shape (what ``render_frame`` paints)."""
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
            img[shape_mask(s.shape, s.cx, s.cy, s.r, spec.size)] = COLORS[s.color]
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


def phrasings(split: str):
    """(Fragment templates, Global templates) of a phrasing split: 'train' or 'heldout'."""
    if split not in FRAGMENT_PHRASINGS:
        raise ValueError(f"phrasing split: expected 'train' or 'heldout', got {split!r}")
    return FRAGMENT_PHRASINGS[split], GLOBAL_PHRASINGS[split]


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
    T = spec.num_frames
    out = []

    def words():
        split = phrasing if phrasing != "mixed" else rng.choice(("train", "heldout"))
        return split, phrasings(split)

    for color, shape in (spec.targets or [[spec.target_color, spec.target_shape]]):
        rel = set(spec.frames_with(color))
        split, (frag, _) = words()
        out.append({"question": rng.choice(frag).format(color=color), "answer": shape,
                    "frame_labels": [int(t in rel) for t in range(T)], "policy": 1,
                    "category": "object_shape", "phrasing": split, "color": color})
    absent = spec.absent_colors()
    if absent:
        color = rng.choice(absent)
        split, (frag, _) = words()
        out.append({"question": rng.choice(frag).format(color=color), "answer": ABSENT_ANSWER,
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
DEMO_ANSWERS = {"fragment": "circle", "fragment_2": "square", "global": "black"}


def generate(out_dir: str, num_videos: int, seed: int = 0, num_frames: int = 16,
             size: int = 448, fps: float = 2.0, split: str = "train",
             phrasing: Optional[str] = None) -> Dict[str, str]:
    """Write ``num_videos`` videos and the three JSONL files; returns their paths.

    Files: ``{split}_relevance.jsonl`` (Fragment questions, absent colors included; Stage 1),
    ``{split}_policy.jsonl`` (all questions; Stage 2) and ``{split}_conversations.jsonl``
    (all questions, InternVL conversation format with labels; Stage 3). Every line carries its
    ``category`` and ``phrasing`` ('train' or 'heldout' wording). ``phrasing`` defaults to
    'train' for the train split and 'mixed' (half held-out wordings) for any other split."""
    if num_videos < 1:
        raise ValueError(f"num_videos: expected >= 1, got {num_videos}")
    if phrasing is None:
        phrasing = "train" if split == "train" else "mixed"
    rng = random.Random(f"{seed}-{split}")
    rel, pol, conv = [], [], []
    vdir = os.path.join(out_dir, split)
    for i in range(num_videos):
        spec = sample_spec(rng, num_frames=num_frames, size=size, fps=fps)
        name = f"{split}/{split}_{i:05d}.mp4"
        path = os.path.join(out_dir, name)
        if not os.path.isfile(path):  # same seed -> same spec: keep the file (and its mtime,
            make_video(path, spec)    # which keys the feature cache) when growing a split
        for j, q in enumerate(questions(spec, rng, phrasing)):
            ex_id = f"{split}_{i:05d}_{j}"
            base = {"id": ex_id, "video": name, "question": q["question"], "answer": q["answer"],
                    "category": q["category"], "phrasing": q["phrasing"]}
            if q["policy"] == 1:
                rel.append({**base, "frame_labels": q["frame_labels"]})
            pol.append({**base, "policy": "fragment" if q["policy"] else "global"})
            line = {"id": ex_id, "video": name, "conversations": [
                {"from": "human", "value": "<video>\n" + q["question"]},
                {"from": "gpt", "value": q["answer"]}], "policy": q["policy"],
                "category": q["category"], "phrasing": q["phrasing"]}
            if q["policy"] == 1:
                # Only Fragment questions carry frame labels (L_img): the Image Router is only
                # consulted under the Fragment policy, and an all-zero target for Global
                # questions would fight the relevance learned in Stage 1. (Absent-color
                # questions are Fragment with all-zero labels: nothing is relevant.)
                line["frame_labels"] = q["frame_labels"]
            conv.append(line)
    os.makedirs(vdir, exist_ok=True)
    paths = {k: os.path.join(out_dir, f"{split}_{k}.jsonl")
             for k in ("relevance", "policy", "conversations")}
    write_jsonl(paths["relevance"], rel)
    write_jsonl(paths["policy"], pol)
    write_jsonl(paths["conversations"], conv)
    return paths
