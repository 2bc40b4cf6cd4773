"""The server decodes the videos of waiting requests while the model works on another
(``Prefetch.check_and_decode`` runs off the model's lock, bounded by the clip slots): two
requests take less than the sum of their parts.

A long clip's decode is stood in for by a decode that first waits ``DECODE_S`` without holding
the GIL (as FFmpeg's decoding does), and the model's work by an answer that takes ``MODEL_S``:
real work of both kinds on a shared 2-core machine would measure the machine's load instead."""
import asyncio
import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from serve_helpers import video_body  # noqa: E402

DECODE_S = 1.0
MODEL_S = 1.0
SET = dict(num_frames=4, max_length=1400, max_tokens=2)


class SlowModel:
    """The tiny runtime, whose answers take at least MODEL_S (the model's share of a request)."""

    def __init__(self, vr):
        self.vr, self.lm = vr, vr.lm

    def answer(self, *a, **k):
        t0 = time.perf_counter()
        out = self.vr.answer(*a, **k)
        time.sleep(max(0.0, MODEL_S - (time.perf_counter() - t0)))
        return out

    def answer_batch(self, *a, **k):   # not reached with max_batch=1
        raise AssertionError("max_batch=1 never batches")


def test_two_requests_take_less_than_the_sum_of_their_parts(vr, media, monkeypatch):
    import vr_runtime.video.frames as V
    from vr_runtime.serve.app import create_app
    from vr_runtime.serve.engine import Engine, EngineConfig
    from vr_runtime.serve.media import MediaConfig, MediaStore
    from vr_runtime.serve.schema import Limits
    real = V.open_frames

    def long_decode(*a, **k):       # the off-lock check and prefetch take DECODE_S
        time.sleep(DECODE_S)
        return real(*a, **k)
    monkeypatch.setattr(V, "open_frames", long_decode)
    engine = Engine(SlowModel(vr), MediaStore(MediaConfig(media_dir=media)),
                    EngineConfig(max_batch=1, visual_cache=0))
    app = create_app(engine, Limits())
    url = (media / "sample.mp4").as_uri()

    async def post(c, q):
        r = await c.post("/v1/chat/completions", json=video_body(url, q, **SET))
        assert r.status_code == 200, r.text

    async def run(questions):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as c:
            t0 = time.perf_counter()
            await asyncio.gather(*(post(c, q) for q in questions))
            return time.perf_counter() - t0

    one = asyncio.run(run(["What shape is the red object?"]))
    assert one >= DECODE_S + MODEL_S
    both = asyncio.run(run(["What shape is the red object?", "What color is the circle?"]))
    # serially 2 x (decode + model); pipelined, the second decode hides under the first answer
    print(f"one {one:.2f} s, both {both:.2f} s")
    assert both < 2 * one - 0.5 * DECODE_S, (one, both)
