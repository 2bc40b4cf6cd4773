"""Candidate decoders against ffmpeg's own decode: which sampled frames each returns exactly, on
the video corpus of tests/video/video_corpus.py, and its time to 32 frames of the 10-minute
720p H.264 clip of ``bench_video.py ttf`` (made first by that command).

Run with the candidate first on the path, from an unpacked wheel (nothing is installed):

    pip download --no-deps decord2==3.4.0 -d /tmp/w && unzip -q /tmp/w/decord2-*.whl -d /tmp/d2
    PYTHONPATH=/tmp/d2 python -m bench.scripts.bench_decoder_candidates > bench/results/decoder_candidates_decord2.json
    python -m bench.scripts.bench_decoder_candidates > bench/results/decoder_candidates_decord.json
"""
import sys, time, json
import os
# The corpus is the video tests' own (tests/ is not a package): its folder goes on the path
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "video"))
import numpy as np
import decord
import video_corpus as vc
from vr_runtime.video.load import open_video, sample_indices
out = {"decord": decord.__version__, "from": "unpacked wheel" if "site-packages" not in decord.__file__ else "installed", "load_avg_1m": round(os.getloadavg()[0], 2), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
import tempfile
corpus = vc.make_corpus(tempfile.mkdtemp(prefix="corpus"))
res = {}
for name in ("h264", "h264_bframes_mkv", "hevc", "av1", "vp9_realtime", "mpeg2_ts", "gif", "rotated", "ten_bit"):
    case = corpus[name]
    frames, _ = vc.reference(case.path)
    info = open_video(case.path)
    idx = sorted(set(sample_indices(info.num_frames, 6, 1.0)) | {0, info.num_frames - 1})
    try:
        vr = decord.VideoReader(case.path, ctx=decord.cpu(0))
        if len(vr) != len(frames):
            res[name] = f"{len(vr)} frames, ffmpeg {len(frames)}"; continue
        got = vr.get_batch(idx).asnumpy()
        if got.shape != frames[idx].shape:
            res[name] = f"shape {got.shape} vs {frames[idx].shape}"; continue
        d = np.abs(got.astype(int) - frames[idx].astype(int))
        res[name] = f"max diff {d.max()}, mean {d.mean():.2f}"
    except Exception as e:
        res[name] = "fails: " + str(e).splitlines()[0][:100]
out["exactness_vs_ffmpeg"] = res
p = os.path.join(os.environ.get("VIDEOROUTER_BENCH_CACHE", os.path.expanduser("~/.cache/videorouter-bench")), "h264_720p_600s.mp4")
info = open_video(p)
idx = sample_indices(info.num_frames, 32, info.fps)
t0 = time.perf_counter()
vr = decord.VideoReader(p, ctx=decord.cpu(0), width=896, height=720)
t1 = time.perf_counter()
for s in range(0, 32, 4):
    vr.get_batch(idx[s:s+4]).asnumpy()
out["h264_720p_32_frames_s"] = round(time.perf_counter() - t0, 2)
out["index_s"] = round(t1 - t0, 2)
print(json.dumps(out, indent=1))
