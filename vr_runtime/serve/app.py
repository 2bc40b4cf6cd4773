"""The FastAPI app of ``videorouter serve`` (docs/CONTRACT.md section 6): an OpenAI-compatible video QA API.

    POST /v1/chat/completions   text + one video_url part -> chat.completion (+ "videorouter")
    GET  /v1/models             the served model
    GET  /health                200 while the process serves (503 while draining); queue
                                counters, API requests by status
    GET  /metrics               Prometheus metrics (vr_runtime.serve.observe)
    GET  /ui, GET /ui/media     a page that asks and shows the timeline (vr_runtime.serve.ui;
                                off with --no-ui)

:func:`create_app` builds it around an :class:`~vr_runtime.serve.engine.Engine` (one model per
process): the routes are module-level functions on :data:`router` that read the engine, the limits,
the API key and the metrics from ``request.app.state``. Safe by default: the body size is capped
before it is read, an optional Bearer key guards ``/v1``, and every failure -- malformed JSON, a
wrong type, a video outside the media directory, a corrupt video, a full queue, a bug -- is
answered with an OpenAI-style error object; no traceback ever reaches a client, and no single
request can stop the server.

Streaming (``"stream": true``): real streaming. Each generated id goes from the model thread to
the event loop as it is decided; the first ``chat.completion.chunk`` leaves after the prefill, one
per new piece of text (they concatenate to exactly the non-streamed answer), then a last chunk
with ``finish_reason`` and the report, and ``data: [DONE]``. Every error before the first token
is still an HTTP status with an error object.

Operators: an access log line per API request at ``--log-level info``, ``GET /metrics``
(Prometheus), and ``/health`` counts of every API request by status (vr_runtime.serve.observe).
On SIGTERM the server drains (command.py, Engine.drain).
"""
import asyncio
import dataclasses
import json
import logging
import os
import time
from typing import Callable, Optional, Union

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..cli_io import jsonable
from ..video.thumbnails import ThumbnailStore
from .engine import RETRY_AFTER_S, Engine, worker_id
from .errors import APIError, error_body, from_exception, key_error
from .observe import REPORT_KEY, Observer
from .schema import (Limits, chunk, completion, finish_reason, new_id, parse_request,
                     to_settings, usage)
from .ui import router as ui_router

log = logging.getLogger("videorouter.serve")

WORKER_HEADER = "x-videorouter-worker"


def _dumps(obj) -> bytes:
    # Exactly how `videorouter ask --json` serialises its object (NaN stays NaN, numpy values
    # become lists), so the "videorouter" report equals the CLI's.
    return json.dumps(obj, default=jsonable).encode()


