"""Hostile media and uploads against the server: a GIF whose logical screen is huge, a named
pipe in the media directory, a folder swapped for a symlink after the check, a duration the
container does not declare, a file rewritten in place, bodies sent without the key or too many
at once, a decode that outlives its deadline, and the upload store a killed server leaves."""
import asyncio
import base64
import json
import os
import shutil
import struct
import subprocess
import tempfile
import time

import pytest

from serve_helpers import SAMPLE, video_body

Q = "What shape is the red object?"
SET = dict(num_frames=8, max_length=1400, max_tokens=8)


def make_app(vr, media, engine_kw=None, media_kw=None, **app_kw):
    from vr_runtime.serve.app import create_app
    from vr_runtime.serve.engine import Engine, EngineConfig
    from vr_runtime.serve.media import MediaConfig, MediaStore
    store = MediaStore(MediaConfig(media_dir=media, **(media_kw or {})))
    engine = Engine(vr, store, EngineConfig(**(engine_kw or {})))
    return create_app(engine, **app_kw), engine


def gif(width, height, frames=3) -> bytes:
    b = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\0\0\0\xff\xff\xff"
    for _ in range(frames):
        b += b"\x21\xf9\x04\x00\x0a\x00\x00\x00"
        b += b"\x2c" + struct.pack("<HHHHB", 0, 0, 1, 1, 0) + b"\x02\x02\x44\x01\x00"
    return b + b"\x3b"


def post(client, body, **kw):
    return client.post("/v1/chat/completions", json=body, **kw)


def error_of(r, status):
    assert r.status_code == status, (r.status_code, r.text)
    return r.json()["error"]["message"]


def test_a_gif_bomb_as_a_data_url_is_422_at_once(vr, media):
    from fastapi.testclient import TestClient
    app, _ = make_app(vr, media)
    url = "data:video/gif;base64," + base64.b64encode(gif(16000, 16000)).decode()
    with TestClient(app) as c:
        t0 = time.monotonic()
        msg = error_of(post(c, video_body(url, Q, **SET)), 422)
        assert time.monotonic() - t0 < 5
        assert "video_url (data: URL): the GIF's logical screen is 16000x16000" in msg
        assert "--max-frame-pixels" in msg
        assert post(c, video_body((media / "sample.mp4").as_uri(), Q, **SET)).status_code == 200


def test_a_named_pipe_in_the_media_dir_is_422_and_the_server_keeps_answering(vr, media):
    from fastapi.testclient import TestClient
    fifo = media / "pipe.mp4"
    os.mkfifo(fifo)
    try:
        app, engine = make_app(vr, media, engine_kw={"timeout_s": 10.0})
        with TestClient(app) as c:
            for _ in range(2):
                t0 = time.monotonic()
                msg = error_of(post(c, video_body(fifo.as_uri(), Q, **SET)), 422)
                assert msg == f"{fifo}: is a named pipe (FIFO), not a video file; pass a " \
                              f"regular file" and time.monotonic() - t0 < 5
            assert post(c, video_body((media / "sample.mp4").as_uri(), Q, **SET)).status_code \
                == 200
    finally:
        fifo.unlink()


def test_a_folder_swapped_for_a_symlink_after_the_check_is_403(vr, tmp_path):
    from vr_runtime.serve.errors import APIError
    from vr_runtime.serve.media import MediaConfig, MediaStore
    media, outside = tmp_path / "media", tmp_path / "outside"
    (media / "sub").mkdir(parents=True)
    outside.mkdir()
    (media / "sub" / "clip.mp4").write_bytes(SAMPLE.read_bytes())
    (outside / "clip.mp4").write_bytes(SAMPLE.read_bytes())
    store = MediaStore(MediaConfig(media_dir=media))
    checked = store._local

    def check_then_swap(url):
        path = checked(url)               # inside the media directory when checked...
        shutil.rmtree(media / "sub")      # ...then the folder becomes a link to outside
        os.symlink(outside, media / "sub")
        return path
    store._local = check_then_swap
    with pytest.raises(APIError) as e:
        store.resolve((media / "sub" / "clip.mp4").as_uri())
    assert e.value.status == 403 and "outside the server's media directory" in e.value.message
    store.close()


