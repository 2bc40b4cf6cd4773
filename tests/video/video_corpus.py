"""A small corpus of real-world video files, made at test time by ffmpeg (the Debian package;
CI installs it) from its own test source, and ffmpeg's own decode of each as the reference.

Every file is tiny (<= 320x240, <= 3 s) so the whole corpus encodes in a few seconds on two
cores. ``make_corpus(dir)`` returns {name: Case}; ``reference(path)`` returns ffmpeg's frames
(RGB, autorotated, every frame: ``-fps_mode passthrough``) and ffprobe's frame times.
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

SRC = "testsrc2=size={w}x{h}:rate={r}:duration={d}"


@dataclass
class Case:
    path: str
    codec: str                   # FFmpeg codec name the probe must report
    width: int                   # displayed size (after rotation)
    height: int
    decord: bool = False         # decoder="auto" would use decord for it
    note: Optional[str] = None   # what the case is about


# name: (file name, codec, w, h, rate, seconds, ffmpeg output options, extra input filter)
SPECS: Dict[str, tuple] = {
    "h264": ("h264.mp4", "h264", 160, 120, 15, 2, ["-c:v", "libx264", "-preset", "ultrafast",
                                                   "-bf", "2", "-g", "8"], None),
    "h264_bframes_mkv": ("h264.mkv", "h264", 160, 120, 25, 2,
                         ["-c:v", "libx264", "-preset", "veryfast", "-bf", "3", "-g", "12"],
                         None),
    "hevc": ("hevc.mp4", "hevc", 160, 120, 15, 2,
             ["-c:v", "libx265", "-preset", "ultrafast", "-x265-params", "log-level=0:keyint=8",
              "-tag:v", "hvc1"], None),
    "av1": ("av1.mp4", "av1", 160, 120, 15, 2,
            ["-c:v", "libsvtav1", "-preset", "12", "-g", "8"], None),
    "vp9_realtime": ("vp9_rt.webm", "vp9", 160, 120, 15, 2,
                     ["-c:v", "libvpx-vp9", "-b:v", "300k", "-deadline", "realtime",
                      "-cpu-used", "8"], None),
    "vp8": ("vp8.webm", "vp8", 160, 120, 15, 2, ["-c:v", "libvpx", "-b:v", "300k",
                                                 "-deadline", "realtime", "-cpu-used", "8"],
            None),
    "mpeg2_ts": ("mpeg2.ts", "mpeg2video", 160, 120, 25, 2,
                 ["-c:v", "mpeg2video", "-q:v", "3", "-g", "10", "-bf", "2"], None),
    "mpeg2_ps": ("mpeg2.mpg", "mpeg2video", 160, 120, 25, 1,
                 ["-c:v", "mpeg2video", "-bf", "2", "-f", "vob"], None),
    # AVI keeps no presentation times; with B-frames frames are told apart by count
    "h264_avi": ("h264.avi", "h264", 160, 120, 10, 2,
                 ["-c:v", "libx264", "-preset", "ultrafast", "-bf", "2"], None),
    # a raw elementary stream: no container, no timestamps at all
    "raw_h264": ("raw.h264", "h264", 160, 120, 10, 1,
                 ["-c:v", "libx264", "-preset", "ultrafast", "-bf", "2", "-f", "h264"], None),
    "mjpeg": ("mjpeg.avi", "mjpeg", 160, 120, 10, 2, ["-c:v", "mjpeg", "-q:v", "3"], None),
    "prores": ("prores.mov", "prores", 96, 64, 10, 1, ["-c:v", "prores_ks", "-profile:v", "0"],
               None),
    "gif": ("anim.gif", "gif", 96, 64, 10, 2, ["-f", "gif"], None),
    # Variable frame rate, as phones and WebRTC recorders write: 20 fps for 1 s, then 5 fps.
    "vfr": ("vfr.mp4", "h264", 160, 120, 20, 3,
            ["-c:v", "libx264", "-preset", "ultrafast", "-bf", "0", "-fps_mode", "vfr",
             "-video_track_timescale", "1000"],
            "select='lt(n\\,20)+not(mod(n\\,4))',setpts='if(lt(N\\,20)\\,N*0.05\\,1+(N-20)*0.2)/TB'"),
    # A phone held upright: coded landscape, a display matrix saying "rotate 90" (written with
    # PyAV: Debian's ffmpeg 5.1 has no -display_rotation).
    "rotated": ("rotated.mp4", "h264", 64, 96, 10, 1, None, None),
    "ten_bit": ("10bit.mkv", "hevc", 160, 120, 10, 1,
                ["-c:v", "libx265", "-preset", "ultrafast", "-pix_fmt", "yuv420p10le",
                 "-x265-params", "log-level=0"], None),
    "odd_size": ("odd.mp4", "h264", 97, 61, 10, 1,  # testsrc2 rounds to even: scale after
                 ["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv444p"],
                 "scale=97:61"),
    "not_mod16": ("not16.mkv", "h264", 170, 98, 10, 1,
                  ["-c:v", "libx264", "-preset", "ultrafast"], None),
    "one_frame": ("one.mp4", "h264", 64, 48, 10, 1,
                  ["-c:v", "libx264", "-preset", "ultrafast", "-frames:v", "1"], None),
    "truncated_mkv": ("cut_src.mkv", "h264", 160, 120, 15, 3,
                      ["-c:v", "libx264", "-preset", "ultrafast", "-g", "15"], None),
}


def ffmpeg_available() -> bool:
    return shutil.which("ffmpeg") is not None and shutil.which("ffprobe") is not None


def _run(cmd: List[str]) -> bytes:
    # no stdin: an ffmpeg whose stdin is a terminal it does not own stops (SIGTTOU) until killed
    res = subprocess.run(cmd, capture_output=True, stdin=subprocess.DEVNULL, timeout=120)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {res.stderr.decode(errors='replace')[-800:]}")
    return res.stdout


def make_corpus(d) -> Dict[str, Case]:
    import os
    from concurrent.futures import ThreadPoolExecutor
    out: Dict[str, Case] = {}

    def make(name):
        fname, codec, w, h, r, dur, opts, vf = SPECS[name]
        path = os.path.join(str(d), fname)
        if name == "rotated":
            _write_rotated(path, width=h, height=w, rate=r, frames=r * dur)
            return name, Case(path, codec, w, h, decord=False)
        cmd = ["ffmpeg", "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i",
               SRC.format(w=w + w % 2, h=h + h % 2, r=r, d=dur)]
        if vf:
            cmd += ["-vf", vf]
        cmd += ["-an", *opts, path]
        _run(cmd)
        if name == "truncated_mkv":  # cut at 60%: mkv has no trailing index, so it still opens
            data = open(path, "rb").read()
            path = os.path.join(str(d), "truncated.mkv")
            open(path, "wb").write(data[: int(len(data) * 0.6)])
        from vr_runtime.video import decoders
        # decord is checked wherever "auto" would use it
        uses_decord = "decord" in decoders._candidates(decoders.probe(path), "auto")
        return name, Case(path, codec, w, h, decord=uses_decord)

    # Two encoders at a time: the machine has two cores.
    with ThreadPoolExecutor(2) as ex:
        for name, case in ex.map(make, SPECS):
            out[name] = case
    return out


def _write_rotated(path, width, height, rate, frames):
    """H.264 whose display matrix rotates it 90 degrees; a lopsided pattern, so a wrong
    rotation or a mirror shows."""
    import av
    yy, xx = np.mgrid[0:height, 0:width]
    with av.open(path, "w") as c:
        s = c.add_stream("libx264", rate=rate)
        s.width, s.height, s.pix_fmt = width, height, "yuv420p"
        s.options = {"preset": "ultrafast", "crf": "10"}
        s.set_display_rotation(90)
        for i in range(frames):
            img = np.stack([xx * 255 // width, yy * 255 // height,
                            np.full_like(xx, 20 * i)], -1).astype(np.uint8)
            img[: height // 4, : width // 3] = 255
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


def reference(path: str) -> Tuple[np.ndarray, np.ndarray]:
    """ffmpeg's decode: (uint8 [N, H, W, 3] RGB frames, float64 [N] times in s from the file's
    start), every frame in presentation order, autorotated as ffmpeg does by default."""
    info = _run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries",
                 "stream=width,height:stream_side_data=rotation:format=start_time",
                 "-of", "default=nw=1", path]).decode()
    kv = dict(line.split("=", 1) for line in info.splitlines() if "=" in line)
    w, h = int(kv["width"]), int(kv["height"])
    if int(float(kv.get("rotation", 0) or 0)) % 180:
        w, h = h, w
    start_text = kv.get("start_time", "0")
    start = 0.0 if start_text in ("", "N/A") else float(start_text)
    raw = _run(["ffmpeg", "-nostdin", "-v", "error", "-i", path, "-map", "0:v:0", "-fps_mode",
                "passthrough", "-f", "rawvideo", "-pix_fmt", "rgb24", "-"])
    frames = np.frombuffer(raw, np.uint8).reshape(-1, h, w, 3)
    times = _run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries",
                  "frame=best_effort_timestamp_time", "-of", "csv=p=0", path]).decode()
    t = np.array([float(x.strip().rstrip(",")) for x in times.split() if x.strip()
                  and x.strip().rstrip(",") != "N/A"])  # (raw streams have no times)
    return frames, t - start


def keyframe_times(path: str) -> np.ndarray:
    """ffprobe's keyframes: the times (s from the file's start) of the frames its decoder
    outputs with ``-skip_frame nokey``, as ``-show_entries frame=pts_time`` reports them."""
    fmt = _run(["ffprobe", "-v", "error", "-show_entries", "format=start_time", "-of",
                "default=nw=1:nk=1", path]).decode().strip()
    start = 0.0 if fmt in ("", "N/A") else float(fmt)
    out = _run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-skip_frame", "nokey",
                "-show_entries", "frame=pts_time", "-of", "csv=p=0", path]).decode()
    return np.array([float(x.strip().rstrip(",")) for x in out.split()
                     if x.strip().rstrip(",") not in ("", "N/A")]) - start