class BodyLimit:
    """ASGI middleware: refuse a body over ``max_bytes`` (413) by its Content-Length, or while it
    streams in (chunked), before the app sees any of it. The body is read here in full and handed
    to the app as one message; later ``receive`` calls go to the server, so the app still hears
    of a client that disconnects while its request waits.

    Before a byte of the body is read: the API key of a ``/v1`` request (401), and the memory of
    bodies in flight, all requests together, against ``max_inflight_bytes`` (503 +
    ``Retry-After``): a request reserves its Content-Length (a chunked one, what has arrived)
    until its answer is sent, so clients without the key, or many large uploads at once, cannot
    make the server buffer more than that."""

    def __init__(self, app, max_bytes: int, api_key: Optional[str] = None,
                 max_inflight_bytes: Optional[int] = None):
        self.app = app
        self.max_bytes = int(max_bytes)
        self.api_key = api_key
        self.max_inflight = None if max_inflight_bytes is None else int(max_inflight_bytes)
        self.inflight = 0       # bytes reserved by bodies being read or held (event loop only)

    def _reserve(self, n: int) -> bool:
        # (a lone request is always let in: a body under --max-body-mb must be answerable)
        if self.max_inflight is not None and n > 0 and self.inflight > 0 \
                and self.inflight + n > self.max_inflight:
            return False
        self.inflight += n
        return True

    def _busy(self) -> APIError:
        return APIError(503, f"the server holds {self.max_inflight} bytes of request bodies "
                        f"already (--max-inflight-mb); retry in {RETRY_AFTER_S} s",
                        headers={"Retry-After": str(RETRY_AFTER_S), "Connection": "close"})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        too_big = APIError(413, f"the request body is over the server's limit of "
                           f"{self.max_bytes} bytes (--max-body-mb)")
        if self.api_key is not None and scope.get("path", "").startswith("/v1"):
            try:
                key_error(headers.get(b"authorization", b"").decode("latin-1"), self.api_key)
            except APIError as e:
                if scope.get("method") in ("POST", "PUT", "PATCH"):
                    e.headers["Connection"] = "close"   # its body is never read
                return await _send_error(send, e)
        n = 0
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                return await _send_error(send, APIError(400, "bad Content-Length header"))
            if n > self.max_bytes:
                return await _send_error(send, too_big)
        held = [0]      # bytes this request has reserved, given back when it is answered
        try:
            await self._handle(scope, receive, send, n, too_big, held)
        finally:
            self.inflight -= held[0]

    async def _handle(self, scope, receive, send, n, too_big, held):
        if scope.get("method") in ("POST", "PUT", "PATCH"):
            if not self._reserve(n):
                return await _send_error(send, self._busy())
            held[0] = n
            chunks, seen = [], 0
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return              # gone before its body arrived: nobody to answer
                part = message.get("body", b"")
                seen += len(part)
                if seen > self.max_bytes:
                    chunks = None
                    # "connection: close": uvicorn would otherwise read (and drop) the rest of
                    # the body, however long the client goes on sending.
                    too_big.headers["Connection"] = "close"
                    return await _send_error(send, too_big)
                if seen > held[0]:          # chunked, or more than it declared
                    if not self._reserve(seen - held[0]):
                        chunks = None
                        return await _send_error(send, self._busy())
                    held[0] = seen
                chunks.append(part)
                if not message.get("more_body", False):
                    break
            body = [b"".join(chunks)]
            del chunks
            server_receive = receive

            async def receive():
                if body:
                    return {"type": "http.request", "body": body.pop(), "more_body": False}
                return await server_receive()

        started = False

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as e:  # noqa: BLE001 - nothing may escape to the server's logs as a traceback
            # Starlette re-raises what its last-resort handler already answered; anything else
            # gets its error object here.
            if not started:
                await _send_error(send, from_exception(e))
            log.warning("request failed: %s", from_exception(e).message)


async def _send_error(send, err: APIError):
    body = _dumps(err.body())
    extra = [(k.lower().encode(), str(v).encode()) for k, v in err.headers.items()]
    await send({"type": "http.response.start", "status": err.status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (WORKER_HEADER.encode(), worker_id().encode()), *extra]})
    await send({"type": "http.response.body", "body": body})


router = APIRouter()


def create_app(engine: Union[Engine, Callable[[], Engine]], limits: Limits = Limits(),
               api_key: Optional[str] = None, max_body_bytes: int = 100 * 2**20,
               served_model_name: Optional[str] = None,
               max_inflight_bytes: Optional[int] = 512 * 2**20, ui: bool = True):
    """The app around ``engine`` (an Engine, or a function that returns the process's engine,
    called on first use: how a Ray Serve replica shares the one it loaded). ``ui``: serve the
    page ``GET /ui`` and its listing ``GET /ui/media`` (vr_runtime.serve.ui; ``--no-ui``).

    The routes (:data:`router`) read what they serve from ``app.state``: ``get_engine``,
    ``limits``, ``api_key``, ``served_model_name``, ``max_body_bytes``, ``thumbnails`` (the
    thumbnails requests made, for later requests on the same file) and ``observer``. Returns
    the ASGI app to serve: the FastAPI app inside :class:`BodyLimit`, inside the
    :class:`~vr_runtime.serve.observe.Observer`."""
    app = FastAPI(title="VideoRouter", docs_url=None, redoc_url=None, openapi_url=None)
    state = app.state
    state.get_engine = (lambda: engine) if isinstance(engine, Engine) else engine
    state.limits = limits
    state.api_key = api_key
    state.served_model_name = served_model_name
    state.max_body_bytes = int(max_body_bytes)
    state.thumbnails = ThumbnailStore()
    for exc_class, handler in EXCEPTION_HANDLERS:
        app.add_exception_handler(exc_class, handler)
    app.include_router(router)
    if ui:
        app.include_router(ui_router)
    state.observer = Observer(BodyLimit(app, max_body_bytes, api_key, max_inflight_bytes),
                              lambda: state.get_engine().stats())
    return state.observer


# ----------------------------------------------------------------------------- responses
def _engine(request: Request) -> Engine:
    return request.app.state.get_engine()


def _model_name(request: Request) -> str:
    state = request.app.state
    return state.served_model_name or state.get_engine().name


def _check_key(request: Request) -> None:
    api_key = request.app.state.api_key
    if api_key is not None:
        key_error(request.headers.get("authorization", ""), api_key)


