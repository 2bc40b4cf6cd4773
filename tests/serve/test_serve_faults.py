"""Faults and hostile input against ``videorouter serve`` (issue: limits that bite before the work,
a shutdown that answers everyone).

In-process (the app over ASGI, tiny model): a huge question is refused before any tokenizing; a
prompt over the token cap is refused while the model is busy (counted off its lock); an over-limit
chunked body is a 413; a request whose client has gone is never run; a drain answers the queue
503 + Retry-After and lets the running request finish (or 503s it after the drain timeout).

As a process on 127.0.0.1 (bounded: a few requests, every wait with a time limit): a 10 MB
question, a chunked body over --max-body-mb, and SIGTERM under load -- every client gets an HTTP
answer, the process exits 0.
"""
import asyncio
import json
import select
import signal
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from bench.scripts import bench_serve  # noqa: E402
from serve_helpers import video_body  # noqa: E402

Q = "What shape is the red object?"
SET = dict(num_frames=8, max_length=1400, max_tokens=16)


class Counting:
    """The runtime, counting (and optionally slowing) its ``answer`` calls."""

    def __init__(self, vr, delay_s: float = 0.0):
        self.vr, self.lm, self.delay_s, self.calls = vr, vr.lm, delay_s, 0

    def answer(self, *a, **k):
        self.calls += 1
        time.sleep(self.delay_s)
        return self.vr.answer(*a, **k)


def make_app(vr, media, limits=None, engine_kw=None, **app_kw):
    from vr_runtime.serve.app import create_app
    from vr_runtime.serve.engine import Engine, EngineConfig
    from vr_runtime.serve.media import MediaConfig, MediaStore
    from vr_runtime.serve.schema import Limits
    engine = Engine(vr, MediaStore(MediaConfig(media_dir=media)), EngineConfig(**(engine_kw or {})))
    return create_app(engine, limits or Limits(), **app_kw), engine


def body_with(media, question, **extra):
    return video_body((media / "sample.mp4").as_uri(), question, **dict(SET, **extra))


async def asgi_post(app, body: bytes, chunks=None, gone: asyncio.Event = None):
    """One raw ASGI request: ``body`` (or ``chunks``, sent without a Content-Length, as a chunked
    upload arrives); ``gone`` set -> the server reports the client's disconnect. -> (status,
    headers, body)."""
    parts = list(chunks) if chunks is not None else [body]
    headers = [(b"content-type", b"application/json")]
    if chunks is None:
        headers.append((b"content-length", str(len(body)).encode()))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "root_path": "", "headers": headers,
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    done = asyncio.Event()
    sent = []

    async def receive():
        if parts:
            part = parts.pop(0)
            return {"type": "http.request", "body": part, "more_body": bool(parts)}
        waits = [asyncio.ensure_future(done.wait())]
        if gone is not None:
            waits.append(asyncio.ensure_future(gone.wait()))
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), payload


# ----------------------------------------------------------------------------- limits before work

def test_huge_question_is_refused_before_tokenizing(vr, media):
    from vr_runtime.serve.schema import Limits
    app, engine = make_app(vr, media, Limits(max_length=1400))
    question = "why " * 2_500_000                # 10 MB, far under the 100 MB body limit
    t0 = time.monotonic()
    body = json.dumps(body_with(media, question)).encode()
    status, _, payload = asyncio.run(asgi_post(app, body))
    assert status == 400, payload
    err = json.loads(payload)["error"]
    assert "10000000 characters" in err["message"] and "--max-prompt-chars" in err["message"]
    assert engine._tokenizer is None             # never counted: refused on its length alone
    assert time.monotonic() - t0 < 5


def test_prompt_over_the_token_cap_is_refused_while_the_model_is_busy(vr, media):
    """Counted off the model's lock: the model is held busy by the test, and the answer (a 400
    naming the cap) still comes at once; a normal request then waits its turn as usual."""
    from vr_runtime.serve.schema import Limits
    app, engine = make_app(vr, media, Limits(max_length=1400, max_prompt_tokens=200))
    long_q = "Is the red object a circle or a square? " * 40      # ~400 tokens, 1,640 chars
    assert len(long_q) < Limits(max_length=1400, max_prompt_tokens=200).max_prompt_chars

    async def scenario():
        engine._model_lock.acquire()
        try:
            return await asyncio.wait_for(
                asgi_post(app, json.dumps(body_with(media, long_q)).encode()), 20)
        finally:
            engine._model_lock.release()

    status, _, payload = asyncio.run(scenario())
    assert status == 400, payload
    msg = json.loads(payload)["error"]["message"]
    assert "over the server's limit of 200 (--max-prompt-tokens)" in msg
    n = engine.prompt_tokens(type("S", (), {"question": long_q, "system": None})())
    assert f"is {n} tokens" in msg and n > 200
    ok = asyncio.run(asgi_post(app, json.dumps(body_with(media, Q)).encode()))
    assert ok[0] == 200


