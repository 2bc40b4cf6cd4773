"""The server's app in-process (FastAPI's TestClient / httpx over ASGI) on the tiny model:
answers equal ``videorouter ask``, reuse does not change them, every error is an OpenAI-style
object with the right status, the queue bound and the deadline hold, streaming."""
import asyncio
import base64
import http.server
import json
import os
import random
import shutil
import threading

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from serve_helpers import SAMPLE, ask, sse_text, stable, video_body  # noqa: E402

Q = "What shape is the red object?"
SET = dict(num_frames=8, max_length=1400, max_tokens=16)


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    root = type(root)(os.path.realpath(root))
    m = root / "media"
    m.mkdir()
    shutil.copy(SAMPLE, m / "sample.mp4")
    (m / "corrupt.mp4").write_bytes(SAMPLE.read_bytes()[:2000])
    (m / "notes.txt").write_text("not a video\n")
    shutil.copy(SAMPLE, root / "outside.mp4")
    os.symlink(root / "outside.mp4", m / "link-out.mp4")
    os.symlink(m / "sample.mp4", m / "link-in.mp4")
    return m


def make_app(vr, media, engine_kw=None, media_kw=None, **app_kw):
    from vr_runtime.serve.app import create_app
    from vr_runtime.serve.engine import Engine, EngineConfig
    from vr_runtime.serve.media import MediaConfig, MediaStore
    store = MediaStore(MediaConfig(media_dir=media, **(media_kw or {})))
    engine = Engine(vr, store, EngineConfig(**(engine_kw or {})))
    return create_app(engine, **app_kw), engine


@pytest.fixture(scope="module")
def client(vr, media):
    from fastapi.testclient import TestClient
    app, _ = make_app(vr, media)
    with TestClient(app) as c:
        yield c


def post(client, body, **kw):
    return client.post("/v1/chat/completions", json=body, **kw)


def assert_error(r, status, *needles):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and isinstance(err["type"], str) and err["type"]
    assert "\n" not in err["message"] and "Traceback" not in err["message"]
    for n in needles:
        assert n in err["message"], err["message"]
    return err


# ----------------------------------------------------------------------------- answers

@pytest.mark.parametrize("policy,how", [("auto", "top"), ("global", "mm_processor_kwargs")])
def test_answer_equals_videorouter_ask(client, media, policy, how):
    want = ask(media / "sample.mp4", Q, 8, 1400, 16, policy)
    if how == "top":
        body = video_body((media / "sample.mp4").as_uri(), Q, policy=policy, **SET)
    else:
        body = video_body((media / "sample.mp4").as_uri(), Q, max_tokens=16,
                          mm_processor_kwargs={"num_frames": 8, "max_length": 1400,
                                               "policy": policy})
    r = post(client, body)
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["object"] == "chat.completion" and d["model"] == "tiny"
    assert d["choices"][0]["message"] == {"role": "assistant", "content": want["text"]}
    assert d["choices"][0]["finish_reason"] in ("stop", "length")
    rep = d["videorouter"]
    assert stable(rep) == stable(want["report"])
    assert d["usage"] == {"prompt_tokens": rep["prompt_tokens"],
                          "completion_tokens": rep["generated_tokens"],
                          "total_tokens": rep["prompt_tokens"] + rep["generated_tokens"]}


def test_other_backbone_answer_equals_videorouter_ask(media):
    """The server is backbone-agnostic: tiny-qwen2.5-vl through the same app equals ask."""
    from fastapi.testclient import TestClient

    from vr_runtime.runtime import VideoRouter
    qwen = VideoRouter.from_pretrained("tiny-qwen2.5-vl", device="cpu", visual_cache_size=2)
    app, _ = make_app(qwen, media, engine_kw={"model": "tiny-qwen2.5-vl"})
    want = ask(media / "sample.mp4", Q, 6, 1400, 8, "fragment", model="tiny-qwen2.5-vl")
    with TestClient(app) as c:
        r = post(c, video_body((media / "sample.mp4").as_uri(), Q, model="tiny-qwen2.5-vl",
                               num_frames=6, max_length=1400, max_tokens=8, policy="fragment"))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == want["text"]
    assert stable(r.json()["videorouter"]) == stable(want["report"])


def test_seek_and_time_window(client, media):
    """A request's seek and time_window reach the decoder; the report says the mode."""
    url = (media / "sample.mp4").as_uri()
    r = post(client, video_body(url, Q, time_window=[2, 6], **SET))
    assert r.status_code == 200, r.text
    rep = r.json()["videorouter"]
    assert rep["seek"] == "exact" and all(2 <= t < 6 for t in rep["frame_times_s"])
    r = post(client, video_body(url, Q, seek="keyframe", time_window="0,4", **SET))
    assert r.status_code == 200, r.text
    rep = r.json()["videorouter"]
    assert rep["seek"] == "keyframe" and rep["frame_times_s"] == [0.0]  # its one keyframe


