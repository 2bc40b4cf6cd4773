"""Video input cost: peak host memory (RSS) and wall time of ``load_video`` by source resolution
and decoder (CPU figures).

    python -m bench.scripts.bench_video              # 448p, 1080p and 4K H.264, 32 frames, each decoder
    python -m bench.scripts.bench_video --frames 64 --seconds 8
    python -m bench.scripts.bench_video ttf              # time to frames of long clips, by method
    python -m bench.scripts.bench_video nvdec            # NVDEC (torchcodec) against the CPU decoders

Each case runs in a fresh subprocess so its peak RSS (``ru_maxrss``) is its own; the table gives
the peak above the process's RSS after the imports (torch, PyAV, decord), i.e. what decoding and
preprocessing cost, next to ``vr_runtime.video.load.estimate_memory`` (what the --frames refusal
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

from bench.harness.env import environment
from bench.harness.results import RESULTS, finish
from bench.harness.tables import markdown_table
from vr_runtime.video import decoders

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SOURCES = {"448p": (800, 448), "1080p": (1920, 1080), "4K": (3840, 2160)}

CHILD = r"""
import json, resource, sys, time
import torch, av  # imports first: their memory is the baseline
from vr_runtime.video import decoders
from vr_runtime.video.load import load_video
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


def parse_any(argv):
    """The arguments of whichever mode ``argv`` asks for (bench/check_args.py checks them)."""
    if argv[:1] == ["ttf"]:
        return ttf_args(argv[1:])
    if argv[:1] == ["nvdec"]:
        return nvdec_args(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--out", default=os.path.join(RESULTS,
                                                  "video_cpu.json"))
    return ap.parse_args(argv)


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["ttf"]:
        return ttf_main(argv[1:])
    if argv[:1] == ["nvdec"]:
        return nvdec_main(argv[1:])
    args = parse_any(argv)
    from vr_runtime.video.decoders import available_decoders
    from vr_runtime.video.load import estimate_memory
    decoders = available_decoders()
    rows = []
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as d:
        for name, (w, h) in SOURCES.items():
            path = os.path.join(d, f"{name}.mp4")
            subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i",
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


# ----------------------------------------------------------------------------- time to frames

# name: (file, seconds, ffmpeg arguments that make it). Made once into the cache directory
# (not the repository): libx264 at -preset veryfast keeps x264's default GOP (keyint 250, with
# scene cuts), 3 B-frames and CABAC, so the decode cost is that of the defaults.
TTF_CLIPS = {
    "h264_720p": ("h264_720p_600s.mp4", 600,
                  ["-f", "lavfi", "-i", "testsrc2=size=1280x720:rate=30", "-c:v", "libx264",
                   "-preset", "veryfast", "-pix_fmt", "yuv420p"]),
    "vp9_720p": ("vp9_720p_120s.webm", 120,
                 ["-f", "lavfi", "-i", "testsrc2=size=1280x720:rate=30", "-c:v", "libvpx-vp9",
                  "-deadline", "realtime", "-cpu-used", "8", "-b:v", "2M", "-g", "240"]),
    "hevc_1080p": ("hevc_1080p_120s.mp4", 120,
                   ["-f", "lavfi", "-i", "testsrc2=size=1920x1080:rate=30", "-c:v", "libx265",
                    "-preset", "ultrafast", "-x265-params", "log-level=0", "-tag:v", "hvc1"]),
}


def ttf_clip(cache: str, name: str) -> str:
    fname, seconds, args = TTF_CLIPS[name]
    path = os.path.join(cache, fname)
    if not os.path.exists(path):
        os.makedirs(cache, exist_ok=True)
        tmp = path + ".tmp" + os.path.splitext(path)[1]
        subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", *args[:4], "-t", str(seconds),
                        *args[4:], tmp], check=True)
        os.replace(tmp, path)
    return path


def needed_frames(info, indices) -> int:
    """Frames a decoder must decode for ``indices``: from each sampled frame's keyframe to it,
    a keyframe interval decoded once for all its samples."""
    n, last_key, last = 0, None, -1
    for k in indices:
        key = int(info.keyframe[k])
        if key != last_key or k <= last:
            n += k - key + 1
        else:
            n += k - last
        last_key, last = key, k
    return n


def ffmpeg_rate(path: str, frames: int = 1500):
    """ffmpeg's own single-thread decode rate of this clip, output discarded: (frames per
    wall second, frames per CPU second)."""
    import resource
    import time
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-threads", "1", "-i", path, "-map",
                    "0:v:0", "-frames:v", str(frames), "-f", "null", "-"], check=True)
    wall = time.perf_counter() - t0
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    return frames / wall, frames / max(cpu, 1e-9)


