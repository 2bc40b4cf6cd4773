"""Hostile media on the command-line side: the decode is bounded by what a frame costs (a
GIF's logical screen counts), only regular files are opened (and opened once), undeclared
durations are counted while indexing, a decode stops when asked, and the visual cache's key
changes when a file's content does even with its size and mtime kept."""
import os
import pathlib
import shutil
import struct
import subprocess

import pytest

from vr_runtime.video import decoders as D
from vr_runtime.errors import VideoError
from vr_runtime.video.load import VideoFile, load_video, open_video

SAMPLE = pathlib.Path(__file__).resolve().parents[2] / "vr_runtime" / "assets" / "sample.mp4"


def gif(width, height, frames=3) -> bytes:
    """An animated GIF of 1x1 images on a ``width`` x ``height`` logical screen (a few bytes;
    its decoder paints every frame at the screen's size)."""
    b = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\0\0\0\xff\xff\xff"
    for _ in range(frames):
        b += b"\x21\xf9\x04\x00\x0a\x00\x00\x00"                     # 0.1 s a frame
        b += b"\x2c" + struct.pack("<HHHHB", 0, 0, 1, 1, 0) + b"\x02\x02\x44\x01\x00"
    return b + b"\x3b"


def test_a_gif_whose_logical_screen_is_huge_is_refused_before_decoding(tmp_path):
    bomb = tmp_path / "bomb.gif"
    bomb.write_bytes(gif(16000, 16000))
    assert bomb.stat().st_size < 200
    with pytest.raises(VideoError, match=r"GIF's logical screen is 16000x16000 .* over the "
                                         r"limit of 33,177,600 pixels \(--max-frame-pixels"):
        load_video(bomb, num_frames=2)
    small = tmp_path / "small.gif"
    small.write_bytes(gif(64, 48, frames=6))
    assert load_video(small, num_frames=2).num_frames == 2       # a normal GIF still decodes
    old = D.set_limits(max_frame_pixels=64 * 47)                  # --max-frame-pixels
    try:
        with pytest.raises(VideoError, match=r"64x48 \(3,072 pixels\), over the limit of 3,008"):
            open_video(small)
    finally:
        D.set_limits(**old.__dict__)


@pytest.mark.parametrize("kind", ["fifo", "pipe", "chardev", "procfs"])
def test_only_regular_files_are_opened_and_each_is_named(kind, tmp_path):
    fds = []
    if kind == "fifo":
        path = tmp_path / "clip.mp4"
        os.mkfifo(path)          # no writer: opening it for reading would block forever
        match = r"is a named pipe \(FIFO\), not a video file"
    elif kind == "pipe":         # what `ask <(cat clip.mp4)` passes: /dev/fd/N of a pipe
        r, w = os.pipe()
        fds += [r, w]
        path = f"/dev/fd/{r}"
        match = r"is a pipe .*process substitution: pass a file"
    elif kind == "chardev":
        path, match = "/dev/urandom", r"is a character device, not a video file"
    else:
        path, match = "/proc/self/status", r"is a virtual file of the kernel \(proc\)"
    try:
        with pytest.raises(VideoError, match=match):
            load_video(path, num_frames=2)
    finally:
        for fd in fds:
            os.close(fd)


def test_ask_names_a_named_pipe_in_one_line(tmp_path, capsys):
    from vr_runtime import cli
    fifo = tmp_path / "clip.mp4"
    os.mkfifo(fifo)
    with pytest.raises(SystemExit) as e:
        cli.main(["ask", str(fifo), "what is shown?", "--device", "cpu"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"videorouter: error: {fifo}: is a named pipe (FIFO), not a video file; "
                   f"pass a regular file"]


def test_a_file_is_read_through_the_descriptor_opened_first(tmp_path):
    d = tmp_path / "media"
    d.mkdir()
    (d / "clip.mp4").write_bytes(SAMPLE.read_bytes())
    f = VideoFile(d / "clip.mp4")
    ident = f.identity
    # the folder is swapped for another after the check: readers still get the opened file
    shutil.move(str(d), str(tmp_path / "moved"))
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", d)
    info = open_video(str(d / "clip.mp4"), file=f)
    assert info.open_path == f"/proc/self/fd/{f.fd}" and info.num_frames > 0
    assert os.stat(info.open_path).st_ino == ident[1]
    assert f.real_path == str(tmp_path / "moved" / "clip.mp4")
    f.close()


@pytest.fixture(scope="module")
def undeclared(tmp_path_factory):
    """8 s of 64x64 video written to a pipe: the Matroska header declares no duration."""
    out = tmp_path_factory.mktemp("pipe") / "long.mkv"
    with open(out, "wb") as f:
        subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-f", "lavfi", "-i",
                        "testsrc=size=64x64:rate=5:duration=8", "-c:v", "mjpeg", "-f",
                        "matroska", "pipe:1"], stdout=f, check=True)
    return out


def test_an_undeclared_duration_is_counted_while_indexing(undeclared):
    info = open_video(undeclared)
    assert info.declared_s is None and info.duration_s == pytest.approx(8.0, abs=0.3)
    with pytest.raises(VideoError, match=r"runs past 5\.\d s; at most 5 s are accepted "
                                         r"\(--max-video-seconds\)"):
        open_video(undeclared, limits=D.Limits(max_seconds=5.0))
    with pytest.raises(VideoError, match=r"more than 20 frames"):
        open_video(undeclared, limits=D.Limits(max_frames=20))


def test_a_decode_stops_between_frames_when_asked(undeclared):
    calls = []

    def should_stop():
        calls.append(1)
        return "the deadline passed" if len(calls) > 1 else None
    with pytest.raises(VideoError, match="decoding stopped: the deadline passed"):
        load_video(undeclared, num_frames=8, should_stop=should_stop)


def test_the_cache_key_changes_when_content_is_rewritten_keeping_size_and_mtime(tmp_path):
    from vr_runtime.runtime.cache import video_key
    p = tmp_path / "clip.mp4"
    p.write_bytes(SAMPLE.read_bytes())
    st = p.stat()
    key = video_key(str(p), 8, None)
    data = bytearray(p.read_bytes())
    data[-1] ^= 0xFF                      # other content, same size (cp -p, rsync -t, tar)
    p.write_bytes(bytes(data))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert p.stat().st_size == st.st_size and p.stat().st_mtime_ns == st.st_mtime_ns
    assert video_key(str(p), 8, None) != key
    # a clip decoded from the file is keyed as the file itself
    clip = load_video(p, num_frames=8)
    assert video_key(clip, 8, None) == video_key(str(p), 8, None)
