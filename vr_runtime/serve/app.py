"""The FastAPI app of ``videorouter serve`` (docs/CONTRACT.md section 6): an OpenAI-compatible video QA API.

    POST /v1/chat/completions   text + one video_url part -> chat.completion (+ "videorouter")
    GET  /v1/models             the served model
    GET  /health                200 while the process serves (503 while draining); queue
                                counters, API requests by status
    GET  /metrics               Prometheus metrics (vr_runtime.serve.observe)

:func:`create_app` builds it around an :class:`~vr_runtime.serve.engine.Engine` (one model per
process). Safe by default: the body size is capped before it is read, an optional Bearer key
guards ``/v1``, and every failure -- malformed JSON, a wrong type, a video outside the media
directory, a corrupt video, a full queue, a bug -- is answered with an OpenAI-style error object;
no traceback ever reaches a client, and no single request can stop the server.

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
import hmac
import json
import logging
import os
import time
from typing import Callable, Optional, Union

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .engine import Engine, worker_id
from .errors import APIError, error_body, from_exception
from .observe import REPORT_KEY, Observer
from .schema import Limits, chunk, completion, new_id, parse_request, to_settings

log = logging.getLogger("videorouter.serve")

WORKER_HEADER = "x-videorouter-worker"


def _dumps(obj) -> bytes:
    # Exactly how `videorouter ask --json` serialises its object (NaN stays NaN, numpy values
    # become lists), so the "videorouter" report equals the CLI's.
    from ..cli_args import jsonable
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
        from .engine import RETRY_AFTER_S
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


def key_error(auth: str, api_key: str) -> None:
    """Raise the 401 unless ``auth`` (the Authorization header) carries ``api_key``."""
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                             api_key.encode()):
        raise APIError(401, "missing or wrong API key; send 'Authorization: Bearer <key>'")


async def _send_error(send, err: APIError):
    body = _dumps(err.body())
    extra = [(k.lower().encode(), str(v).encode()) for k, v in err.headers.items()]
    await send({"type": "http.response.start", "status": err.status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (WORKER_HEADER.encode(), worker_id().encode()), *extra]})
    await send({"type": "http.response.body", "body": body})


def create_app(engine: Union[Engine, Callable[[], Engine]], limits: Limits = Limits(),
               api_key: Optional[str] = None, max_body_bytes: int = 100 * 2**20,
               served_model_name: Optional[str] = None,
               max_inflight_bytes: Optional[int] = 512 * 2**20):
    """The app around ``engine`` (an Engine, or a function that returns the process's engine,
    called on first use: how a Ray Serve replica shares the one it loaded)."""
    get_engine = (lambda: engine) if isinstance(engine, Engine) else engine
    app = FastAPI(title="VideoRouter", docs_url=None, redoc_url=None, openapi_url=None)

    def model_name() -> str:
        return served_model_name or get_engine().name

    def json_response(obj, status: int = 200, headers: Optional[dict] = None) -> Response:
        # worker_id() is read per response: under Ray this app is built on the driver and
        # runs in each replica's process.
        return Response(_dumps(obj), status_code=status, media_type="application/json",
                        headers={WORKER_HEADER: worker_id(), **(headers or {})})

    def error_response(err: APIError) -> Response:
        if err.status >= 500:
            log.warning("%s %s", err.status, err.message)
        return json_response(err.body(), err.status, err.headers)

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc):
        status = exc.status_code
        msg = {404: f"no route {request.method} {request.url.path}; this server has "
                    f"POST /v1/chat/completions, GET /v1/models, GET /health and GET /metrics",
               405: f"method {request.method} is not allowed on {request.url.path}"}.get(
                   status, str(exc.detail))
        return json_response(error_body(status, msg), status)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, exc):
        # (No route declares typed parameters; kept so that a future one answers in kind.)
        fields = "; ".join(".".join(str(p) for p in e.get("loc", ())) + ": " + str(e.get("msg"))
                           for e in exc.errors()[:3])
        return json_response(error_body(400, f"invalid request: {fields}"), 400)

    @app.exception_handler(Exception)
    async def _unexpected(request, exc):
        # The last line of defence: one line to the client, the traceback only in the server's
        # log when VIDEOROUTER_DEBUG is set.
        if os.environ.get("VIDEOROUTER_DEBUG", "") not in ("", "0"):
            log.exception("unexpected error")
        return error_response(from_exception(exc))

    def check_key(request: Request) -> None:
        if api_key is not None:
            key_error(request.headers.get("authorization", ""), api_key)

    @app.get("/health")
    async def health():
        # 503 while draining, so that a load balancer stops sending requests here.
        eng = get_engine()
        return json_response({"status": "draining" if eng.draining else "ok",
                              "model": model_name(), "worker": worker_id(),
                              "queue": eng.stats(), "requests": observer.counts()},
                             503 if eng.draining else 200)

    @app.get("/metrics")
    async def metrics():
        # Prometheus text format; like /health, no key needed.
        from prometheus_client import CONTENT_TYPE_LATEST
        return Response(observer.metrics(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request):
        check_key(request)
        return json_response({"object": "list", "data": [{
            "id": model_name(), "object": "model", "created": _STARTED, "owned_by": "videorouter",
            "root": get_engine().config.model, "parent": None}]})

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        check_key(request)
        raw = await request.body()
        try:
            # A large body (a data: video) is parsed off the event loop, which keeps serving.
            data = json.loads(raw) if len(raw) < 2**20 else await run_in_threadpool(json.loads, raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise APIError(400, f"the request body is not valid JSON ({e})") from None
        req = parse_request(data)
        settings = to_settings(req, limits, [model_name()])
        eng = get_engine()
        gone = asyncio.Event()

        async def watch_client():
            # The body is read: the next message the server gives is the client disconnecting
            # (or, after the response, the end of the request).
            while (await request.receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.ensure_future(watch_client())
        if settings.stream:
            try:
                return await stream(request, eng, settings, gone)
            finally:
                watcher.cancel()
        try:
            ans = await eng.answer(settings, limits.max_prompt_tokens, gone)
        finally:
            watcher.cancel()
        request.scope.setdefault("state", {})[REPORT_KEY] = ans.report   # tokens, timings
        return json_response(completion(new_id(), model_name(), ans.text, ans.report,
                                        settings.max_new_tokens))

    async def stream(request, eng, settings, gone):
        """Real streaming: the model thread hands each generated id to the event loop; the
        response starts with the first one (after the prefill), so every error before it --
        a bad video, a full queue, a budget that cannot fit -- is still an HTTP status with an
        error object. An error after it (the drain timeout) arrives as a last ``error`` event."""
        loop = asyncio.get_running_loop()
        ids: asyncio.Queue = asyncio.Queue()
        task = asyncio.ensure_future(eng.answer(
            settings, limits.max_prompt_tokens, gone,
            on_token=lambda i: loop.call_soon_threadsafe(ids.put_nowait, i)))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        first = asyncio.ensure_future(ids.get())
        await asyncio.wait({task, first}, return_when=asyncio.FIRST_COMPLETED)
        if not first.done():
            first.cancel()
            task.result()          # raises the request's error (an HTTP status) if it failed
        pending = [first.result()] if first.done() and not first.cancelled() else []
        return StreamingResponse(
            _events(new_id(), model_name(), eng.stream_tokenizer(), pending, ids, task,
                    settings, request.scope),
            media_type="text/event-stream",
            headers={WORKER_HEADER: worker_id(), "cache-control": "no-cache"})

    observer = Observer(BodyLimit(app, max_body_bytes, api_key, max_inflight_bytes),
                        lambda: get_engine().stats())
    return observer


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
    from .schema import finish_reason, usage
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
    yield event(chunk(cid, created, name, {}, finish_reason(report, settings.max_new_tokens),
                      videorouter=report))
    if settings.include_usage:
        yield event(chunk(cid, created, name, None, usage=usage(report)))
    yield b"data: [DONE]\n\n"