def _decode(info, indices, scale, decoder, workers, seek):
    import hashlib
    import time

    import numpy as np
    got = {}
    c0 = time.process_time()
    t0 = time.perf_counter()
    decoders.decode_frames(info, indices, scale, lambda i, f: got.__setitem__(i, f), decoder,
                    workers=workers, seek=seek)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    h = hashlib.sha1()
    for i in range(len(indices)):
        h.update(np.ascontiguousarray(got[i]).tobytes())
    return wall, cpu, h.hexdigest()


def ttf_args(argv):
    ap = argparse.ArgumentParser(prog="bench_video.py ttf",
                                 description="time to frames: seconds until the sampled frames "
                                             "are decoded, by method, against ffmpeg's single-"
                                             "thread limit")
    ap.add_argument("--clips", default=",".join(TTF_CLIPS))
    ap.add_argument("--frames", default="16,32,64,256")
    ap.add_argument("--cache", default=os.environ.get(
        "VIDEOROUTER_BENCH_CACHE", os.path.expanduser("~/.cache/videorouter-bench")))
    ap.add_argument("--out", default=os.path.join(RESULTS,
                                                  "video_ttf_cpu.json"))
    args = ap.parse_args(argv)
    bad = [c for c in args.clips.split(",") if c not in TTF_CLIPS]
    if bad:
        ap.error(f"--clips: unknown {bad}; choose from {','.join(TTF_CLIPS)}")
    return args


def ttf_methods(cores: int):
    """(label, decoder, workers, seek) of each row of a clip and frame count."""
    methods = [("decord", "decord", 1, "exact")] if "decord" in \
        decoders.available_decoders() else []
    methods += [("PyAV (1 decoder, no frame skipping)", "pyav-plain", 1, "exact"),
                ("ours exact, 1 worker", "pyav", 1, "exact")]
    methods += [(f"ours exact, {w} workers" + (" (all cores)" if w == cores else ""),
                 "pyav", w, "exact") for w in sorted({2, cores}) if w > 1]
    methods += [("ours keyframe, 1 worker", "pyav", 1, "keyframe")]
    methods += [(f"ours keyframe, {cores} workers (all cores)", "pyav", cores,
                 "keyframe")] if cores > 1 else []
    return methods


