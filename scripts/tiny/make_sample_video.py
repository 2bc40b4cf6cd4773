#!/usr/bin/env python3
"""Regenerate the bundled demo video ``vr_runtime/assets/sample.mp4``.

The video is the synthetic evidence task's demo clip (``vr_runtime.data.synthetic_videos.demo_spec``),
so the demo is in the distribution the tiny model's routers are trained on:

- 16 frames, 448x448, 2 fps (8 s), H.264 (libx264, yuv420p, crf 12), black background;
- two targets in disjoint frames: a **red circle** in frames 5, 6 and 7 only (2.5-4.0 s) and a
  **blue square** in frames 11 and 12 only (5.5-6.5 s);
- small distractors elsewhere: green square (frame 0), yellow triangle (2), green circle (3),
  green triangle (9), yellow square (14); magenta and cyan are absent; the other frames are empty.

Questions: "What shape is the red object?" (Fragment: evidence frames 5-7; answer "circle"),
"What shape is the blue object?" (frames 11-12; "square") and "What is the background color?"
(Global; "black"). ``videorouter demo`` asks the first two: different frames must be kept.

Frames are drawn with numpy from a fixed seed and x264 is deterministic, so rerunning the script
with the same libx264 build gives the same bytes; the file is a few kB.

    python scripts/tiny/make_sample_video.py [--out vr_runtime/assets/sample.mp4]
"""
from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from vr_runtime.data.synthetic_videos import DEMO_QUESTIONS, demo_spec, make_video  # noqa: E402

DEFAULT_OUT = ROOT / "vr_runtime" / "assets" / "sample.mp4"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT, help="output .mp4 path")
    args = ap.parse_args(argv)
    spec = demo_spec()
    make_video(str(args.out), spec)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes): {spec.num_frames} frames, "
          f"{spec.size}x{spec.size}, {spec.fps:g} fps")
    for color, shape in spec.targets:
        frames = spec.frames_with(color)
        print(f"evidence: {color} {shape} in frames {frames} "
              f"({frames[0] / spec.fps:g}-{(frames[-1] + 1) / spec.fps:g} s)")
    for kind, q in DEMO_QUESTIONS.items():
        print(f"{kind} question: {q}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
