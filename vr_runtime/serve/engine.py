"""One model per process, a bounded queue in front of it, a deadline per request.

:class:`Engine` owns the :class:`~vr_runtime.VideoRouter` and runs every ``answer`` on one
worker thread under a lock, so requests take turns on the model in arrival order. A request holds
a slot from the moment it is admitted (before its video is checked) until its answer is done;
at most ``max_queue`` requests wait behind the one running, and one more is a 429 at once.

The deadline (``timeout_s``, from admission) ends the *request*: a request still waiting when it
passes is never started and the client gets a 504. A computation already running on the model is
not interrupted (the runtime has no safe point to stop at); it finishes, its result is dropped,
and its slot frees only then, so the queue bound stays true.

Work on recently seen videos is reused across requests by the runtime itself:
``answer(..., cache_visual=True)`` with ``VideoRouter(visual_cache_size=N)`` keeps the decoded
frames, Z and the Image Router's question-independent state of the last N videos (LRU), keyed by
the file's path, size and mtime and the frame count. Answers are the same with and without it
(tests/serve/test_serve_app.py checks).
"""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import os
import socket
import threading
from dataclasses import dataclass
from typing import Callable, Optional

from .errors import APIError, from_exception
from .media import MediaStore, Video
from .schema import Settings


@dataclass(frozen=True)
class EngineConfig:
    model: str = "tiny"
    routers: Optional[str] = None
    device: Optional[str] = None          # default: cuda if available, else cpu (as ask)
    dtype: Optional[str] = None           # bf16|fp16|fp32; default as ask
    visual_cache: int = 4                 # videos whose per-video state is kept; 0 = off
    max_queue: int = 64
    timeout_s: float = 300.0
    media_threads: int = 2


def worker_id() -> str:
    """Names the process that answered (header ``x-videorouter-worker``): with Ray Serve, the
    replica."""
    return f"{socket.gethostname()}:{os.getpid()}"


class _Slot:
    """A request's place in the queue; released exactly once, by whoever finishes last."""

    def __init__(self, engine: "Engine"):
        self._engine = engine
        self._lock = threading.Lock()
        self._released = False
        self.running = False      # its model job has started and not finished
        self.abandoned = False    # the client side gave up (deadline): skip the job if not started

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        self._engine._leave()


class Engine:
    def __init__(self, vr, media: MediaStore, config: EngineConfig, name: Optional[str] = None):
        self.vr = vr
        self.media = media
        self.config = config
        self.name = name or config.model
        self._model_lock = threading.Lock()
        self._model_pool = cf.ThreadPoolExecutor(1, thread_name_prefix="vr-model")
        self._media_pool = cf.ThreadPoolExecutor(max(1, config.media_threads),
                                                 thread_name_prefix="vr-media")
        self._count_lock = threading.Lock()
        self._admitted = 0
        self._running = 0
        self.served = 0

    @classmethod
    def load(cls, config: EngineConfig, media: MediaStore) -> "Engine":
        """Load the model as ``videorouter ask`` does (same presets, devices, dtypes)."""
        import argparse

        from ..cli import _device_dtype
        from ..runtime import VideoRouter
        device, dtype = _device_dtype(argparse.Namespace(device=config.device, dtype=config.dtype))
        vr = VideoRouter.from_pretrained(config.model, routers=config.routers, device=device,
                                         dtype=dtype, visual_cache_size=max(1, config.visual_cache))
        return cls(vr, media, config)

    def close(self) -> None:
        self._model_pool.shutdown(wait=False, cancel_futures=True)
        self._media_pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ queue
    @property
    def capacity(self) -> int:
        return self.config.max_queue + 1   # the one running + max_queue waiting

    def stats(self) -> dict:
        with self._count_lock:
            return {"running": self._running, "waiting": self._admitted - self._running,
                    "max_queue": self.config.max_queue, "served": self.served}

    def admit(self) -> _Slot:
        with self._count_lock:
            if self._admitted >= self.capacity:
                raise APIError(429, f"the server is busy: {self.config.max_queue} requests are "
                               f"already waiting; retry later")
            self._admitted += 1
        return _Slot(self)

    def _leave(self) -> None:
        with self._count_lock:
            self._admitted -= 1

    # ------------------------------------------------------------------ running
    async def answer(self, settings: Settings):
        """Admit, check the video, wait for the model, answer -> ``vr_runtime.Answer``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.timeout_s
        slot = self.admit()
        video: Optional[Video] = None
        handed_over = False
        try:
            checking = loop.run_in_executor(self._media_pool, self.media.resolve,
                                            settings.video_url)
            # If the deadline passes first, the video it pins must still be let go of.
            checking.add_done_callback(lambda f: slot.abandoned and not f.cancelled()
                                       and f.exception() is None and self.media.release(f.result()))
            video = await self._wait(checking, deadline, slot)
            job = self._model_pool.submit(self._run, slot, video, settings)
            handed_over = True   # from here the job releases the slot and the video
            return await self._wait(asyncio.wrap_future(job), deadline, slot)
        finally:
            if not handed_over:
                if video is not None:
                    self.media.release(video)
                slot.release()

    async def _wait(self, fut, deadline: float, slot: _Slot):
        remaining = deadline - asyncio.get_running_loop().time()
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout=max(remaining, 0.0))
        except asyncio.TimeoutError:
            slot.abandoned = True
            raise APIError(504, f"the request took longer than the server's per-request "
                           f"timeout of {self.config.timeout_s:g} s") from None

    def _run(self, slot: _Slot, video: Video, s: Settings):
        try:
            with self._model_lock:
                if slot.abandoned:   # its deadline passed while it waited: never start it
                    raise APIError(504, "the request timed out while waiting for the model")
                with self._count_lock:
                    self._running += 1
                try:
                    return self._answer(video, s)
                finally:
                    with self._count_lock:
                        self._running -= 1
                        self.served += 1
        finally:
            self.media.release(video)
            slot.release()

    def _answer(self, video: Video, s: Settings):
        """The same ``VideoRouter.answer`` call ``videorouter ask`` makes, on the checked file."""
        try:
            return self.vr.answer(video.path, s.question, num_frames=s.num_frames,
                                  max_length=s.max_length, max_new_tokens=s.max_new_tokens,
                                  policy=s.policy, system=s.system,
                                  cache_visual=self.config.visual_cache > 0)
        except Exception as e:
            raise from_exception(e, {video.path: video.label} if video.stored else None) from None

    # ------------------------------------------------------------------ one process, one model
    def run_sync(self, fn: Callable):
        """Run ``fn(vr)`` on the model thread under the lock (tests, warm-up)."""
        def job():
            with self._model_lock:
                return fn(self.vr)
        return self._model_pool.submit(job).result()


_shared: Optional[Engine] = None
_shared_lock = threading.Lock()


def shared_engine(config: EngineConfig, media_config) -> Engine:
    """The process's one engine, loaded on first use (a Ray Serve replica's constructor and its
    FastAPI app both reach the same one through here)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Engine.load(config, MediaStore(media_config))
        return _shared

