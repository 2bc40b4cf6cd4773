"""``videorouter serve`` as a real process on 127.0.0.1: a small load test (bench/scripts/bench_serve.py's
own code: 40 requests, 8 at a time, good and bad mixed; every answer equal to ``videorouter ask``,
every error as expected, resident memory flat), the ``openai`` client, and the exact request
lmms-eval's ``openai`` model sends with ``pass_video_url=True``, as plain HTTP."""
import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from bench.scripts import bench_serve  # noqa: E402
from serve_helpers import ask, sse_text, stable  # noqa: E402

Q = "What shape is the red object?"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    media = bench_serve.make_media_dir(tmp_path_factory.mktemp("http"))
    with bench_serve.serve(media, "--frames", "8", "--max-length", "1400",
                           "--max-new-tokens", "16") as s:
        s.media = media
        yield s


def test_load_no_loss_correct_flat_memory(server):
    res = bench_serve.run_benchmark(None, requests=40, concurrency=8, frames=(8, 5),
                                    time_limit=240, rss_slack_mb=64, ask=ask,
                                    questions=bench_serve.QUESTIONS[:2], server=server,
                                    media=server.media)
    assert res["failures"] == [] and res["failure_count"] == 0
    assert res["answered"] == res["correct"] == 40
    assert set(res["by_status"]) <= {"200", "400", "403", "422"} and res["by_status"]["200"] > 20
    assert res["server_alive_after"]
    assert res["rss_mb"]["growth"] < 64, res["rss_mb"]
    assert res["passed"]


def test_lmms_eval_openai_model_request_shape(server):
    """lmms_eval/models/chat/openai.py with pass_video_url=True: local paths become
    file://<abspath>, max_tokens and temperature at the top level, the frame count in
    extra_body["media_io_kwargs"] (the openai client merges extra_body into the JSON body)."""
    video = server.media / "sample.mp4"
    payload = {
        "messages": [{"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": f"file://{video}"}},
            {"type": "text", "text": Q}]}],
        "model": "tiny", "max_tokens": 16, "temperature": 0,
        "media_io_kwargs": {"video": {"num_frames": 6}},
    }
    r = httpx.post(f"{server.url}/v1/chat/completions", content=json.dumps(payload),
                   headers={"content-type": "application/json",
                            "authorization": "Bearer EMPTY"}, timeout=120)
    assert r.status_code == 200, r.text
    want = ask(video, Q, 6, 1400, 16, "auto")
    assert r.json()["choices"][0]["message"]["content"] == want["text"]
    assert stable(r.json()["videorouter"]) == stable(want["report"])


def test_openai_client(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="EMPTY", max_retries=0)
    assert [m.id for m in client.models.list()] == ["tiny"]
    video = server.media / "sample.mp4"
    messages = [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": video.as_uri()}},
        {"type": "text", "text": Q}]}]
    resp = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16,
                                          extra_body={"num_frames": 8, "policy": "fragment"})
    want = ask(video, Q, 8, 1400, 16, "fragment")
    assert resp.choices[0].message.content == want["text"]
    assert resp.usage.prompt_tokens == want["report"]["prompt_tokens"]
    assert resp.model_extra["videorouter"]["frame_indices"] == want["report"]["frame_indices"]
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16,
                                            stream=True, extra_body={"num_frames": 8,
                                                                     "policy": "fragment"})
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) \
        == want["text"]
    with pytest.raises(openai.PermissionDeniedError) as e:
        client.chat.completions.create(model="tiny", max_tokens=4, messages=[
            {"role": "user", "content": [
                {"type": "video_url", "video_url": {"url": "file:///etc/passwd"}},
                {"type": "text", "text": Q}]}])
    assert "outside the server's media directory" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=messages)


def test_stream_over_http(server):
    body = {"model": "tiny", "stream": True, "messages": [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": (server.media / "sample.mp4").as_uri()}},
        {"type": "text", "text": "What color is the background?"}]}]}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        raw = b"".join(r.iter_bytes())
    text, _ = sse_text(raw)
    want = ask(server.media / "sample.mp4", "What color is the background?", 8, 1400, 16, "auto")
    assert text == want["text"]


def test_cli_start_errors_are_one_line(tmp_path, capsys):
    from vr_runtime import cli
    with pytest.raises(SystemExit) as e:
        cli.main(["serve", "--media-dir", str(tmp_path / "absent")])
    assert e.value.code == 2
    assert capsys.readouterr().err == (f"videorouter: error: --media-dir "
                                       f"'{tmp_path / 'absent'}': no such directory\n")
    busy = bench_serve.make_media_dir(tmp_path)
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        with pytest.raises(SystemExit) as e:
            cli.main(["serve", "--media-dir", str(busy), "--port", str(s.getsockname()[1])])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("videorouter: error: cannot listen on 127.0.0.1:") and \
        err.count("\n") == 1 and "--port" in err
