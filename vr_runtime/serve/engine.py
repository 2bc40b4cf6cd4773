"""One model per process, a bounded queue in front of it, a deadline per request.

:class:`Engine` owns the :class:`~vr_runtime.VideoRouter`; :meth:`Engine.submit` takes one
request, and every ``VideoRouter.answer`` runs on one worker thread under a lock, so requests
take turns on the model in arrival order. A request holds a slot from the moment it is admitted
(before its video is checked) until its answer is done; at most ``max_queue`` requests wait
behind the one running, and one more is a 429 at once.

The deadline (``timeout_s``, from admission) ends the *request*: a request still waiting when it
passes is never started and the client gets a 504. A computation already running on the model is
not interrupted (the runtime has no safe point to stop at); it finishes, its result is dropped,
and its slot frees only then, so the queue bound stays true.

Work on recently seen videos is reused across requests by the runtime itself:
``answer(..., cache_visual=True)`` with ``VideoRouter(visual_cache_size=N)`` keeps the decoded
frames, Z and the Image Router's question-independent state of the last N videos (LRU), keyed by
the file's path, device, inode, size, mtime and ctime (a file rewritten in place is a new key) and
the frame count. Answers are the same with and without it
(tests/serve/test_serve_app.py checks).

Limits before work: the prompt's text tokens (question + system text, in the model's chat
template) are counted on a thread of their own with a private copy of the tokenizer -- never under
the model's lock -- and a prompt over ``max_prompt_tokens`` is refused before its video is
touched. (The app has already refused one over its character cap, before any tokenizing.) A
request whose client disconnects while it waits is dropped before the model runs it.

Batches (``max_batch`` > 1, ``--max-batch``): when the model frees up, the oldest waiting
non-streaming request is answered together with up to ``max_batch - 1`` other waiting ones with
the same settings (all but the video and the question) through ``VideoRouter.answer_batch``: one
prefill and decode for all, each answer the one it gets alone, each request its own response. A
batch that fails is answered one request at a time, so each gets its own error. Streaming
requests are never batched.

Videos are checked and decoded before they wait for the model, never under its lock: each
request's check (open once, index, caps, the sampling and the memory check) and the decode of its
first ``prefetch_frames`` frames (256: every frame of a request at the default caps) run on a
daemon thread of its own (a request that hangs holds no shared worker, and none can keep the
process from exiting). The frames wait as resized uint8 (0.6 MB a frame at 448x448, a quarter of
the float32 clip). A longer video's other frames stream on its turn on the model, through the
vision tower a chunk at a time (:mod:`vr_runtime.video.frames`), so a request holds at most
``prefetch_frames`` frames however many it samples. The decode stops between packets once the
request is given up (deadline, client gone; a drain lets the running request finish), so
``--timeout`` bounds it. At most ``max_batch + 1`` decoded videos wait at once (the one on the
model and the next); a video whose Z the visual cache already holds is not decoded again.

Draining (:meth:`Engine.drain`, on SIGTERM): no new request is admitted (503 + Retry-After), every
request not yet on the model is answered 503 + Retry-After at once, and the one running gets until
the drain timeout to finish; after that it too is answered 503.

The engine is the flow of a request (admit, check, wait, run, answer); the queue's bookkeeping
(counts, slots, the batchable requests) is :mod:`.admission`, the off-lock check and decode of
each video :mod:`.prefetch`.
"""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import copy
import dataclasses
import os
import socket
import threading
from dataclasses import dataclass
from typing import Callable, Optional

from .admission import Admission, BatchQueue, Slot
from .errors import APIError, Skipped, from_exception
from .media import MediaStore, Video
from .prefetch import Prefetch
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
    max_batch: int = 1                    # >1: answer up to this many waiting requests together
    scorer: str = "image-router"          # --scorer: a registered frame scorer (vr_runtime.routing.scorers)
    scorer_model: Optional[str] = None    # --scorer-model DIR, for scorers that load a model
    # Frames of a request decoded off the model's lock, before its turn (resized uint8: 0.6 MB
    # a frame at 448x448); the rest stream on its turn, overlapping the vision tower
    prefetch_frames: int = 256
    # How the model's stages run (ask's --decoding, --vision-compile, --router-compile,
    # --compile-cache); a compiled stage is compiled at load, before the first request.
    decoding: str = "auto"
    vision_compile: str = "auto"
    router_compile: str = "auto"
    compile_cache: Optional[str] = None