def test_chunked_body_over_the_limit_is_413(vr, media):
    app, engine = make_app(vr, media, max_body_bytes=100_000)
    chunks = [b"x" * 30_000] * 10                # 300 kB, no Content-Length
    status, headers, payload = asyncio.run(asgi_post(app, b"", chunks=chunks))
    assert status == 413, payload
    assert "over the server's limit of 100000 bytes" in json.loads(payload)["error"]["message"]
    assert headers[b"connection"] == b"close"
    # Under the limit, chunked, is read whole and answered.
    good = json.dumps(body_with(media, Q)).encode()
    status, _, payload = asyncio.run(asgi_post(app, b"", chunks=[good[:50], good[50:]]))
    assert status == 200, payload


def test_a_request_whose_client_left_is_never_run(vr, media):
    counting = Counting(vr)
    app, engine = make_app(counting, media)
    body = json.dumps(body_with(media, Q)).encode()

    async def scenario():
        gone = asyncio.Event()
        engine._model_lock.acquire()             # the model is busy: the request waits
        try:
            task = asyncio.ensure_future(asgi_post(app, body, gone=gone))
            for _ in range(500):
                if engine.stats()["waiting"] == 1:
                    break
                await asyncio.sleep(0.01)
            gone.set()                            # the client gives up
            status = (await asyncio.wait_for(task, 10))[0]
        finally:
            engine._model_lock.release()
        for _ in range(500):                      # the skipped job lets its slot go
            if engine.stats()["waiting"] == 0:
                break
            await asyncio.sleep(0.01)
        return status

    assert asyncio.run(scenario()) == 499
    assert counting.calls == 0
    st = engine.stats()
    assert st["cancelled"] == 1 and st["waiting"] == 0 and st["running"] == 0 and st["served"] == 0
    assert engine.media.stored_count() == 0


# ----------------------------------------------------------------------------- draining

@pytest.mark.parametrize("drain_s,running_status", [(30.0, 200), (0.2, 503)])
def test_drain_answers_the_queue_503_and_the_running_request(vr, media, drain_s,
                                                             running_status):
    slow = Counting(vr, delay_s=1.0)
    app, engine = make_app(slow, media)

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as c:
            first = asyncio.ensure_future(c.post("/v1/chat/completions", json=body_with(media, Q)))
            while engine.stats()["running"] < 1:
                await asyncio.sleep(0.01)
            queued = [asyncio.ensure_future(c.post("/v1/chat/completions",
                                                   json=body_with(media, Q))) for _ in range(3)]
            while engine.stats()["waiting"] < 3:
                await asyncio.sleep(0.01)
            drain = asyncio.ensure_future(engine.drain(drain_s))
            queued = await asyncio.wait_for(asyncio.gather(*queued), 5)   # at once, not after
            health = await c.get("/health")
            late = await c.post("/v1/chat/completions", json=body_with(media, Q))
            await asyncio.wait_for(drain, drain_s + 10)
            return (await first), queued, health, late

    first, queued, health, late = asyncio.run(scenario())
    for r in queued + [late]:
        assert r.status_code == 503 and r.headers["retry-after"] == "5", r.text
        assert "shutting down" in r.json()["error"]["message"]
    assert health.status_code == 503 and health.json()["status"] == "draining"
    assert first.status_code == running_status, first.text
    if running_status == 503:
        assert "--drain-timeout" in first.json()["error"]["message"]
    assert slow.calls == 1                       # the queued ones never ran
    assert engine.stats()["drained"] == 3 + (running_status == 503)


# ----------------------------------------------------------------------------- a real process

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    media = bench_serve.make_media_dir(tmp_path_factory.mktemp("faults-http"))
    with bench_serve.serve(media, "--frames", "8", "--max-length", "1400", "--max-new-tokens",
                           "16", "--max-body-mb", "20", "--drain-timeout", "30",
                           "--log-level", "info", "--visual-cache", "0") as s:
        s.media = media
        yield s