def test_fps_samples_by_rate(client, media):
    """fps (top level or mm_processor_kwargs, as vLLM's Qwen users pass it) samples by rate: the
    8 s sample at 1 fps is 8 frames, at most num_frames; a bad rate is a 400 naming it."""
    from vr_runtime.serve.schema import Limits, parse_request, to_settings
    url = (media / "sample.mp4").as_uri()
    r = post(client, video_body(url, Q, **{**SET, "num_frames": None},
                                mm_processor_kwargs={"fps": 1}))
    assert r.status_code == 200, r.text
    rep = r.json()["videorouter"]
    assert rep["num_frames_used"] == 8 and any("1 fps" in n for n in rep["notes"])
    s = to_settings(parse_request(video_body(url, Q, fps=2)), Limits(max_frames=12), ["tiny"])
    assert (s.fps, s.num_frames) == (2.0, 12)          # by rate, up to the server's cap
    r = post(client, video_body(url, Q, fps=-1, **SET))
    assert r.status_code == 400 and "fps" in r.text


def test_visual_cache_does_not_change_answers(vr):
    """cache_visual=True (miss, then hit) gives what a fresh uncached answer gives."""
    vr.clear_visual_cache()
    questions = [(Q, "auto"), ("What color is the background?", "auto"), (Q, "fragment"),
                 ("How many objects are there?", "global"), (Q, "uniform"), (Q, "budget")]
    for frames in (8, 5):
        for q, policy in questions:
            plain = vr.answer(str(SAMPLE), q, num_frames=frames, max_length=1400,
                              max_new_tokens=16, policy=policy)
            cached = vr.answer(str(SAMPLE), q, num_frames=frames, max_length=1400,
                               max_new_tokens=16, policy=policy, cache_visual=True)
            assert cached.report["visual_cache"] in ("hit", "miss")
            assert cached.text == plain.text
            assert stable(cached.report) == stable(plain.report)
    assert cached.report["visual_cache"] == "hit"


def test_data_url_and_lmms_eval_shape(client, media):
    """A data: video answers as the same file does; and the exact body lmms-eval's `openai` model
    sends with pass_video_url=True (file:// URL, max_tokens, temperature 0, the frame count in
    media_io_kwargs) works."""
    want = ask(media / "sample.mp4", Q, 8, 12288, 16, "auto")
    data = "data:video/mp4;base64," + base64.b64encode(SAMPLE.read_bytes()).decode()
    r = post(client, video_body(data, Q, num_frames=8, max_tokens=16))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == want["text"]
    lmms = {"messages": [{"role": "user", "content": [
                {"type": "video_url", "video_url": {"url": f"file://{media / 'sample.mp4'}"}},
                {"type": "text", "text": Q}]}],
            "model": "tiny", "max_tokens": 16, "temperature": 0,
            "media_io_kwargs": {"video": {"num_frames": 8}}}
    r = client.post("/v1/chat/completions", content=json.dumps(lmms),
                    headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == want["text"]
    assert stable(r.json()["videorouter"]) == stable(want["report"])


def test_stream(client, media):
    body = video_body((media / "sample.mp4").as_uri(), "What color is the background?", **SET)
    full = post(client, body).json()
    r = post(client, dict(body, stream=True, stream_options={"include_usage": True}))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    text, chunks = sse_text(r.content)
    assert text == full["choices"][0]["message"]["content"]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"]
               for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-2]["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == full["usage"]
    assert stable(chunks[-2]["videorouter"]) == stable(full["videorouter"])


def test_streamed_pieces_concatenate_to_the_answer(vr):
    """The Detokenizer's pieces, id by id, plus its rest, are exactly decode(ids).strip() (the
    runtime's answer text): unfinished characters and surrounding whitespace included."""
    from vr_runtime.serve.app import Detokenizer
    tok = vr.lm.tokenizer
    rng = random.Random(0)
    alphabet = "abc xyz RED circle 123 .,!?\n \u00e9\u4e2d\U0001f600"
    for n in [0, 1, 2, 7, 31, 64]:
        for _ in range(5):
            text = "".join(rng.choice(alphabet) for _ in range(n))
            ids = tok.encode(text, add_special_tokens=False)
            want = tok.decode(ids, skip_special_tokens=True).strip()
            d = Detokenizer(tok)
            pieces = [d.push(i) for i in ids]
            assert "".join(pieces) + d.rest(want) == want


# ----------------------------------------------------------------------------- errors

@pytest.mark.parametrize("raw,needle", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
    (b'{"model": "tiny"}', "messages: required field is missing"),
    (b'{"messages": "hi"}', "messages"),
])
def test_malformed_requests_are_400(client, raw, needle):
    r = client.post("/v1/chat/completions", content=raw,
                    headers={"content-type": "application/json"})
    assert_error(r, 400, needle)


