"""`videorouter serve` on Qwen3-VL: tiny-qwen3-vl through the same app equals `videorouter ask`
on the same video, question and settings (docs/CONTRACT.md section 6)."""
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from serve_helpers import ask, stable, video_body  # noqa: E402
from test_serve_app import Q, make_app, post  # noqa: E402


def test_qwen3_vl_answer_equals_videorouter_ask(media):
    from fastapi.testclient import TestClient

    from vr_runtime.runtime import VideoRouter
    vr = VideoRouter.from_pretrained("tiny-qwen3-vl", device="cpu", visual_cache_size=2)
    app, _ = make_app(vr, media, engine_kw={"model": "tiny-qwen3-vl"})
    want = ask(media / "sample.mp4", Q, 6, 1400, 4, "global", model="tiny-qwen3-vl")
    with TestClient(app) as c:
        r = post(c, video_body((media / "sample.mp4").as_uri(), Q, model="tiny-qwen3-vl",
                               num_frames=6, max_length=1400, max_tokens=4, policy="global"))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == want["text"]
    assert stable(r.json()["videorouter"]) == stable(want["report"])
    assert r.json()["videorouter"]["backbone"] == "qwen3_vl"
