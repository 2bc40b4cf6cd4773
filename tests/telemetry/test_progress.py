"""The terminal's stage status (vr_runtime.telemetry.progress): shown for a stage past the delay, erased
when it ends, silent for short stages and for decoding, and never when disabled."""
import io
import threading
import time

from vr_runtime.telemetry.progress import stage_status
from vr_runtime.telemetry.timing import StageTimer, _listeners


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_long_stage_is_shown_then_erased():
    out = Tty()
    timer = StageTimer("cpu")
    with stage_status(True, out, delay=0.05, interval=0.01):
        with timer.stage("vision"):
            time.sleep(0.5)
        with timer.stage("router"):
            pass                                   # too short to show
        with timer.stage("frames"):
            time.sleep(0.1)                        # has its own bar
    text = out.getvalue()
    assert "vision... " in text and " s" in text
    assert "router" not in text and "frames" not in text
    assert text.endswith("\r\x1b[K")               # the line is erased
    assert not _listeners and not [t for t in threading.enumerate() if t.name == "vr-progress"]


def test_disabled_writes_nothing():
    out = Tty()
    timer = StageTimer("cpu")
    with stage_status(False, out):
        with timer.stage("vision"):
            time.sleep(0.05)
    assert out.getvalue() == "" and not _listeners


def test_cli_switch(monkeypatch):
    import argparse

    from vr_runtime import cli
    monkeypatch.setattr(cli, "stderr_is_tty", lambda: True)
    assert cli._show_progress(argparse.Namespace(json=False))
    assert not cli._show_progress(argparse.Namespace(json=True))
    assert not cli._show_progress(argparse.Namespace(json=False, no_progress=True))
    monkeypatch.setattr(cli, "stderr_is_tty", lambda: False)
    assert not cli._show_progress(argparse.Namespace(json=False))