@pytest.mark.parametrize("extra,needle", [
    ({"num_frames": "8"}, "num_frames"),
    ({"num_frames": True}, "num_frames"),
    ({"num_frames": 100000}, "between 1 and 256"),
    ({"mm_processor_kwargs": {"num_frames": 1.5}}, "mm_processor_kwargs.num_frames"),
    ({"num_frames": 8, "mm_processor_kwargs": {"num_frames": 4}}, "given twice"),
    ({"policy": "best"}, "policy"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 10**6}, "max_tokens"),
    ({"temperature": "hot"}, "temperature"),
    ({"n": 2}, "n=1"),
    ({"stop": ["\n"]}, "stop"),
    ({"stream": "yes"}, "stream"),
    ({"max_length": 50}, "max_length"),       # BudgetError from the runtime: too small
    ({"seek": "nearest"}, "seek"),
    ({"time_window": [5, 1]}, "time_window"),
    ({"mm_processor_kwargs": {"time_window": "a,b"}}, "mm_processor_kwargs.time_window"),
])
def test_bad_settings_are_400(client, media, extra, needle):
    r = post(client, video_body((media / "sample.mp4").as_uri(), Q, **extra))
    assert_error(r, 400, needle)


def test_bad_messages_are_400(client, media):
    url = (media / "sample.mp4").as_uri()
    for body, needle in [
        ({"messages": [{"role": "user", "content": "no video here"}]}, "no video"),
        ({"messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {
            "url": url}}]}]}, "question is empty"),
        ({"messages": [{"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": url}},
            {"type": "video_url", "video_url": {"url": url}},
            {"type": "text", "text": Q}]}]}, "2 videos"),
        ({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": Q}]}]},
         "image_url"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]},
         "messages.0.content.0.text: required field is missing"),
        (dict(video_body(url, Q), messages=video_body(url, Q)["messages"] + [
            {"role": "assistant", "content": "circle"}]), "multi-turn"),
        (video_body("ftp://host/v.mp4", Q), "unsupported URL"),
        (video_body("file://otherhost/v.mp4", Q), "local path"),
        (video_body("data:video/mp4;base64,@@@@", Q), "base64"),
        (video_body("data:text/plain;base64,aGk=", Q), "video/"),
    ]:
        assert_error(post(client, body), 400, needle)
    assert_error(post(client, dict(video_body(url, Q), model="gpt-4o")), 404, "gpt-4o")


def test_paths_outside_the_media_dir_are_403(client, media):
    for url in [f"file://{media}/../outside.mp4", (media / "link-out.mp4").as_uri(),
                f"file://{media}/../../../etc/passwd", "file:///etc/passwd",
                f"file://{media}/../nonexistent.mp4",
                "https://example.com/v.mp4", "http://127.0.0.1:1/v.mp4"]:
        assert_error(post(client, video_body(url, Q)), 403)
    r = post(client, video_body((media / "link-in.mp4").as_uri(), Q, **SET))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("name", ["corrupt.mp4", "notes.txt", "missing.mp4"])
def test_unusable_video_is_422_with_the_cli_message(client, media, name):
    cli = ask(media / name, Q, 8, 1400, 16, "auto")
    assert cli["returncode"] == 2 and cli["error"].startswith("videorouter: error: ")
    err = assert_error(post(client, video_body((media / name).as_uri(), Q, **SET)), 422)
    assert err["message"] == cli["error"][len("videorouter: error: "):]


def test_caps_and_api_key(vr, media):
    from fastapi.testclient import TestClient
    app, _ = make_app(vr, media, api_key="s3cret", max_body_bytes=4000,
                      media_kw={"max_video_bytes": 10_000, "max_video_seconds": 5.0})
    url = (media / "sample.mp4").as_uri()
    key = {"authorization": "Bearer s3cret"}
    with TestClient(app) as c:
        assert_error(c.get("/v1/models"), 401, "API key")
        assert_error(c.get("/v1/models", headers={"authorization": "Bearer nope"}), 401)
        assert_error(post(c, video_body(url, Q)), 401)
        assert c.get("/v1/models", headers=key).json()["data"][0]["id"] == "tiny"
        assert c.get("/health").json()["status"] == "ok"
        data = "data:video/mp4;base64," + base64.b64encode(SAMPLE.read_bytes()).decode()
        assert_error(post(c, video_body(data, Q), headers=key), 413, "request body")
        assert_error(post(c, video_body(url, Q, **SET), headers=key), 422, "at most 5 s")
    app, _ = make_app(vr, media, media_kw={"max_video_bytes": 10_000})
    with TestClient(app) as c:
        assert_error(post(c, video_body(data, Q)), 413, "data: video")
        assert_error(c.get("/nowhere"), 404, "no route")
        assert_error(c.get("/v1/chat/completions"), 405)