def _json_response(obj, status: int = 200, headers: Optional[dict] = None) -> Response:
    # worker_id() is read per response: under Ray the app is built on the driver and runs in
    # each replica's process.
    return Response(_dumps(obj), status_code=status, media_type="application/json",
                    headers={WORKER_HEADER: worker_id(), **(headers or {})})


def _error_response(err: APIError) -> Response:
    if err.status >= 500:
        log.warning("%s %s", err.status, err.message)
    return _json_response(err.body(), err.status, err.headers)


# ----------------------------------------------------------------------------- errors
async def _api_error(request: Request, exc: APIError):
    return _error_response(exc)


async def _http_error(request: Request, exc: StarletteHTTPException):
    status = exc.status_code
    msg = {404: f"no route {request.method} {request.url.path}; this server has "
                f"POST /v1/chat/completions, GET /v1/models, GET /health and GET /metrics",
           405: f"method {request.method} is not allowed on {request.url.path}"}.get(
               status, str(exc.detail))
    return _json_response(error_body(status, msg), status)


async def _validation_error(request: Request, exc: RequestValidationError):
    # (No route declares typed parameters; kept so that a future one answers in kind.)
    fields = "; ".join(".".join(str(p) for p in e.get("loc", ())) + ": " + str(e.get("msg"))
                       for e in exc.errors()[:3])
    return _json_response(error_body(400, f"invalid request: {fields}"), 400)


async def _unexpected(request: Request, exc: Exception):
    # The last line of defence: one line to the client, the traceback only in the server's log
    # when VIDEOROUTER_DEBUG is set.
    if os.environ.get("VIDEOROUTER_DEBUG", "") not in ("", "0"):
        log.exception("unexpected error")
    return _error_response(from_exception(exc))


# Every error, however raised, answers with an OpenAI-style error object.
EXCEPTION_HANDLERS = ((APIError, _api_error), (StarletteHTTPException, _http_error),
                      (RequestValidationError, _validation_error), (Exception, _unexpected))


# ----------------------------------------------------------------------------- routes
@router.get("/health")
async def health(request: Request):
    # 503 while draining, so that a load balancer stops sending requests here.
    eng = _engine(request)
    return _json_response({"status": "draining" if eng.draining else "ok",
                           "model": _model_name(request), "worker": worker_id(),
                           "queue": eng.stats(), "requests": request.app.state.observer.counts()},
                          503 if eng.draining else 200)


