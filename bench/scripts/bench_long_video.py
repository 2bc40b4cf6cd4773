"""Long videos at the frame counts people sample (64 to 2,048): ``videorouter ask`` on a 20-minute
640x360 H.264 clip (a keyframe every 15 frames), the tiny model, ``--seek keyframe``, one fresh
process a row, this tree ("after") and another checkout ("before", ``--before DIR``: e.g.
``git worktree add /tmp/vr_before <commit>``) in one run.

Per row: the wall time of the process, each stage of the report, the time to first token from
the request's start (``timings_s.first_token``; the "before" tree has none: its decode plus TTFT,
which ran one after the other), the peak RSS (``/usr/bin/time``) and the report's activation peak.
The limit rows: ffmpeg's keyframe-only decode of the whole clip on one core, and the tiny vision
tower alone on N preprocessed frames (the floor the stream hides decoding behind).

    python -m bench.scripts.bench_long_video --before /tmp/vr_before --out bench/results/long_video_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import torch

from bench.harness.env import environment, environment_line
from bench.harness.results import finish
from bench.harness.tables import markdown_table

ROOT = pathlib.Path(__file__).resolve().parents[2]
QUESTION = "What colour is the circle?"
STAGES = ("decode", "frames_wait", "vision", "router", "prefill", "ttft", "first_token")


def make_clip(path: pathlib.Path, minutes: float) -> pathlib.Path:
    """The 640x360 H.264 clip (30 fps, a keyframe every 15 frames), made once."""
    if not path.exists():
        src = "testsrc2=size=640x360:rate=30"
        subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i", src, "-t",
                        str(minutes * 60), "-c:v", "libx264", "-preset", "ultrafast", "-g", "15",
                        "-pix_fmt", "yuv420p", str(path)], check=True)
    return path


def ask(tree: pathlib.Path, clip: pathlib.Path, frames: int, extra=()) -> dict:
    """One ``videorouter ask --json`` in a fresh process of ``tree`` -> its row."""
    cmd = ["/usr/bin/time", "-f", "%M %e", sys.executable, "-c",
           "import sys; from vr_runtime.cli import main; sys.exit(main())", "ask", str(clip),
           QUESTION, "--seek", "keyframe", "--frames", str(frames), "--json", *extra]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    p = subprocess.run(cmd, cwd=str(tree), env=env, capture_output=True, text=True)
    if p.returncode != 0:
        return {"frames": frames, "error": p.stderr.strip().splitlines()[-1]}
    rss_kb, wall = p.stderr.strip().splitlines()[-1].split()
    out = json.loads(p.stdout)
    rep, t = out["report"], out["report"]["timings_s"]
    row = {"frames": frames, "wall_s": float(wall), "peak_rss_mb": int(rss_kb) / 1024,
           "activation_mb": (rep.get("peak_activation_bytes") or 0) / 2**20,
           "text": out["text"], "kept": rep["frames_kept"],
           "windows": rep["windows"], "frame_indices": rep["frame_indices"]}
    row.update({k: t.get(k) for k in STAGES})
    # the video's time is "frames" now ("decode" in trees before the frame stream)
    row["decode"] = t.get("frames", t.get("decode"))
    if row["first_token"] is None:    # before: decoding, then the stages of the TTFT
        row["first_token"] = round(row["decode"] + t["ttft"], 3)
    return row


def ffmpeg_keyframes(clip: pathlib.Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-threads", "1", "-skip_frame", "nokey", "-i",
                    str(clip), "-f", "null", "-"], check=True)
    return time.perf_counter() - t0


def tower_alone(frames: int) -> float:
    """The tiny vision tower on ``frames`` preprocessed frames, 16 a call (as the runtime)."""
    from vr_runtime.backbones import load_backbone
    lm = load_backbone("tiny", device="cpu", dtype=torch.float32)
    pv = torch.randn(16, 3, *lm.frame_spec.size)
    with torch.inference_mode():
        lm.encode_frames(pv, 16)
        t0 = time.perf_counter()
        for _ in range(frames // 16):
            lm.encode_frames(pv, 16)
    return time.perf_counter() - t0


def growth(rows: list, key: str, lo: int = 256, hi: int = 2048):
    """Per-frame growth of ``key`` between ``lo`` and ``hi`` frames."""
    a = next((r for r in rows if r["frames"] == lo and key in r), None)
    b = next((r for r in rows if r["frames"] == hi and key in r), None)
    return None if a is None or b is None else (b[key] - a[key]) / (hi - lo)


def markdown(env: dict, payload: dict) -> str:
    cols = ["frames", "wall_s", "first_token", "decode", "frames_wait", "vision", "router",
            "prefill", "ttft", "peak_rss_mb", "activation_mb", "kept"]
    out = ["# Long videos: ask at 64 to 2,048 frames, before and after the frame stream", "",
           environment_line(env, ("torch", "transformers")), ""]
    for side in ("before", "after"):
        out += [f"## {side} ({payload['trees'][side]})", "",
                markdown_table(payload[side], cols), ""]
    lim = payload["limits"]
    g = {k: "-" if v is None else f"{v:.2f}" if isinstance(v, float) else v
         for k, v in payload["growth"].items()}
    out += ["## Limits", "",
            f"- ffmpeg, keyframes only, one core, the whole clip: {lim['ffmpeg_keyframes_s']:.1f} s",
            *[f"- the tiny vision tower alone on {n} frames: {s:.1f} s"
              for n, s in lim["tower_alone_s"].items()], "",
            "## Goals", "",
            f"- host memory growth, 256 to 2,048 frames: before {g['before_mb_per_frame']} "
            f"MB a frame, after {g['after_mb_per_frame']} MB a frame (goal <= 0.5)",
            f"- wall time at 2,048 frames, after / before: {g['wall_ratio_2048']} (goal <= 0.6)",
            f"- 256 frames, the same answer, frame indices and windows: {g['same_at_256']}"]
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="a checkout of the tree to compare with")
    ap.add_argument("--frames", default="64,256,1024,2048")
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "vr_long_video"))
    ap.add_argument("--out", default=str(ROOT / "bench/results/long_video_cpu.json"))
    a = ap.parse_args(argv)
    counts = [int(x) for x in a.frames.split(",")]
    os.makedirs(a.work, exist_ok=True)
    clip = make_clip(pathlib.Path(a.work) / f"clip_{a.minutes:g}min.mp4", a.minutes)
    env = environment()
    trees = {"before": pathlib.Path(a.before).resolve(), "after": ROOT}
    payload = {"environment": env, "clip": {"minutes": a.minutes, "size": "640x360",
                                            "fps": 30, "gop": 15},
               "trees": {k: str(v) for k, v in trees.items()}}
    for n in counts:   # before and after side by side, row by row (the same machine load)
        for side, tree in trees.items():
            payload.setdefault(side, []).append(ask(tree, clip, n))
            print(side, json.dumps({k: v for k, v in payload[side][-1].items()
                                    if k not in ("windows", "frame_indices")}), flush=True)
    payload["limits"] = {"ffmpeg_keyframes_s": ffmpeg_keyframes(clip),
                         "tower_alone_s": {n: tower_alone(n) for n in counts}}
    b = {r["frames"]: r for r in payload["before"]}
    f = {r["frames"]: r for r in payload["after"]}
    same = None if 256 not in b or 256 not in f else all(
        b[256].get(k) == f[256].get(k) for k in ("text", "windows", "frame_indices"))
    payload["growth"] = {
        "before_mb_per_frame": growth(payload["before"], "peak_rss_mb"),
        "after_mb_per_frame": growth(payload["after"], "peak_rss_mb"),
        "wall_ratio_2048": (f[2048]["wall_s"] / b[2048]["wall_s"]) if 2048 in b and 2048 in f
        and "wall_s" in b[2048] and "wall_s" in f[2048] else None,
        "same_at_256": same}
    finish(a.out, payload, markdown(env, payload))


if __name__ == "__main__":
    main()
