"""``serve``'s ``/ui`` and the thumbnails extension in-process (no browser; tests/html/
test_browser.py drives the page in Chromium): the page and its policy, the media listing confined
as file:// URLs are, the key, ``--no-ui``, thumbnails from the request's own decode (never a
second one, and from the store on a visual-cache hit), and default responses unchanged."""
import json
import os
import shutil

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from serve_helpers import SAMPLE, sse_text, stable, video_body  # noqa: E402

Q = "What shape is the red object?"
SET = dict(num_frames=8, max_length=1400, max_tokens=16)
JPEG = "data:image/jpeg;base64,"


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("ui")
    root = type(root)(os.path.realpath(root))
    m = root / "media"
    (m / "sub").mkdir(parents=True)
    shutil.copy(SAMPLE, m / "sample.mp4")
    shutil.copy(SAMPLE, m / "sub" / 'odd "name" <x>.mp4')
    shutil.copy(SAMPLE, m / ".hidden.mp4")
    (m / "notes.txt").write_text("not a video\n")
    shutil.copy(SAMPLE, root / "outside.mp4")
    os.symlink(root / "outside.mp4", m / "link-out.mp4")
    os.symlink(m / "sample.mp4", m / "link-in.mp4")
    os.symlink(root, m / "dir-out")
    os.mkfifo(m / "fifo.mp4")
    return m


def make_client(vr, media, engine_kw=None, **app_kw):
    from fastapi.testclient import TestClient
    from vr_runtime.serve.app import create_app
    from vr_runtime.serve.engine import Engine, EngineConfig
    from vr_runtime.serve.media import MediaConfig, MediaStore
    engine = Engine(vr, MediaStore(MediaConfig(media_dir=media)), EngineConfig(**(engine_kw or {})))
    return TestClient(create_app(engine, **app_kw))


@pytest.fixture(scope="module")
def client(vr, media):
    with make_client(vr, media) as c:
        yield c


def test_the_page_is_served_with_its_policy(client):
    r = client.get("/ui")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "img-src data:" in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    # (the one http:// in it is SVG's namespace name, which is never fetched)
    assert r.text.count("http:") == r.text.count("http://www.w3.org/2000/svg") == 1
    assert "https:" not in r.text
    assert '"key_required":false' in r.text


def test_the_listing_is_confined_as_file_urls_are(client, media):
    r = client.get("/ui/media")
    assert r.status_code == 200
    body = r.json()
    names = [v["name"] for v in body["videos"]]
    # the symlink out, the folder link out, the FIFO, the hidden file and the text file are
    # left out; the link that stays inside is listed
    assert names == ["link-in.mp4", "sample.mp4", 'sub/odd "name" <x>.mp4']
    assert body["truncated"] is False and body["max_video_mb"] == 64.0
    # the listing takes no path: whatever a client adds, it lists the media directory only
    assert client.get("/ui/media", params={"path": "/etc", "dir": ".."}).json() == body
    assert client.get("/ui/media/../../etc/passwd").status_code == 404
    for v in body["videos"]:     # every URL listed is one a request may send
        r = client.post("/v1/chat/completions", json=video_body(v["url"], Q, **SET))
        assert r.status_code == 200, (v, r.text)


def test_the_listing_stops_at_its_limit(vr, media):
    from vr_runtime.serve.media import MediaConfig, MediaStore
    videos, truncated = MediaStore(MediaConfig(media_dir=media)).listing(limit=2)
    assert [v["name"] for v in videos] == ["link-in.mp4", "sample.mp4"] and truncated


def test_thumbnails_come_with_the_answer_only_when_asked(client, media):
    url = (media / "sample.mp4").as_uri()
    plain = client.post("/v1/chat/completions", json=video_body(url, Q, **SET)).json()
    assert "videorouter_thumbnails" not in plain
    asked = client.post("/v1/chat/completions",
                        json=video_body(url, Q, videorouter_thumbnails=True, **SET)).json()
    thumbs = asked.pop("videorouter_thumbnails")
    assert len(thumbs) == len(asked["videorouter"]["frame_indices"]) == 8
    assert all(t.startswith(JPEG) for t in thumbs)
    assert asked["choices"] == plain["choices"] and asked["usage"] == plain["usage"]
    assert stable(asked["videorouter"]) == stable(plain["videorouter"])
    # streamed: the same text, the thumbnails on the last chunk beside the report
    r = client.post("/v1/chat/completions",
                    json=video_body(url, Q, stream=True, videorouter_thumbnails=True, **SET))
    text, chunks = sse_text(r.content)
    assert text == plain["choices"][0]["message"]["content"]
    last = [c for c in chunks if "videorouter" in c]
    assert len(last) == 1 and last[0]["videorouter_thumbnails"] == thumbs
    assert all("videorouter_thumbnails" not in c for c in chunks if "videorouter" not in c)
    r = client.post("/v1/chat/completions", json=video_body(url, Q, stream=True, **SET))
    assert all("videorouter_thumbnails" not in c for c in sse_text(r.content)[1])