def ttf_environment(cores: int) -> dict:
    """``environment()`` plus the decoders' versions, the cores and the load after the run."""
    import av
    env = environment()
    env.update(pyav=av.__version__, ffmpeg_in_pyav=av.ffmpeg_version_info,
               cores_available=cores, cpu_count=os.cpu_count())
    if "decord" in decoders.available_decoders():
        import decord
        env["decord"] = decord.__version__
    try:
        env["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    return env


def ttf_main(argv) -> int:
    args = ttf_args(argv)
    import numpy as np
    from vr_runtime.video import pyav_decoder
    from vr_runtime.video.load import open_video, sample_indices
    cores = decoders.default_workers()
    rows = []
    for name in args.clips.split(","):
        path = ttf_clip(args.cache, name)
        info = open_video(path)
        keys = np.unique(info.keyframe)
        gop = float(np.mean(np.diff(keys))) if keys.size > 1 else float(info.num_frames)
        rate, cpu_rate = ffmpeg_rate(path)
        scale = decoders.scaled_size(info.width, info.height, 448)
        for T in (int(x) for x in args.frames.split(",")):
            idx = sample_indices(info.num_frames, T, info.fps)
            need = needed_frames(info, idx)
            limit, limit_cpu = need / rate, need / cpu_rate
            kidx = decoders.keyframe_indices(info, idx)
            ref_hash = key_hash = None
            for label, dec, w, seek in ttf_methods(cores):
                saved = pyav_decoder._NONREF_CODECS
                if dec == "pyav-plain":   # the decode as it was: every frame decoded
                    pyav_decoder._NONREF_CODECS = frozenset()
                try:
                    wall, cpu, digest = _decode(info, kidx if seek == "keyframe" else idx, scale,
                                                "pyav" if dec == "pyav-plain" else dec, w, seek)
                except Exception as e:   # decord on codecs it cannot decode: say so, go on
                    rows.append({"clip": name, "frames": T, "method": label,
                                 "time_s": "fails: " + str(e).splitlines()[0][:80]})
                    print(rows[-1], flush=True)
                    continue
                finally:
                    pyav_decoder._NONREF_CODECS = saved
                if dec == "pyav-plain":
                    ref_hash = digest
                if seek == "keyframe":   # the keyframe rows against each other
                    same = "-" if dec != "pyav" or w == 1 else \
                        ("same as 1 worker" if digest == key_hash else "NO")
                    key_hash = digest if w == 1 else key_hash
                else:
                    same = "-" if ref_hash is None else ("yes" if digest == ref_hash else "NO")
                rows.append({"clip": name, "frames": T, "method": label,
                             "time_s": round(wall, 2), "x_limit": round(wall / limit, 3),
                             "cpu_s": round(cpu, 2), "cpu_x_limit": round(cpu / limit_cpu, 3),
                             "frames_used": len(kidx) if seek == "keyframe" else len(idx),
                             "identical_to_pyav": same})
                print(rows[-1], flush=True)
            rows.append({"clip": name, "frames": T,
                         "method": f"limit: ffmpeg -threads 1, {need} frames at "
                                   f"{rate:.0f} frames/s", "time_s": round(limit, 2),
                         "x_limit": 1.0, "cpu_s": round(limit_cpu, 2), "cpu_x_limit": 1.0,
                         "frames_used": len(idx), "identical_to_pyav": "-"})
            print(rows[-1], flush=True)
        rows.append({"clip": name, "frames": "-", "method": f"({info.codec} {info.width}x"
                     f"{info.height}, {info.duration_s:.0f} s, {info.num_frames} frames, "
                     f"mean keyframe interval {gop:.0f} frames)", "time_s": "-",
                     "x_limit": "-", "cpu_s": "-", "cpu_x_limit": "-", "frames_used": "-",
                     "identical_to_pyav": "-"})
    env = ttf_environment(cores)
    payload = {"benchmark": "time to frames: decode the sampled frames (InternVL sampling) at "
                            "the pipeline's decode size, by method",
               "label": f"CPU, {cores} cores (shared machine: other jobs ran; ratios are from "
                        f"one run)",
               "limit": "ffmpeg's own single-thread decode rate of the clip (ffmpeg -threads 1 "
                        "-f null, first 1500 frames) times the frames the samples need (each "
                        "sample's keyframe to it, a keyframe interval once for its samples)",
               "environment": env, "settings": vars(args), "rows": rows}
    md = markdown_table(rows, ["clip", "frames", "method", "time_s", "x_limit", "cpu_s",
                               "cpu_x_limit", "frames_used", "identical_to_pyav"])
    finish(args.out, payload, md, show=True)
    return 0


# ----------------------------------------------------------------------------- NVDEC

# The long clip of the NVDEC rows: long enough for 2,048 distinct samples, short enough to make
# in seconds on the device (x264's defaults at -preset veryfast: keyint 250, 3 B-frames, CABAC).
NVDEC_CLIP = ("h264_720p_150s.mp4", 150, 1280, 720, 30)


def nvdec_args(argv):
    ap = argparse.ArgumentParser(prog="bench_video.py nvdec",
                                 description="seconds to decode the sampled frames of a long "
                                             "H.264 clip: torchcodec on NVDEC against the CPU "
                                             "decoders on every core")
    ap.add_argument("--frames", default="64,2048", help="comma list of sampled frame counts")
    ap.add_argument("--cache", default=os.environ.get(
        "VIDEOROUTER_BENCH_CACHE", os.path.expanduser("~/.cache/videorouter-bench")))
    ap.add_argument("--out", default=os.path.join(RESULTS,
                                                  "video_nvdec.json"))
    args = ap.parse_args(argv)
    try:
        args.frames = [int(x) for x in args.frames.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--frames: expected a comma list of ints, got {args.frames!r}")
    if not args.frames or min(args.frames) < 1 or max(args.frames) > NVDEC_CLIP[1] * NVDEC_CLIP[4]:
        ap.error(f"--frames: expected ints in 1..{NVDEC_CLIP[1] * NVDEC_CLIP[4]} (the clip's "
                 f"frames), got {args.frames}")
    return args


def nvdec_clip(cache: str) -> str:
    """The long clip, made once: by ffmpeg where it is on PATH, else by PyAV's own libx264 (a
    GPU image may have no ffmpeg command)."""
    import shutil
    fname, seconds, w, h, rate = NVDEC_CLIP
    path = os.path.join(cache, fname)
    if os.path.exists(path):
        return path
    os.makedirs(cache, exist_ok=True)
    tmp = path + ".tmp.mp4"
    if shutil.which("ffmpeg"):
        subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i",
                        f"testsrc2=size={w}x{h}:rate={rate}", "-t", str(seconds), "-c:v",
                        "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p", tmp], check=True)
    else:
        _pyav_clip(tmp, seconds, w, h, rate)
    os.replace(tmp, path)
    return path


