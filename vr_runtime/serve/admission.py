"""The engine's bounded queue as bookkeeping, apart from the model call (:mod:`.engine`): the
counts that make the bound (:class:`Admission`), each admitted request's place in it
(:class:`Slot`), and the checked requests that wait to share one ``answer_batch``
(:class:`BatchQueue`). The event loop admits and gives up requests while the model thread runs
them, so every count and list here is read and changed under a lock of its own."""
from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from typing import Optional

from .errors import APIError
from .schema import Settings


class Admission:
    """Requests admitted (running + waiting), running and served, and the engine-side endings
    (cancelled, timeout, drained). At most ``max_queue`` wait behind the one running."""

    def __init__(self, max_queue: int):
        self.max_queue = max_queue
        self._lock = threading.Lock()
        self.admitted = 0
        self.running = 0
        self.served = 0
        self.outcomes: Counter = Counter()

    @property
    def capacity(self) -> int:
        return self.max_queue + 1   # the one running + max_queue waiting

    def enter(self) -> bool:
        """Take a place if one is free (False: the queue is full)."""
        with self._lock:
            if self.admitted >= self.capacity:
                return False
            self.admitted += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self.admitted -= 1

    def count(self, outcome: str) -> None:
        with self._lock:
            self.outcomes[outcome] += 1

    @contextlib.contextmanager
    def running_jobs(self, n: int):
        """``n`` admitted requests on the model for the block; served once it ends, however."""
        with self._lock:
            self.running += n
        try:
            yield
        finally:
            with self._lock:
                self.running -= n
                self.served += n

    @property
    def busy(self) -> bool:
        with self._lock:
            return self.running > 0

    def stats(self) -> dict:
        with self._lock:
            return {"running": self.running, "waiting": self.admitted - self.running,
                    "max_queue": self.max_queue, "served": self.served,
                    **{k: self.outcomes[k] for k in ("cancelled", "timeout", "drained")}}


class Slot:
    """A request's place in the queue; released exactly once, by whoever finishes last."""

    def __init__(self, admission: Admission):
        self._admission = admission
        self._lock = threading.Lock()
        self._released = False
        self.running = False      # its model job has started
        self.abandoned = False    # the client side gave up (deadline, gone, drain): skip the job
        self.cancel = threading.Event()        # set when given up: stops its decode
        self.stop = asyncio.Event()            # set (on the event loop) by drain: answer stop_error
        self.stop_error: Optional[APIError] = None

    def start(self) -> bool:
        """On the model thread, under the model lock: may the job run? (Not once abandoned.)"""
        with self._lock:
            if self.abandoned:
                return False
            self.running = True
            return True

    def abandon(self, waiting_only: bool = False) -> bool:
        """Give the request up; True if its job had not started (so it never will).
        ``waiting_only``: leave a running job alone (a drain lets it finish: its frames,
        streamed on the model's turn, must not be stopped)."""
        with self._lock:
            if waiting_only and self.running:
                return False
            self.abandoned = True
            self.cancel.set()
            return not self.running

    def fail(self, err: APIError) -> None:
        self.stop_error = err
        self.stop.set()

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        self._admission.leave()


def batch_key(s: Settings) -> tuple:
    """Requests with equal keys can share one ``answer_batch`` call (all but the video and the
    question)."""
    return (s.system, s.num_frames, s.max_length, s.max_new_tokens, s.policy, str(s.scales),
            s.seek, s.time_window)


class BatchQueue:
    """Checked requests waiting for the model that may be answered together (``max_batch`` > 1,
    not streaming), in arrival order: (slot, video, settings, future) each."""

    def __init__(self, max_batch: int):
        self.max_batch = max_batch
        self._lock = threading.Lock()
        self._items: list = []

    def put(self, item: tuple) -> None:
        with self._lock:
            self._items.append(item)

    def take(self) -> list:
        """The oldest waiting request and up to ``max_batch - 1`` later ones with its batch key,
        out of the queue; [] when none waits (an earlier job answered them all)."""
        with self._lock:
            if not self._items:
                return []
            head = self._items.pop(0)
            key = batch_key(head[2])
            batch = [head]
            for item in list(self._items):
                if len(batch) >= self.max_batch:
                    break
                if batch_key(item[2]) == key:
                    self._items.remove(item)
                    batch.append(item)
            return batch

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def __iter__(self):
        with self._lock:
            return iter(list(self._items))


__all__ = ["Admission", "Slot", "BatchQueue", "batch_key"]