def test_a_video_is_read_through_the_descriptor_checked(vr, tmp_path):
    from vr_runtime.serve.media import MediaConfig, MediaStore
    media = tmp_path / "media"
    (media / "sub").mkdir(parents=True)
    (media / "sub" / "clip.mp4").write_bytes(SAMPLE.read_bytes())
    store = MediaStore(MediaConfig(media_dir=media))
    video = store.resolve((media / "sub" / "clip.mp4").as_uri())
    inode = os.stat(media / "sub" / "clip.mp4").st_ino
    shutil.move(str(media / "sub"), str(tmp_path / "gone"))      # swapped after the check
    os.symlink(tmp_path, media / "sub")
    assert video.path.startswith("/proc/self/fd/") and os.stat(video.path).st_ino == inode
    assert vr.answer(video.path, Q, num_frames=4, max_length=1400, max_new_tokens=2).text \
        is not None
    store.release(video)
    store.close()


@pytest.fixture(scope="module")
def undeclared(media):
    """8 s of video written to a pipe: the Matroska header declares no duration."""
    out = media / "piped.mkv"
    with open(out, "wb") as f:
        subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-f", "lavfi", "-i",
                        "testsrc=size=64x64:rate=5:duration=8", "-c:v", "mjpeg", "-f",
                        "matroska", "pipe:1"], stdout=f, check=True)
    return out


def test_an_undeclared_duration_over_the_cap_is_422(vr, media, undeclared):
    from fastapi.testclient import TestClient
    app, _ = make_app(vr, media, media_kw={"max_video_seconds": 5.0})
    with TestClient(app) as c:
        msg = error_of(post(c, video_body(undeclared.as_uri(), Q, **SET)), 422)
        assert "runs past 5." in msg and "at most 5 s are accepted (--max-video-seconds)" in msg


def test_a_file_rewritten_in_place_is_not_answered_from_the_cache(vr, media):
    from fastapi.testclient import TestClient
    clip = media / "rewritten.mp4"
    clip.write_bytes(SAMPLE.read_bytes())
    app, _ = make_app(vr, media)
    body = video_body(clip.as_uri(), Q, **SET)
    with TestClient(app) as c:
        assert post(c, body).json()["videorouter"]["visual_cache"] == "miss"
        assert post(c, body).json()["videorouter"]["visual_cache"] == "hit"
        st = clip.stat()
        clip.write_bytes(SAMPLE.read_bytes())             # cp -p: rewritten, mtime kept
        os.utime(clip, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert clip.stat().st_mtime_ns == st.st_mtime_ns and clip.stat().st_size == st.st_size
        assert post(c, body).json()["videorouter"]["visual_cache"] == "miss"


def _scope(length, headers=()):
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
            "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
            "query_string": b"", "root_path": "",
            "headers": [(b"content-type", b"application/json"),
                        (b"content-length", str(length).encode()), *headers],
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}