def test_thumbnails_field_is_strict(client, media):
    r = client.post("/v1/chat/completions", json=video_body(
        (media / "sample.mp4").as_uri(), Q, videorouter_thumbnails="yes", **SET))
    assert r.status_code == 400 and "videorouter_thumbnails" in r.json()["error"]["message"]


def test_thumbnails_need_no_second_decode_and_survive_a_cache_hit(vr, media, monkeypatch):
    """With the visual cache off, a request that asks for thumbnails decodes exactly the frames
    a plain one does. With it on: thumbnails asked for on a video a plain request cached are
    decoded for then (off the model's lock; the answer still a cache hit), and a later request
    answered from the cache decodes nothing and gets the same thumbnails from the store."""
    from vr_runtime.video import stream
    calls = []
    real = stream.decode_frames

    def counting(info, indices, *a, **kw):
        calls.append(len(indices))
        return real(info, indices, *a, **kw)
    monkeypatch.setattr(stream, "decode_frames", counting)
    url = (media / "sample.mp4").as_uri()
    with make_client(vr, media, engine_kw={"visual_cache": 0}) as c:
        c.post("/v1/chat/completions", json=video_body(url, Q, **SET))
        plain, calls[:] = list(calls), []
        r = c.post("/v1/chat/completions",
                   json=video_body(url, Q, videorouter_thumbnails=True, **SET))
        assert calls == plain and sum(calls) >= 8
        assert all(t.startswith(JPEG) for t in r.json()["videorouter_thumbnails"])
    vr.clear_visual_cache()
    with make_client(vr, media) as c:
        c.post("/v1/chat/completions", json=video_body(url, Q, **SET))   # caches, no thumbnails
        calls[:] = []
        first = c.post("/v1/chat/completions",
                       json=video_body(url, Q, videorouter_thumbnails=True, **SET)).json()
        assert first["videorouter"]["visual_cache"] == "hit" and sum(calls) >= 8
        assert all(t.startswith(JPEG) for t in first["videorouter_thumbnails"])
        calls[:] = []
        again = c.post("/v1/chat/completions", json=video_body(
            url, "What shape is the blue object?", videorouter_thumbnails=True, **SET)).json()
        assert again["videorouter"]["visual_cache"] == "hit" and calls == []
        assert again["videorouter_thumbnails"] == first["videorouter_thumbnails"]


def test_no_ui_serves_no_page(vr, media):
    with make_client(vr, media, ui=False) as c:
        assert c.get("/ui").status_code == 404 and c.get("/ui/media").status_code == 404
        assert c.get("/health").status_code == 200


def test_no_ui_flag_reaches_the_app():
    from vr_runtime.serve.command import configs, serve_parser
    base = ["serve", "--media-dir", "."]
    assert configs(serve_parser().parse_args(base))[3]["ui"] is True
    assert configs(serve_parser().parse_args(base + ["--no-ui"]))[3]["ui"] is False


def test_hostile_input_gets_text_or_a_4xx_and_the_server_keeps_serving(vr, media):
    with make_client(vr, media, api_key="sekret") as c:
        assert c.get("/ui").status_code == 200          # the page holds no data
        assert '"key_required":true' in c.get("/ui").text
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "sekret"}):
            r = c.get("/ui/media", headers=headers)
            assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
        key = {"authorization": "Bearer sekret"}
        assert c.get("/ui/media", headers=key).status_code == 200
        outside = (media.parent / "outside.mp4").as_uri()
        for url in (outside, (media / "link-out.mp4").as_uri(), (media / "dir-out" /
                    "outside.mp4").as_uri(), "file://" + str(media) + "/../outside.mp4"):
            r = c.post("/v1/chat/completions", headers=key,
                       json=video_body(url, Q, videorouter_thumbnails=True, **SET))
            assert r.status_code == 403, (url, r.text)
            assert "videorouter_thumbnails" not in r.json()
        r = c.post("/v1/chat/completions", json=video_body((media / "sample.mp4").as_uri(), Q,
                                                           videorouter_thumbnails=True, **SET))
        assert r.status_code == 401
        odd = (media / "sub" / 'odd "name" <x>.mp4').as_uri()
        r = c.post("/v1/chat/completions", headers=key, json=video_body(
            odd, "<script>alert(1)</script> What shape is the red object?", **SET))
        assert r.status_code == 200      # a question with markup is only text to the model
        r = c.post("/v1/chat/completions", headers=key, json=video_body(
            (media / "fifo.mp4").as_uri(), Q, **SET))
        assert r.status_code == 422 and "FIFO" in r.json()["error"]["message"]
        assert c.get("/health").json()["status"] == "ok"


def test_ui_page_knows_the_stream_format(client, media):
    """The page parses what the server streams: the SSE events it reads (data: lines, [DONE])
    carry the report and the thumbnails as JSON (a NaN in a report would need its fallback)."""
    r = client.post("/v1/chat/completions", json=video_body(
        (media / "sample.mp4").as_uri(), Q, stream=True, videorouter_thumbnails=True, **SET))
    events = r.text.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    assert all(e.startswith("data: ") for e in events[:-1])
    json.loads(events[-3][len("data: "):])