@router.get("/metrics")
async def metrics(request: Request):
    # Prometheus text format; like /health, no key needed.
    return Response(request.app.state.observer.metrics(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models")
async def models(request: Request):
    _check_key(request)
    return _json_response({"object": "list", "data": [{
        "id": _model_name(request), "object": "model", "created": _STARTED,
        "owned_by": "videorouter", "root": _engine(request).config.model, "parent": None}]})


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    _check_key(request)
    limits: Limits = request.app.state.limits
    req = parse_request(await _json_body(request))
    settings = to_settings(req, limits, [_model_name(request)])
    if req.videorouter_thumbnails:
        # The frames this request decodes anyway become its thumbnails (handed over by the
        # decoding workers, serve.prefetch; encoded after the answer); a later request on the
        # same file finds them in the store.
        settings = dataclasses.replace(settings, thumbnails=request.app.state.thumbnails.sink())
    eng = _engine(request)
    gone = asyncio.Event()
    watcher = asyncio.ensure_future(_watch_client(request, gone))
    try:
        if settings.stream:
            return await _stream(request, eng, settings, gone)
        ans = await eng.submit(settings, limits.max_prompt_tokens, gone)
    finally:
        watcher.cancel()
    request.scope.setdefault("state", {})[REPORT_KEY] = ans.report   # tokens, timings
    body = completion(new_id(), _model_name(request), ans.text, ans.report,
                      settings.max_new_tokens)
    extra = await run_in_threadpool(thumbnails_field, settings, ans.report)
    return _json_response({**body, **extra})


def thumbnails_field(settings, report: dict) -> dict:
    """``{"videorouter_thumbnails": [data URL or null per sampled frame]}`` for a request that
    asked for them (``videorouter_thumbnails: true``), else nothing: the default response is
    unchanged. Encodes the frames the request kept (after its answer: off the event loop)."""
    if settings.thumbnails is None:
        return {}
    indices = report.get("frame_indices") or []
    urls = settings.thumbnails.data_urls(indices)
    if all(u is not None for u in urls):
        settings.thumbnails.remember(indices)
    return {"videorouter_thumbnails": urls}


async def _json_body(request: Request):
    """The request's body parsed as JSON (400 if it is not)."""
    raw = await request.body()
    try:
        # A large body (a data: video) is parsed off the event loop, which keeps serving.
        return json.loads(raw) if len(raw) < 2**20 else await run_in_threadpool(json.loads, raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON ({e})") from None


async def _watch_client(request: Request, gone: asyncio.Event) -> None:
    # The body is read: the next message the server gives is the client disconnecting (or,
    # after the response, the end of the request).
    while (await request.receive())["type"] != "http.disconnect":
        pass
    gone.set()


async def _stream(request: Request, eng: Engine, settings, gone: asyncio.Event):
    """Real streaming: the model thread hands each generated id to the event loop; the response
    starts with the first one (after the prefill), so every error before it -- a bad video, a
    full queue, a budget that cannot fit -- is still an HTTP status with an error object. An
    error after it (the drain timeout) arrives as a last ``error`` event."""
    loop = asyncio.get_running_loop()
    ids: asyncio.Queue = asyncio.Queue()
    task = asyncio.ensure_future(eng.submit(
        settings, request.app.state.limits.max_prompt_tokens, gone,
        on_token=lambda i: loop.call_soon_threadsafe(ids.put_nowait, i)))
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
    first = asyncio.ensure_future(ids.get())
    await asyncio.wait({task, first}, return_when=asyncio.FIRST_COMPLETED)
    if not first.done():
        first.cancel()
        task.result()          # raises the request's error (an HTTP status) if it failed
    pending = [first.result()] if first.done() and not first.cancelled() else []
    return StreamingResponse(
        _events(new_id(), _model_name(request), eng.stream_tokenizer(), pending, ids, task,
                settings, request.scope),
        media_type="text/event-stream",
        headers={WORKER_HEADER: worker_id(), "cache-control": "no-cache"})


_STARTED = int(time.time())


class Detokenizer:
    """Streamed ids -> the new text of each, so that the pieces concatenate to the answer's text
    (``decode(ids, skip_special_tokens=True).strip()``, as the runtime makes it): leading
    whitespace is dropped, trailing whitespace and an unfinished character (U+FFFD) are held back
    until more text follows them. Decodes the whole answer so far per token: answers are short
    (``--max-tokens`` caps them)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list = []
        self.sent = ""

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True).strip()
        if text.endswith("\ufffd") or len(text) <= len(self.sent) \
                or not text.startswith(self.sent):
            return ""
        piece, self.sent = text[len(self.sent):], text
        return piece

    def rest(self, final_text: str) -> str:
        """What the answer has that was not sent yet."""
        return final_text[len(self.sent):] if final_text.startswith(self.sent) else ""


async def _events(cid, name, tokenizer, pending, ids, task, settings, scope):
    created = int(time.time())
    detok = Detokenizer(tokenizer)

    def event(obj) -> bytes:
        return b"data: " + _dumps(obj) + b"\n\n"

    def content(piece) -> bytes:
        return event(chunk(cid, created, name, {"content": piece}))

    yield event(chunk(cid, created, name, {"role": "assistant", "content": ""}))
    while True:
        while pending:
            piece = detok.push(pending.pop(0))
            if piece:
                yield content(piece)
        if task.done() and ids.empty():
            break
        get = asyncio.ensure_future(ids.get())
        await asyncio.wait({get, task}, return_when=asyncio.FIRST_COMPLETED)
        if get.done():
            pending.append(get.result())
        else:
            get.cancel()
        while not ids.empty():     # every id reaches the loop before the job's own result
            pending.append(ids.get_nowait())
    try:
        ans = task.result()
    except Exception as e:  # noqa: BLE001 - after the first chunk the status is sent already
        err = from_exception(e)
        log.warning("stream ended early: %s %s", err.status, err.message)
        yield event(err.body())
        yield b"data: [DONE]\n\n"
        return
    report = ans.report
    scope.setdefault("state", {})[REPORT_KEY] = report
    rest = detok.rest(ans.text)
    if rest:
        yield content(rest)
    extra = await run_in_threadpool(thumbnails_field, settings, report)
    yield event(chunk(cid, created, name, {}, finish_reason(report, settings.max_new_tokens),
                      videorouter=report, **extra))
    if settings.include_usage:
        yield event(chunk(cid, created, name, None, usage=usage(report)))
    yield b"data: [DONE]\n\n"
