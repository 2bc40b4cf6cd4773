"""`videorouter` as a user's shell sees it: Ctrl-C at any moment, a reader that goes away
(``| head -1``), and a --frames request that cannot fit in memory.

The wall-clock bounds here are generous (the test machine is shared and loaded); the measured
latency from SIGINT to exit is printed with ``-s`` and reported in the README, not asserted
tightly."""
import os
import signal
import subprocess
import sys
import time

import pytest

from vr_runtime import cli

SAMPLE = str(cli.SAMPLE_VIDEO)
# A slow exit means the handler did not run: a healthy one takes well under a second.
EXIT_WALL_S = 5.0


def spawn(*args, env=None, **kw):
    e = dict(os.environ)
    e.pop("VIDEOROUTER_DEBUG", None)
    e.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "vr_runtime.cli", *map(str, args)],
                            env=e, text=True, **kw)


@pytest.fixture(scope="module")
def long_video(tmp_path_factory):
    """640x480, 8 s at 25 fps: 64 frames take a couple of seconds to decode, so the run is in
    its decode / model-load / prefill phases for several seconds."""
    import av
    import numpy as np
    path = tmp_path_factory.mktemp("sig") / "long.mp4"
    rng = np.random.default_rng(0)
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=25)
        s.width, s.height, s.pix_fmt = 640, 480, "yuv420p"
        s.options = {"preset": "ultrafast", "g": "250"}
        base = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
        for i in range(200):
            for p in s.encode(av.VideoFrame.from_ndarray(np.roll(base, 3 * i, axis=1),
                                                         format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


def wait_for_handler(p, limit_s=30.0):
    """Block until ``main`` has installed its SIGINT handler, which starts the process's
    second thread ("vr-sigint"); until then the interpreter is still starting up (site
    imports), which is Python's own and before any of the program's code (see README)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s and p.poll() is None:
        try:
            if len(os.listdir(f"/proc/{p.pid}/task")) >= 2:
                return
        except FileNotFoundError:
            return
        time.sleep(0.002)


def interrupt(video, delays, frames=64):
    """Start `ask`, wait for its handler, send SIGINT after each of ``delays`` seconds
    (cumulative), and return (returncode, stderr, seconds from the first SIGINT to exit)."""
    p = spawn("ask", video, "What happens?", "--frames", frames, stdout=subprocess.PIPE,
              stderr=subprocess.PIPE)
    wait_for_handler(p)
    t_sig = None
    for d in delays:
        time.sleep(d)
        if p.poll() is not None:
            break
        p.send_signal(signal.SIGINT)
        t_sig = t_sig or time.monotonic()
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail(f"still running 60 s after SIGINT (delays {delays})")
    return p.returncode, err, (time.monotonic() - t_sig) if t_sig else None


def assert_interrupted(rc, err, latency, what):
    assert latency is not None, f"{what}: the run ended before the signal was sent"
    assert rc == 130, (what, rc, err)
    assert err.splitlines() == ["videorouter: interrupted"], (what, err)
    assert "Traceback" not in err and "Exception ignored" not in err
    assert latency < EXIT_WALL_S, (what, latency)
    print(f"\n{what}: exit {rc} {latency * 1000:.0f} ms after SIGINT")


# Moments after main() starts: at once (argument parsing, then `import torch`), 0.4 s (torch,
# transformers imports), then decoding on the background thread while the model loads, the
# vision tower and prefill (1.5 s, 3 s on a loaded 2-core machine; the run takes ~9 s there).
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("delay", [0.0, 0.4, 1.5, 3.0])
def test_sigint_any_moment(long_video, delay):
    rc, err, latency = interrupt(long_video, [delay])
    assert_interrupted(rc, err, latency, f"SIGINT at {delay} s")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_second_sigint_during_exit(long_video):
    rc, err, latency = interrupt(long_video, [1.0, 0.01, 0.01])
    assert_interrupted(rc, err, latency, "three SIGINTs 10 ms apart")


def test_closed_stdout_is_quiet():
    """`videorouter ask ... | head -1`: the reader is gone before the answer is written."""
    r, w = os.pipe()
    os.close(r)  # nobody will ever read: the first write gets EPIPE
    p = spawn("ask", SAMPLE, "What happens?", "--frames", "2", "--max-new-tokens", "2",
              "--decoder", "pyav", stdout=w, stderr=subprocess.PIPE)
    os.close(w)
    _, err = p.communicate(timeout=180)
    assert p.returncode == cli.EXIT_BROKEN_PIPE, (p.returncode, err)
    assert err == "", err


def test_broken_pipe_on_json_write(monkeypatch):
    """The --json path's single write: same quiet exit (in-process, with a stdout that fails
    the way a closed pipe does)."""
    class Closed:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self):
            raise OSError("not a real stream")  # so the test's own fd 1 is left alone
    monkeypatch.setattr(sys, "stdout", Closed())
    with pytest.raises(SystemExit) as e:
        cli._write_stdout('{"text": "x"}\n')
    assert e.value.code == cli.EXIT_BROKEN_PIPE


def test_memory_refusal_is_one_line_before_work():
    t0 = time.monotonic()
    p = spawn("ask", SAMPLE, "What happens?", "--frames", "16",
              env={"VIDEOROUTER_MEMORY_LIMIT": "240M"}, stdout=subprocess.PIPE,
              stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=180)
    assert p.returncode == 2, (p.returncode, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("videorouter: error: "), err
    # frames stream through the tower: what must fit is a decoder and a window of frames,
    # not the clip, so fewer frames would not help and the line does not suggest it
    assert "need about" in lines[0] and "window of frames" in lines[0]
    assert out == ""
    assert "Traceback" not in err
    print(f"\nrefused in {time.monotonic() - t0:.1f} s (incl. interpreter and torch import)")


def test_bad_decoder_is_a_usage_error():
    p = spawn("ask", SAMPLE, "q", "--decoder", "ffmpeg", stdout=subprocess.PIPE,
              stderr=subprocess.PIPE)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and len(err.splitlines()) == 1 and "--decoder" in err, err


def test_decoder_choices_match_the_decoders_module():
    from vr_runtime.video import decoders
    from vr_runtime.cli_args import DECODERS, SEEKS
    assert DECODERS == decoders.DECODERS and SEEKS == decoders.SEEKS
