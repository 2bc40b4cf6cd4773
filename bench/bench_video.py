"""Video input cost: peak host memory (RSS) and wall time of ``load_video`` by source resolution
and decoder (CPU figures).

    python bench/bench_video.py              # 448p, 1080p and 4K H.264, 32 frames, each decoder
    python bench/bench_video.py --frames 64 --seconds 8

Each case runs in a fresh subprocess so its peak RSS (``ru_maxrss``) is its own; the table gives
the peak above the process's RSS after the imports (torch, PyAV, decord), i.e. what decoding and
preprocessing cost, next to ``vr_runtime.video.estimate_memory`` (what the --frames refusal
check budgets). Sources are ffmpeg's ``testsrc2`` encoded with libx264 (ffmpeg must be on
PATH). Writes bench/results/video_cpu.json and .md.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import environment, finish, markdown_table  # noqa: E402

SOURCES = {"448p": (800, 448), "1080p": (1920, 1080), "4K": (3840, 2160)}

CHILD = r"""
import json, resource, sys, time
import torch, av  # imports first: their memory is the baseline
from vr_runtime import decoders
from vr_runtime.video import load_video
if "decord" in decoders.available_decoders():
    import decord  # noqa: F401
torch.set_num_threads(1)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
clip = load_video(sys.argv[1], num_frames=int(sys.argv[2]), decoder=sys.argv[3])
wall = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"base_mb": base / 1024, "peak_mb": peak / 1024, "wall_s": wall,
                  "decoder": clip.decoder, "frames": clip.num_frames,
                  "clip_mb": clip.pixel_values.nbytes / 2**20}))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                  "video_cpu.json"))
    args = ap.parse_args(argv)
    from vr_runtime.decoders import available_decoders
    from vr_runtime.video import estimate_memory
    decoders = available_decoders()
    rows = []
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as d:
        for name, (w, h) in SOURCES.items():
            path = os.path.join(d, f"{name}.mp4")
            subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i",
                            f"testsrc2=size={w}x{h}:rate=25:duration={args.seconds}",
                            "-c:v", "libx264", "-preset", "ultrafast", path], check=True)
            for dec in decoders:
                res = subprocess.run([sys.executable, "-c", CHILD, path, str(args.frames), dec],
                                     capture_output=True, text=True, env=env, check=True)
                r = json.loads(res.stdout.strip().splitlines()[-1])
                rows.append({"source": f"{name} ({w}x{h})", "decoder": r["decoder"],
                             "frames": r["frames"], "clip_mb": round(r["clip_mb"], 1),
                             "peak_above_imports_mb": round(r["peak_mb"] - r["base_mb"], 1),
                             # what the refusal check budgets for this request (an upper
                             # bound: it also counts a second copy of the clip for the model)
                             "estimate_mb": round(estimate_memory(r["frames"], 448, w, h)
                                                  / 2**20, 1),
                             "wall_s": round(r["wall_s"], 2)})
                print(rows[-1], flush=True)
    payload = {"benchmark": "video input: peak RSS and wall time of load_video",
               "label": "CPU figures (shared, loaded 2-core machine: wall times are noisy)",
               "environment": environment(), "settings": vars(args), "rows": rows}
    import av
    payload["environment"]["pyav"] = av.__version__
    payload["environment"]["ffmpeg_in_pyav"] = av.ffmpeg_version_info
    if "decord" in decoders:
        import decord
        payload["environment"]["decord"] = decord.__version__
    md = markdown_table(rows, ["source", "decoder", "frames", "clip_mb",
                               "peak_above_imports_mb", "estimate_mb", "wall_s"])
    finish(args.out, payload, md, show=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