def test_process_huge_question_does_not_stall_others(server):
    body = video_body((server.media / "sample.mp4").as_uri(), "why " * 2_500_000)
    normal = video_body((server.media / "sample.mp4").as_uri(), Q)
    out = {}

    def huge():
        out["huge"] = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)

    t = threading.Thread(target=huge)
    t.start()
    t0 = time.monotonic()
    r = httpx.post(f"{server.url}/v1/chat/completions", json=normal, timeout=60)
    t.join(60)
    assert r.status_code == 200 and time.monotonic() - t0 < 20
    assert out["huge"].status_code == 400 and "--max-prompt-chars" in out["huge"].text
    # The access log (--log-level info); a line is written once its answer has gone out, so the
    # client can hold either answer before its line is there: wait for both lines.
    wanted = ('"POST /v1/chat/completions" 400', '"POST /v1/chat/completions" 200')
    t0 = time.monotonic()
    while time.monotonic() - t0 < 10:
        with open(server.stderr_path) as f:
            log = f.read()
        if all(w in log for w in wanted):
            break
        time.sleep(0.1)
    assert all(w in log for w in wanted), log[-2000:]
    assert "completion_tokens=" in log


def test_process_chunked_body_over_the_limit_is_413(server):
    """130 MB announced by nothing but chunks; the client stops once the answer is there."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=20)
    with s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        piece = b"%x\r\n" % 2**16 + b"x" * 2**16 + b"\r\n"
        sent, t0 = 0, time.monotonic()
        try:
            while sent < 130 * 2**20 and time.monotonic() - t0 < 20:
                if select.select([s], [], [], 0)[0]:
                    break                          # the server has answered
                s.sendall(piece)
                sent += 2**16
        except OSError:
            pass                                   # it closed the connection after answering
        data = b""
        try:
            while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < 100:
                more = s.recv(65536)
                if not more:
                    break
                data += more
        except OSError:
            pass                                   # reset after the answer (unread upload)
    assert data.startswith(b"HTTP/1.1 413"), data[:200]
    assert b"--max-body-mb" in data
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def test_process_clients_that_give_up_are_not_computed(server):
    """Twelve clients that give up after 0.3 s while answers (about 0.2 s each, no visual cache)
    take turns on the model: those that left before their turn are never run (counted as
    cancelled, not served)."""
    before = httpx.get(f"{server.url}/health", timeout=10).json()["queue"]
    url = f"{server.url}/v1/chat/completions"

    def impatient(i):
        body = video_body((server.media / "sample.mp4").as_uri(), f"{Q} [{i}]")
        try:
            httpx.post(url, json=body, timeout=0.3)
        except httpx.TimeoutException:
            pass

    threads = [threading.Thread(target=impatient, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 30:        # the one running when they left finishes
        q = httpx.get(f"{server.url}/health", timeout=10).json()["queue"]
        if q["waiting"] == 0 and q["running"] == 0:
            break
        time.sleep(0.05)
    cancelled = q["cancelled"] - before["cancelled"]
    served = q["served"] - before["served"]
    assert cancelled >= 1 and cancelled + served == 12, (cancelled, served, q)


def test_process_sigterm_under_load_answers_everyone_and_exits_0(server):
    """Twelve requests in flight (one running, the rest queued), then SIGTERM: every client gets
    an HTTP answer -- 200 for the running one, 503 + Retry-After for the queued -- and the
    process exits 0."""
    url = f"{server.url}/v1/chat/completions"
    results = [None] * 12

    def client(i):
        body = video_body((server.media / "sample.mp4").as_uri(), f"{Q} ({i})",
                          max_tokens=16)
        try:
            with httpx.Client(timeout=60) as c:    # its own connection
                r = c.post(url, json=body)
            results[i] = (r.status_code, r.headers.get("retry-after"))
        except httpx.HTTPError as e:
            results[i] = repr(e)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 30:
        q = httpx.get(f"{server.url}/health", timeout=10).json()["queue"]
        if q["waiting"] >= 6:
            break
        time.sleep(0.02)
    server.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    rc = server.proc.wait(60)
    assert all(isinstance(r, tuple) for r in results), results    # no connection left unanswered
    assert {r[0] for r in results} <= {200, 503}, results
    assert all(r[1] == "5" for r in results if r[0] == 503), results
    assert sum(r[0] == 503 for r in results) >= 1, results
    assert rc == 0
    with open(server.stderr_path) as f:
        log = f.read()
    assert "Traceback" not in log, log