def _pyav_clip(path: str, seconds: int, w: int, h: int, rate: int) -> None:
    import av
    import numpy as np
    yy, xx = np.mgrid[0:h, 0:w]
    with av.open(path, "w") as c:
        s = c.add_stream("libx264", rate=rate)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        s.options = {"preset": "veryfast"}
        for i in range(seconds * rate):   # a moving gradient: every frame differs
            img = np.stack([(xx + 4 * i) % 256, (yy + 2 * i) % 256,
                            np.full_like(xx, (3 * i) % 256)], -1).astype(np.uint8)
            for pkt in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                c.mux(pkt)
        for pkt in s.encode():
            c.mux(pkt)


def _nvdec_methods(cores: int, T: int) -> list:
    """(label, decoder, workers, seek, device) rows for T samples."""
    have = decoders.available_decoders()
    rows = []
    if "torchcodec" in have:
        import torch
        if torch.cuda.is_available():
            rows.append(("torchcodec, NVDEC (cuda)", "torchcodec", 1, "exact", "cuda"))
        rows.append(("torchcodec, CPU", "torchcodec", 1, "exact", "cpu"))
    rows.append((f"PyAV exact, {cores} workers (all cores)", "pyav", cores, "exact", "cpu"))
    rows.append((f"PyAV keyframe, {cores} workers (all cores)", "pyav", cores, "keyframe", "cpu"))
    if "decord" in have and T <= 256:   # one thread: at 2,048 samples it would take the stage
        rows.append(("decord, 1 thread", "decord", 1, "exact", "cpu"))
    return rows


def _nvdec_one(info, idx, scale, dec, workers, seek, device):
    import time
    from vr_runtime.video import torchcodec_decoder
    n = [0]
    t0, c0 = time.perf_counter(), time.process_time()
    if dec == "torchcodec":   # its device named explicitly: the CPU row too
        torchcodec_decoder.decode_torchcodec(info, idx, scale, lambda i, f: n.__setitem__(0, n[0] + 1),
                                             device=device)
    else:
        decoders.decode_frames(info, idx, scale, lambda i, f: n.__setitem__(0, n[0] + 1), dec,
                               workers=workers, seek=seek)
    return time.perf_counter() - t0, time.process_time() - c0, n[0]


def nvdec_main(argv) -> int:
    args = nvdec_args(argv)
    from vr_runtime.video.load import open_video, sample_indices
    if "torchcodec" not in decoders.available_decoders():   # before the minute the clip takes
        print("bench_video nvdec: torchcodec does not load here; the NVDEC rows need it and the "
              "system's FFmpeg 4-8 shared libraries (docs/video-input.md)", file=sys.stderr)
        return 2
    cores = decoders.default_workers()
    info = open_video(nvdec_clip(args.cache))
    scale = decoders.scaled_size(info.width, info.height, 448)
    rows = []
    for T in args.frames:
        idx = sample_indices(info.num_frames, T, info.fps)
        for label, dec, w, seek, device in _nvdec_methods(cores, T):
            use = decoders.keyframe_indices(info, idx) if seek == "keyframe" else idx
            try:
                if T == args.frames[0]:   # device and library start-up, once, untimed
                    _nvdec_one(info, use[:2], scale, dec, w, seek, device)
                wall, cpu, got = _nvdec_one(info, use, scale, dec, w, seek, device)
                row = dict(frames=T, method=label, time_s=round(wall, 3), cpu_s=round(cpu, 2),
                           frames_delivered=got)
            except Exception as e:   # a decoder that fails here: say so, time the others
                row = dict(frames=T, method=label, time_s="fails: " + str(e).splitlines()[0][:120])
            rows.append(row)
            print(json.dumps(row), flush=True)
    env = environment()
    env.update(cores_available=cores, decoders=decoders.available_decoders())
    try:
        import torchcodec
        env["torchcodec"] = torchcodec.__version__
    except Exception as e:  # recorded: why the NVDEC rows are missing
        env["torchcodec"] = "not loaded: " + str(e).splitlines()[0][:160]
    payload = {"benchmark": "NVDEC (torchcodec) against the CPU decoders: seconds to decode the "
                            "sampled frames of a long clip at the pipeline's decode size",
               "clip": f"{info.codec} {info.width}x{info.height}, {info.duration_s:.0f} s, "
                       f"{info.num_frames} frames", "environment": env,
               "settings": vars(args), "rows": rows}
    finish(args.out, payload, markdown_table(rows, ["frames", "method", "time_s", "cpu_s",
                                                    "frames_delivered"]), show=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