def test_remote_url_when_enabled(vr, media, tmp_path):
    from fastapi.testclient import TestClient
    shutil.copy(SAMPLE, tmp_path / "remote.mp4")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a):
            pass

    handler = lambda *a, **k: Quiet(*a, directory=str(tmp_path), **k)  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        app, _ = make_app(vr, media, media_kw={"allow_remote": True})
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        with TestClient(app) as c:
            r = post(c, video_body(f"{base}/remote.mp4", Q, **SET))
            local = post(c, video_body((media / "sample.mp4").as_uri(), Q, **SET))
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"] == local.json()["choices"][0]["message"]
            assert_error(post(c, video_body(f"{base}/absent.mp4", Q)), 422, "cannot download")
    finally:
        httpd.shutdown()


# ----------------------------------------------------------------------------- load control

def _run(coro):
    return asyncio.run(coro)


def test_full_queue_is_429_and_the_server_recovers(vr, media):
    app, engine = make_app(vr, media, engine_kw={"max_queue": 1})
    body = video_body((media / "sample.mp4").as_uri(), Q, **SET)

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            engine._model_lock.acquire()          # the model is busy
            try:
                first = [asyncio.ensure_future(c.post("/v1/chat/completions", json=body))
                         for _ in range(2)]     # one for the model, one waiting
                while engine.stats()["waiting"] < 2:
                    await asyncio.sleep(0.01)
                third = await c.post("/v1/chat/completions", json=body)
            finally:
                engine._model_lock.release()
            done = await asyncio.gather(*first)
            after = await c.post("/v1/chat/completions", json=body)
            return third, done, after

    third, done, after = _run(scenario())
    assert_error(third, 429, "busy")
    assert [r.status_code for r in done] == [200, 200]
    assert after.status_code == 200
    assert engine.stats()["waiting"] == 0 and engine.stats()["running"] == 0


def test_deadline_is_504_and_the_slot_comes_back(vr, media):
    app, engine = make_app(vr, media, engine_kw={"timeout_s": 0.5})
    body = video_body((media / "sample.mp4").as_uri(), Q, **SET)

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            engine._model_lock.acquire()
            try:
                late = await c.post("/v1/chat/completions", json=body)
            finally:
                engine._model_lock.release()
            for _ in range(200):             # the abandoned job is skipped and lets go
                st = engine.stats()
                if st["waiting"] == 0 and st["running"] == 0:
                    break
                await asyncio.sleep(0.01)
            return late, engine.stats()

    late, stats = _run(scenario())
    assert_error(late, 504, "timeout")
    assert stats["waiting"] == 0 and stats["running"] == 0
    assert engine.media.stored_count() == 0


def test_ray_builder_arguments_go_through_the_serve_parser(media):
    """`serve run ...ray_app:app_builder key=value` reads the same options as the command."""
    from vr_runtime.serve.command import configs
    from vr_runtime.serve.ray_app import serve_args
    args = serve_args({"media_dir": str(media), "max_queue": "8", "frames": 16,
                       "allow_remote_media": True, "api_key": None})
    engine, media_cfg, limits, app_kw = configs(args)
    assert (engine.max_queue, limits.num_frames, media_cfg.allow_remote) == (8, 16, True)
    assert args.host == "127.0.0.1" and app_kw["api_key"] is None


def test_a_failing_request_does_not_take_the_server_down(vr, media):
    """A bug (500, the CLI's one-line 'internal error'), out of memory (503): one line each, no
    traceback, and the next request is answered."""
    import torch
    from fastapi.testclient import TestClient

    class Flaky:
        lm = vr.lm
        errors = [RuntimeError("boom\nsecond line"), torch.OutOfMemoryError("CUDA out of memory")]

        def answer(self, *a, **k):
            if self.errors:
                raise self.errors.pop(0)
            return vr.answer(*a, **k)

    app, _ = make_app(Flaky(), media)
    body = video_body((media / "sample.mp4").as_uri(), Q, **SET)
    with TestClient(app, raise_server_exceptions=False) as c:
        err = assert_error(post(c, body), 500)
        assert err["message"] == "internal error: RuntimeError: boom second line"
        assert_error(post(c, body), 503, "out of memory")
        assert post(c, body).status_code == 200


def test_engine_has_no_old_answer_name(vr, media):
    """Engine.submit is the one name (the pre-1.0 alias Engine.answer is gone)."""
    _, engine = make_app(vr, media)
    assert hasattr(engine, "submit") and not hasattr(engine, "answer")
