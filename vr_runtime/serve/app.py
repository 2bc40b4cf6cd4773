"""The FastAPI app of ``videorouter serve`` (SPEC section 6): an OpenAI-compatible video QA API.

    POST /v1/chat/completions   text + one video_url part -> chat.completion (+ "videorouter")
    GET  /v1/models             the served model
    GET  /health                200 while the process serves; queue counters

:func:`create_app` builds it around an :class:`~vr_runtime.serve.engine.Engine` (one model per
process). Safe by default: the body size is capped before it is read, an optional Bearer key
guards ``/v1``, and every failure -- malformed JSON, a wrong type, a video outside the media
directory, a corrupt video, a full queue, a bug -- is answered with an OpenAI-style error object;
no traceback ever reaches a client, and no single request can stop the server.

Streaming (``"stream": true``): the answer is generated in full first (greedy decoding, exactly
the non-streamed answer), then sent as ``chat.completion.chunk`` server-sent events, one per
generated token's text, ending with ``data: [DONE]``. Errors therefore still arrive as an HTTP
status with an error object, never half-way through a stream.
"""
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
from .schema import Limits, chunk, completion, new_id, parse_request, to_settings

log = logging.getLogger("videorouter.serve")

WORKER_HEADER = "x-videorouter-worker"


def _dumps(obj) -> bytes:
    # Exactly how `videorouter ask --json` serialises its object (NaN stays NaN, numpy values
    # become lists), so the "videorouter" report equals the CLI's.
    from ..cli import _jsonable
    return json.dumps(obj, default=_jsonable).encode()


class BodyLimit:
    """ASGI middleware: refuse a body over ``max_bytes`` (413) by its Content-Length, or while it
    streams in when there is none, before it is held in memory."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = int(max_bytes)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        too_big = APIError(413, f"the request body is over the server's limit of "
                           f"{self.max_bytes} bytes (--max-body-mb)")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                return await _send_error(send, APIError(400, "bad Content-Length header"))
            if n > self.max_bytes:
                return await _send_error(send, too_big)
        seen = 0
        started = False

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooBig()
            return message

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooBig:
            if not started:
                await _send_error(send, too_big)
        except Exception as e:  # noqa: BLE001 - nothing may escape to the server's logs as a traceback
            # Starlette re-raises what its last-resort handler already answered; anything else
            # gets its error object here.
            if not started:
                await _send_error(send, from_exception(e))
            log.warning("request failed: %s", from_exception(e).message)


class _TooBig(Exception):
    pass


async def _send_error(send, err: APIError):
    body = _dumps(err.body())
    await send({"type": "http.response.start", "status": err.status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (WORKER_HEADER.encode(), worker_id().encode())]})
    await send({"type": "http.response.body", "body": body})


def create_app(engine: Union[Engine, Callable[[], Engine]], limits: Limits = Limits(),
               api_key: Optional[str] = None, max_body_bytes: int = 100 * 2**20,
               served_model_name: Optional[str] = None):
    """The app around ``engine`` (an Engine, or a function that returns the process's engine,
    called on first use: how a Ray Serve replica shares the one it loaded)."""
    get_engine = (lambda: engine) if isinstance(engine, Engine) else engine
    app = FastAPI(title="VideoRouter", docs_url=None, redoc_url=None, openapi_url=None)

    def model_name() -> str:
        return served_model_name or get_engine().name

    def json_response(obj, status: int = 200) -> Response:
        # worker_id() is read per response: under Ray this app is built on the driver and
        # runs in each replica's process.
        return Response(_dumps(obj), status_code=status, media_type="application/json",
                        headers={WORKER_HEADER: worker_id()})

    def error_response(err: APIError) -> Response:
        if err.status >= 500:
            log.warning("%s %s", err.status, err.message)
        return json_response(err.body(), err.status)

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc):
        status = exc.status_code
        msg = {404: f"no route {request.method} {request.url.path}; this server has "
                    f"POST /v1/chat/completions, GET /v1/models and GET /health",
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
        if api_key is None:
            return
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                                 api_key.encode()):
            raise APIError(401, "missing or wrong API key; send 'Authorization: Bearer <key>'")

    @app.get("/health")
    async def health():
        eng = get_engine()
        return json_response({"status": "ok", "model": model_name(), "worker": worker_id(),
                              "queue": eng.stats()})

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
        ans = await eng.answer(settings)
        report = ans.report
        cid, name = new_id(), model_name()
        if not settings.stream:
            return json_response(completion(cid, name, ans.text, report, settings.max_new_tokens))
        pieces = await run_in_threadpool(token_pieces, eng.vr.lm.tokenizer, ans.text)
        return StreamingResponse(
            _events(cid, name, pieces, report, settings), media_type="text/event-stream",
            headers={WORKER_HEADER: worker_id(), "cache-control": "no-cache"})

    return BodyLimit(app, max_body_bytes)


_STARTED = int(time.time())


def _events(cid, name, pieces, report, settings):
    from .schema import finish_reason, usage
    created = int(time.time())

    def event(obj) -> bytes:
        return b"data: " + _dumps(obj) + b"\n\n"

    yield event(chunk(cid, created, name, {"role": "assistant", "content": ""}))
    for piece in pieces:
        yield event(chunk(cid, created, name, {"content": piece}))
    yield event(chunk(cid, created, name, {}, finish_reason(report, settings.max_new_tokens),
                      videorouter=report))
    if settings.include_usage:
        yield event(chunk(cid, created, name, None, usage=usage(report)))
    yield b"data: [DONE]\n\n"


def token_pieces(tokenizer, text: str) -> list:
    """``text`` cut where its tokens' text begins, so the pieces concatenate to exactly ``text``.

    Incremental detokenisation as streaming servers do it: each new token's text is the decode of
    a short window of ids (from the previous piece's start) minus the decode of that window
    without it, held back while it ends in an unfinished character (U+FFFD). A piece that would
    not continue ``text`` exactly (a tokenizer that merges spaces differently in context) is held
    back too; whatever is left is sent last. Linear in the number of tokens."""
    if not text:
        return []
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces, sent = [], 0
    prefix = read = 0
    for i in range(1, len(ids) + 1):
        before = tokenizer.decode(ids[prefix:read], skip_special_tokens=True)
        now = tokenizer.decode(ids[prefix:i], skip_special_tokens=True)
        if len(now) <= len(before) or now.endswith("\ufffd") or not now.startswith(before):
            continue
        piece = now[len(before):]
        if text.startswith(piece, sent):
            pieces.append(piece)
            sent += len(piece)
            prefix, read = read, i
    if sent < len(text):
        pieces.append(text[sent:])
    return pieces
