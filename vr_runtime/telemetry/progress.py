"""A one-line status on a terminal for the stages of an answer that take more than about a
second (vision, router, compress, prefill, generate): the stage's name and its elapsed time,
redrawn in place on stderr and erased when the answer is done. Decoding has its own bar
(vr_runtime.video.load), so it is not shown here.

Used by ``videorouter ask``/``demo`` on a terminal only: never with ``--json``,
``--no-progress`` or a stderr that is not a tty, so captured output stays clean.
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Optional

from .timing import stage_listener

# Shown once a stage has run this long: shorter ones would only flicker.
DELAY_S = 1.0
# Stages with a display of their own.
QUIET = frozenset({"frames"})


class StageStatus:
    """Listens to the stage timers and redraws ``<stage>... <seconds> s`` every 0.2 s."""

    def __init__(self, stream=None, delay: float = DELAY_S, interval: float = 0.2):
        self.stream = stream or sys.stderr
        self.delay, self.interval = delay, interval
        self._lock = threading.Lock()
        self._stage: Optional[str] = None
        self._t0 = 0.0
        self._shown = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vr-progress", daemon=True)

    def __call__(self, name: str, started: bool) -> None:
        with self._lock:
            if name in QUIET:
                return
            if started:
                self._stage, self._t0 = name, time.perf_counter()
            elif self._stage == name:
                self._stage = None
                self._clear()

    def _clear(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                if self._stage is None:
                    continue
                el = time.perf_counter() - self._t0
                if el >= self.delay:
                    try:
                        self.stream.write(f"\r\x1b[K{self._stage}... {el:.1f} s")
                        self.stream.flush()
                        self._shown = True
                    except (OSError, ValueError):   # a closed terminal: stop drawing
                        return

    def start(self) -> "StageStatus":
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()
        with self._lock:
            self._clear()


@contextlib.contextmanager
def stage_status(enabled: bool, stream=None, delay: float = DELAY_S, interval: float = 0.2):
    """Show the running stage on ``stream`` (stderr) while the block runs, if ``enabled``."""
    if not enabled:
        yield None
        return
    status = StageStatus(stream, delay, interval).start()
    try:
        with stage_listener(status):
            yield status
    finally:
        status.close()


__all__ = ["StageStatus", "stage_status"]