async def _call(app, scope, receive):
    sent = []

    async def send(m):
        sent.append(m)
    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], dict(start["headers"]), b"".join(
        m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_a_request_without_the_key_is_401_before_its_body_is_read(vr, media):
    app, _ = make_app(vr, media, api_key="s3cret")
    reads = []

    async def receive():
        reads.append(1)
        return {"type": "http.request", "body": b"x" * 1000, "more_body": True}
    status, headers, body = asyncio.run(_call(app, _scope(95 * 2**20), receive))
    assert status == 401 and reads == [] and headers[b"connection"] == b"close"
    assert "API key" in json.loads(body)["error"]["message"]


def test_bodies_in_flight_are_bounded_503_with_retry_after(vr, media):
    app, _ = make_app(vr, media, max_inflight_bytes=1000)

    async def scenario():
        arrived = asyncio.Event()
        release = asyncio.Event()

        async def slow():           # the first upload: its body is still on its way
            arrived.set()
            await release.wait()
            return {"type": "http.disconnect"}
        first = asyncio.ensure_future(_call_or_none(app, _scope(800), slow))
        await arrived.wait()
        second = await _call(app, _scope(800), _never)
        release.set()
        await first
        third = await _call(app, _scope(5), _body(b"{bad"))
        return second, third
    (status, headers, body), third = asyncio.run(scenario())
    assert status == 503 and headers[b"retry-after"] == b"5"
    assert "--max-inflight-mb" in json.loads(body)["error"]["message"]
    assert third[0] == 400          # the first one's bytes were given back


async def _call_or_none(app, scope, receive):
    async def send(m):
        pass
    await app(scope, receive, send)


async def _never():
    await asyncio.sleep(60)


def _body(data):
    async def receive():
        return {"type": "http.request", "body": data, "more_body": False}
    return receive


def test_a_decode_past_the_deadline_stops_and_never_holds_the_model_lock(vr, media, undeclared,
                                                                         monkeypatch):
    from fastapi.testclient import TestClient
    from vr_runtime.video import stream as V
    app, engine = make_app(vr, media, engine_kw={"timeout_s": 1.0, "visual_cache": 0})
    real = V.resize_frame
    calls, locked = [], []

    def slow(*a, **k):              # a decode of 0.5 s a frame (40 frames, on each worker)
        calls.append(1)
        locked.append(engine._model_lock.locked())
        time.sleep(0.5)
        return real(*a, **k)
    monkeypatch.setattr(V, "resize_frame", slow)
    with TestClient(app) as c:
        t0 = time.monotonic()
        msg = error_of(post(c, video_body(undeclared.as_uri(), Q, num_frames=40,
                                          max_length=20000, max_tokens=2)), 504)
        assert time.monotonic() - t0 < 3 and "timeout of 1 s" in msg
        at_deadline = len(calls)
        time.sleep(2.0)
        # stopped (each worker at most finishes the frame it had), never under the lock
        assert 1 <= len(calls) <= at_deadline + 2 < 40 and not any(locked)
        monkeypatch.setattr(V, "resize_frame", real)
        assert post(c, video_body((media / "sample.mp4").as_uri(), Q, **SET)).status_code == 200


def test_the_upload_store_of_a_dead_server_is_swept_and_ours_removed(vr, media):
    from vr_runtime.serve.media import MediaConfig, MediaStore
    p = subprocess.Popen(["true"])
    p.wait()                        # a pid that no longer runs
    stale = tempfile.mkdtemp(prefix=f"videorouter-serve-{p.pid}-")
    open(os.path.join(stale, "clip.mp4"), "wb").close()
    store = MediaStore(MediaConfig(media_dir=media))
    assert not os.path.exists(stale)
    assert os.path.basename(store._dir).startswith(f"videorouter-serve-{os.getpid()}-")
    store.close()
    assert not store._dir.exists()


def test_serve_flags_reach_the_configs():
    from vr_runtime.cli import build_parser
    from vr_runtime.serve.command import configs
    args = build_parser().parse_args(["serve", "--media-dir", ".", "--max-frame-pixels", "1000",
                                      "--max-inflight-mb", "2"])
    _, media, _, app_kw = configs(args)
    assert media.max_frame_pixels == 1000 and media.limits().max_frame_pixels == 1000
    assert app_kw["max_inflight_bytes"] == 2 * 2**20
    d = configs(build_parser().parse_args(["serve", "--media-dir", "."]))
    assert d[1].max_frame_pixels == 7680 * 4320 and d[3]["max_inflight_bytes"] == 512 * 2**20
