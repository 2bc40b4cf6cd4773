"""What an operator watches (vr_runtime.serve.observe): /health counts every API request by
status, failed ones included; GET /metrics in Prometheus' format; an access log line per request
at info."""
import logging

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from serve_helpers import video_body  # noqa: E402

Q = "What shape is the red object?"
SET = dict(num_frames=8, max_length=1400, max_tokens=16)


@pytest.fixture(scope="module")
def app_and_engine(media):
    from vr_runtime.runtime import VideoRouter
    from vr_runtime.serve.app import create_app
    from vr_runtime.serve.engine import Engine, EngineConfig
    from vr_runtime.serve.media import MediaConfig, MediaStore
    vr = VideoRouter.from_pretrained("tiny", device="cpu")   # no visual cache: every stage runs
    engine = Engine(vr, MediaStore(MediaConfig(media_dir=media)), EngineConfig())
    return create_app(engine, max_body_bytes=20_000), engine, media


def parse_metrics(text: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_health_metrics_and_access_log(app_and_engine, caplog):
    from fastapi.testclient import TestClient
    app, engine, media = app_and_engine
    url = (media / "sample.mp4").as_uri()
    with TestClient(app) as c, caplog.at_level(logging.INFO, "videorouter.serve.access"):
        assert c.get("/health").json()["requests"] == {"total": 0, "by_status": {}}
        ok = c.post("/v1/chat/completions", json=video_body(url, Q, **SET))
        assert ok.status_code == 200
        assert c.post("/v1/chat/completions", content=b"{nope").status_code == 400
        assert c.post("/v1/chat/completions", content=b"x" * 30_000).status_code == 413
        assert c.post("/v1/chat/completions",
                      json=video_body("file:///etc/passwd", Q)).status_code == 403
        health = c.get("/health").json()
        text = c.get("/metrics").text
    assert health["requests"] == {"total": 4, "by_status": {"200": 1, "400": 1, "403": 1,
                                                            "413": 1}}
    report = ok.json()["videorouter"]
    m = parse_metrics(text)
    for status in ("200", "400", "403", "413"):
        assert m[("videorouter_requests_total", (("status", status),))] == 1
    assert m[("videorouter_prompt_tokens_total", ())] == report["prompt_tokens"]
    assert m[("videorouter_generated_tokens_total", ())] == report["generated_tokens"]
    assert m[("videorouter_request_seconds_count", ())] == 4
    assert m[("videorouter_queue_waiting", ())] == 0 and m[("videorouter_queue_running", ())] == 0
    for stage in report["timings_s"]:
        assert m[("videorouter_stage_seconds_count", (("stage", stage),))] == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "videorouter.serve.access"]
    assert len(lines) == 4, lines
    assert '"POST /v1/chat/completions" 200' in lines[0]
    assert f"prompt_tokens={report['prompt_tokens']}" in lines[0]
    assert f"completion_tokens={report['generated_tokens']}" in lines[0]
    assert [ln.split('" ')[1].split()[0] for ln in lines] == ["200", "400", "413", "403"]


def test_stream_starts_after_the_prefill_not_after_the_answer(app_and_engine):
    """Real streaming: with the model thread held 0.5 s after each generated token, the first
    content chunk reaches the client before the answer is finished (not after, as when the answer
    was generated in full first), and the chunks concatenate to the non-streamed answer."""
    import asyncio
    import json
    import time

    from serve_helpers import sse_text
    from vr_runtime.serve.app import create_app
    from vr_runtime.serve.engine import Engine, EngineConfig
    _, engine0, media = app_and_engine
    vr = engine0.vr

    class SlowTokens:
        lm = vr.lm
        done_at = None

        def answer(self, *a, on_token=None, **k):
            def each(i):
                on_token(i)
                time.sleep(0.5)
            out = vr.answer(*a, on_token=each if on_token else None, **k)
            SlowTokens.done_at = time.monotonic()
            return out

    engine = Engine(SlowTokens(), engine0.media, EngineConfig())
    app = create_app(engine)
    url = (media / "sample.mp4").as_uri()
    full = vr.answer(str(media / "sample.mp4"), Q, num_frames=8, max_length=1400,
                     max_new_tokens=16, cache_visual=True)
    body = json.dumps(video_body(url, Q, stream=True, **SET)).encode()

    async def run():
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": "/v1/chat/completions",
                 "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
                 "headers": [(b"content-type", b"application/json"),
                             (b"content-length", str(len(body)).encode())],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
        got, sent_body, finished = [], [False], asyncio.Event()

        async def receive():
            if not sent_body[0]:
                sent_body[0] = True
                return {"type": "http.request", "body": body, "more_body": False}
            await finished.wait()
            return {"type": "http.disconnect"}

        async def send(m):
            if m["type"] == "http.response.body":
                got.append((time.monotonic(), m.get("body", b"")))
                if not m.get("more_body"):
                    finished.set()
        await app(scope, receive, send)
        return got

    got = asyncio.run(run())
    raw = b"".join(b for _, b in got)
    text, _ = sse_text(raw)
    assert text == full.text
    first_content = next(t for t, b in got if b'"content": "' in b and b'"content": ""' not in b)
    assert first_content < SlowTokens.done_at - 0.3, (first_content, SlowTokens.done_at)


def test_answer_on_token_hands_over_every_generated_id(app_and_engine):
    """VideoRouter.answer(on_token=...): the ids it is called with are the answer's own (their
    decode is the text, their count the report's generated_tokens), and the answer is unchanged."""
    _, engine, media = app_and_engine
    vr = engine.vr
    kw = dict(num_frames=8, max_length=1400, max_new_tokens=16)
    ids = []
    streamed = vr.answer(str(media / "sample.mp4"), Q, on_token=ids.append, **kw)
    plain = vr.answer(str(media / "sample.mp4"), Q, **kw)
    assert streamed.text == plain.text
    assert len(ids) == streamed.report["generated_tokens"] >= 1
    assert vr.lm.tokenizer.decode(ids, skip_special_tokens=True).strip() == streamed.text