# Retry-After (seconds) on a 429 (busy) or a 503 (shutting down): long enough for a restarted
# server or another replica to take the request.
RETRY_AFTER_S = 5


def worker_id() -> str:
    """Names the process that answered (header ``x-videorouter-worker``): with Ray Serve, the
    replica."""
    return f"{socket.gethostname()}:{os.getpid()}"


class ClientGone(APIError):
    """The client disconnected before its answer was ready (nginx's 499; nobody reads it)."""

    def __init__(self):
        super().__init__(499, "the client closed the connection before the answer was ready")


def shutting_down(what: str) -> APIError:
    return APIError(503, f"the server is shutting down{what}; retry in {RETRY_AFTER_S} s",
                    headers={"Retry-After": str(RETRY_AFTER_S)})


class Engine:
    def __init__(self, vr, media: MediaStore, config: EngineConfig, name: Optional[str] = None,
                 scorer=None):
        self.vr = vr
        self.scorer = scorer    # a FrameScorer for every request, or None: the Image Router
        self.media = media
        self.config = config
        self.name = name or config.model
        self._model_lock = threading.Lock()
        self._model_pool = cf.ThreadPoolExecutor(1, thread_name_prefix="vr-model")
        self.prefetch = Prefetch(vr, media, config)   # each video checked and decoded off-lock
        # Prompts are counted with a private copy of the tokenizer on a thread of their own:
        # off the model's lock, and never sharing a Rust tokenizer object between threads.
        self._text_pool = cf.ThreadPoolExecutor(1, thread_name_prefix="vr-text")
        self._tokenizer = None
        self.admission = Admission(config.max_queue)
        self.draining = False
        self._slots: set = set()             # admitted, not yet answered (event loop only)
        self._batchable = BatchQueue(config.max_batch)   # (slot, video, settings, future)

    @classmethod
    def load(cls, config: EngineConfig, media: MediaStore) -> "Engine":
        """Load the model as ``videorouter ask`` does (same presets, devices, dtypes)."""
        # (imported here: torch stays out of the serve command's start-up)
        from ..backbones.devices import device_dtype
        from ..runtime import VideoRouter
        device, dtype = device_dtype(config.device, config.dtype)
        from ..backbones.compiled import CompileOptions
        compile = CompileOptions(vision=config.vision_compile, router=config.router_compile,
                                 cache_dir=config.compile_cache)
        vr = VideoRouter.from_pretrained(config.model, routers=config.routers, device=device,
                                         dtype=dtype, visual_cache_size=max(1, config.visual_cache),
                                         decoding=config.decoding, compile=compile)
        from ..routing.scorers import build_scorer
        scorer = build_scorer(config.scorer, config.scorer_model, device=device, dtype=dtype,
                              cache_visual=config.visual_cache > 0)
        return cls(vr, media, config, scorer=scorer)

    def close(self) -> None:
        self._model_pool.shutdown(wait=False, cancel_futures=True)
        self._text_pool.shutdown(wait=False, cancel_futures=True)

    @property
    def busy(self) -> bool:
        """A model job is running (a thread that cannot be interrupted)."""
        return self.admission.busy

    # ------------------------------------------------------------------ queue
    def stats(self) -> dict:
        return self.admission.stats()

    def admit(self) -> Slot:
        if self.draining:
            raise shutting_down("")
        if not self.admission.enter():
            raise APIError(429, f"the server is busy: {self.config.max_queue} requests are "
                           f"already waiting; retry later",
                           headers={"Retry-After": str(RETRY_AFTER_S)})
        return Slot(self.admission)

    # ------------------------------------------------------------------ the prompt's size
    def prompt_tokens(self, settings: Settings) -> int:
        """Text tokens of the prompt (chat template, system text and question; no frames), with
        the engine's own copy of the tokenizer (call it on ``_text_pool``)."""
        from ..backbones.prompt import text_tokens
        lm = self.vr.lm
        if self._tokenizer is None:
            self._tokenizer = copy.deepcopy(lm.tokenizer)
        return text_tokens(self._tokenizer, settings.question, 0, settings.system,
                           tokens=lm.vision_tokens, kept=[])

    async def _check_prompt(self, settings: Settings, max_tokens: int, deadline, slot, gone):
        loop = asyncio.get_running_loop()
        try:
            counting = loop.run_in_executor(self._text_pool, self.prompt_tokens, settings)
            n = await self._wait(counting, deadline, slot, gone)
        except ValueError as e:     # e.g. a question that holds the model's image tokens
            raise from_exception(e) from None
        if n > max_tokens:
            raise APIError(400, f"the prompt (question and system text) is {n} tokens, over the "
                           f"server's limit of {max_tokens} (--max-prompt-tokens); shorten it",
                           "messages")

    def stream_tokenizer(self):
        """A copy of the tokenizer for detokenising streamed ids on the event loop (never used
        by two threads at once)."""
        if getattr(self, "_stream_tok", None) is None:
            self._stream_tok = copy.deepcopy(self.vr.lm.tokenizer)
        return self._stream_tok

    # ------------------------------------------------------------------ draining
    async def drain(self, timeout_s: float) -> None:
        """Stop admitting; answer every request not yet on the model 503 now; give the running
        one ``timeout_s`` to finish, then answer it 503 too. Returns when every admitted request
        has its answer (its handler may still be writing it)."""
        loop = asyncio.get_running_loop()
        self.draining = True
        for slot in list(self._slots):
            if slot.abandon(waiting_only=True):
                self.admission.count("drained")
                slot.fail(shutting_down(" and this request had not started"))
        end = loop.time() + timeout_s
        while self._slots and loop.time() < end:
            await asyncio.sleep(0.02)
        for slot in list(self._slots):
            slot.abandon()
            self.admission.count("drained")
            slot.fail(shutting_down(f": this request did not finish within the drain timeout "
                                    f"of {timeout_s:g} s (--drain-timeout)"))
        while self._slots and loop.time() < end + 2.0:   # let the handlers take their answers
            await asyncio.sleep(0.02)

    # ------------------------------------------------------------------ running
    async def submit(self, settings: Settings, max_prompt_tokens: Optional[int] = None,
                     gone: Optional[asyncio.Event] = None, on_token: Optional[Callable] = None):
        """Admit, count the prompt's tokens, check the video, wait for the model, answer ->
        ``vr_runtime.Answer``. ``gone``: set when the client disconnects (then ClientGone).
        ``on_token(id)``: called on the model thread with each generated id (streaming)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.timeout_s
        slot = self.admit()
        self._slots.add(slot)
        video: Optional[Video] = None
        handed_over = False
        try:
            if max_prompt_tokens is not None:
                await self._check_prompt(settings, max_prompt_tokens, deadline, slot, gone)
            checking = asyncio.wrap_future(_daemon(self.prefetch.check_and_decode, settings,
                                                   slot.cancel))
            # If the request is given up first, the video it pins must still be let go of.
            checking.add_done_callback(lambda f: slot.abandoned and not f.cancelled()
                                       and f.exception() is None
                                       and self.prefetch.release(f.result()))
            video = await self._wait(checking, deadline, slot, gone)
            if self.config.max_batch > 1 and on_token is None:
                job = cf.Future()
                self._batchable.put((slot, video, settings, job))
                self._model_pool.submit(self._run_batch)   # takes the oldest waiting + mates
            else:
                job = self._model_pool.submit(self._run, slot, video, settings, on_token)
            handed_over = True   # from here the job releases the slot and the video
            return await self._wait(asyncio.wrap_future(job), deadline, slot, gone)
        finally:
            self._slots.discard(slot)
            if not handed_over:
                if video is not None:
                    self.prefetch.release(video)
                slot.release()

    async def _wait(self, fut, deadline: float, slot: Slot, gone: Optional[asyncio.Event]):
        """``fut``'s result, unless the deadline passes, the client goes or a drain answers the
        request first; ``fut`` itself is never cancelled (its thread cannot be stopped)."""
        fut = asyncio.ensure_future(fut)
        # Retrieve a late exception, so that a given-up future is not logged as never retrieved.
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        stop = asyncio.ensure_future(slot.stop.wait())
        watch = {fut, stop}
        left = None if gone is None else asyncio.ensure_future(gone.wait())
        if left is not None:
            watch.add(left)
        remaining = max(deadline - asyncio.get_running_loop().time(), 0.0)
        try:
            done, _ = await asyncio.wait(watch, timeout=remaining,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if left is not None:
                left.cancel()
        skipped = fut in done and isinstance(fut.exception(), Skipped)
        if fut in done and not skipped:
            return fut.result()
        # A skipped job means the request was given up; the reason is known here even when the
        # job's answer reached the loop before the event that gave it up.
        if stop in done or slot.stop.is_set():
            raise slot.stop_error
        if left is not None and (left in done or gone.is_set()):
            if slot.abandon():
                self.admission.count("cancelled")
            raise ClientGone()
        slot.abandon()
        self.admission.count("timeout")
        raise APIError(504, f"the request took longer than the server's per-request "
                       f"timeout of {self.config.timeout_s:g} s")

    def _run(self, slot: Slot, video: Video, s: Settings, on_token=None):
        try:
            with self._model_lock:
                if not slot.start():   # given up while it waited (deadline, client, drain)
                    raise Skipped(504, "the request was given up while waiting for the model")
                with self.admission.running_jobs(1):
                    return self._answer(video, s, on_token)
        finally:
            self.prefetch.release(video)
            slot.release()

    def _run_batch(self) -> None:
        """One model-pool job per batchable request: takes the oldest one still waiting (if an
        earlier job has not already answered it) and up to ``max_batch - 1`` waiting mates."""
        with self._model_lock:
            live = []
            for slot, video, s, fut in self._batchable.take():   # [] if already answered
                if slot.start():
                    live.append((slot, video, s, fut))
                else:   # given up while it waited (deadline, client, drain)
                    fut.set_exception(Skipped(504, "the request was given up while waiting "
                                                   "for the model"))
                    self.prefetch.release(video)
                    slot.release()
            if not live:
                return
            results = [APIError(500, "the batch was interrupted")] * len(live)
            try:
                with self.admission.running_jobs(len(live)):
                    results = self._answer_many([(v, s) for _, v, s, _ in live])
            finally:
                for (slot, video, _, fut), res in zip(live, results):
                    self.prefetch.release(video)
                    slot.release()
                    if isinstance(res, BaseException):
                        fut.set_exception(res)
                    else:
                        fut.set_result(res)

    def _answer_many(self, items) -> list:
        """Answers (or their APIErrors) of several (video, settings) with one batch key."""
        if len(items) > 1:
            try:
                return self.vr.answer_batch([_input(v) for v, _ in items],
                                            [x.question for _, x in items],
                                            options=[self.options(x) for _, x in items])
            except Exception:   # noqa: BLE001 - one by one below: each request its own error
                pass
        out = []
        for v, x in items:
            try:
                out.append(self._answer(v, x))
            except BaseException as e:  # noqa: BLE001 - handed to that request's future
                out.append(e)
        return out

    def _answer(self, video: Video, s: Settings, on_token=None):
        """The same ``VideoRouter.answer`` call ``videorouter ask`` makes, on the checked file
        (its frames decoded already, off the model's lock)."""
        try:
            return self.vr.answer(_input(video), s.question, options=self.options(s),
                                  on_token=on_token)
        except Exception as e:
            raise from_exception(e, video.names()) from None

    def options(self, s: Settings):
        """The request's :class:`~vr_runtime.request.AnswerOptions` (those of ``videorouter
        ask``, plus the server's visual cache)."""
        from ..request import AnswerOptions
        return AnswerOptions(**dataclasses.asdict(s.sampling), max_length=s.max_length,
                             max_new_tokens=s.max_new_tokens, policy=s.policy, system=s.system,
                             cache_visual=self.config.visual_cache > 0, scorer=self.scorer,
                             scales=s.scales)

    # ------------------------------------------------------------------ one process, one model
    def run_sync(self, fn: Callable):
        """Run ``fn(vr)`` on the model thread under the lock (tests, warm-up)."""
        def job():
            with self._model_lock:
                return fn(self.vr)
        return self._model_pool.submit(job).result()


def _input(video: Video):
    """What the runtime answers from: the video opened off the lock (a FileSource), else the
    checked file."""
    return video.clip if video.clip is not None else video.path


def _daemon(fn, *args) -> cf.Future:
    """``fn(*args)`` on a daemon thread of its own -> its Future. Not a pool: a job that hangs
    holds no worker that other requests need, and never keeps the process from exiting."""
    future: cf.Future = cf.Future()

    def run():
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - delivered to whoever waits on the Future
            future.set_exception(e)

    threading.Thread(target=run, name="vr-media", daemon=True).start()
    return future


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

