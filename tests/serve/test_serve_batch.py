"""``videorouter serve --max-batch N`` (issue 21, item 4): requests waiting together with the same
settings are answered in one ``VideoRouter.answer_batch`` call, each with its own response, the
answer it gets alone; given-up requests in a batch are never run; --max-batch 1 never batches."""
import asyncio

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from serve_helpers import video_body  # noqa: E402

QUESTIONS = ("What shape is the red object?", "What color is the circle?",
             "Is there a square in the video?")
SET = dict(num_frames=8, max_length=1400, max_tokens=8)


class Spy:
    """The runtime, recording the size of every ``answer_batch`` and counting ``answer``."""

    def __init__(self, vr):
        self.vr, self.lm, self.batches, self.answers = vr, vr.lm, [], 0

    def answer(self, *a, **k):
        self.answers += 1
        return self.vr.answer(*a, **k)

    def answer_batch(self, videos, *a, **k):
        self.batches.append(len(videos))
        return self.vr.answer_batch(videos, *a, **k)


def make_app(vr, media, max_batch):
    from vr_runtime.serve.app import create_app
    from vr_runtime.serve.engine import Engine, EngineConfig
    from vr_runtime.serve.media import MediaConfig, MediaStore
    from vr_runtime.serve.schema import Limits
    engine = Engine(vr, MediaStore(MediaConfig(media_dir=media)),
                    EngineConfig(max_batch=max_batch))
    return create_app(engine, Limits()), engine


def queued_together(app, engine, media, questions, gone_index=None):
    """Post ``questions`` while the model is held, so that they all wait; then free it."""
    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as c:
            engine._model_lock.acquire()
            try:
                tasks = [asyncio.ensure_future(c.post("/v1/chat/completions", json=video_body(
                    (media / "sample.mp4").as_uri(), q, **SET))) for q in questions]
                for _ in range(1000):           # every video checked, waiting for the model
                    if len(engine._batchable) == len(questions) or engine.config.max_batch == 1:
                        if engine.stats()["waiting"] == len(questions):
                            break
                    await asyncio.sleep(0.01)
                assert engine.stats()["waiting"] == len(questions)
                if gone_index is not None:        # given up while waiting: never run
                    slot = next(item[0] for item in engine._batchable
                                if item[2].question == questions[gone_index])
                    assert slot.abandon()
            finally:
                engine._model_lock.release()
            return await asyncio.wait_for(asyncio.gather(*tasks), 60)
    return asyncio.run(scenario())


def alone(vr, media, q):
    return vr.answer(str(media / "sample.mp4"), q, num_frames=SET["num_frames"],
                     max_length=SET["max_length"], max_new_tokens=SET["max_tokens"],
                     cache_visual=True).text


def test_waiting_requests_are_answered_in_one_batch_as_alone(vr, media):
    spy = Spy(vr)
    app, engine = make_app(spy, media, max_batch=4)
    rs = queued_together(app, engine, media, QUESTIONS)
    assert spy.batches == [3] and spy.answers == 0
    for r, q in zip(rs, QUESTIONS):
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == alone(vr, media, q)
    st = engine.stats()
    assert st["served"] == 3 and st["waiting"] == 0 and st["running"] == 0
    assert engine.media.stored_count() == 0


def test_max_batch_bounds_the_batch_and_one_never_batches(vr, media):
    spy = Spy(vr)
    app, engine = make_app(spy, media, max_batch=2)
    rs = queued_together(app, engine, media, QUESTIONS)
    assert all(r.status_code == 200 for r in rs)
    assert spy.batches == [2] and spy.answers == 1       # 2 together, then the third alone
    spy = Spy(vr)
    app, engine = make_app(spy, media, max_batch=1)
    rs = queued_together(app, engine, media, QUESTIONS[:2])
    assert all(r.status_code == 200 for r in rs)
    assert spy.batches == [] and spy.answers == 2


def test_a_given_up_request_is_left_out_of_the_batch(vr, media):
    spy = Spy(vr)
    app, engine = make_app(spy, media, max_batch=4)
    rs = queued_together(app, engine, media, QUESTIONS, gone_index=1)
    assert spy.batches == [2] and spy.answers == 0
    assert [r.status_code for r in rs] == [200, 504, 200]
    st = engine.stats()
    assert st["waiting"] == 0 and st["running"] == 0 and st["served"] == 2


def test_a_failing_batch_is_answered_one_by_one(vr, media):
    spy = Spy(vr)

    def broken(videos, *a, **k):
        spy.batches.append(len(videos))
        raise RuntimeError("batch failed")

    spy.answer_batch = broken
    app, engine = make_app(spy, media, max_batch=4)
    rs = queued_together(app, engine, media, QUESTIONS[:2])
    assert spy.batches == [2] and spy.answers == 2
    for r, q in zip(rs, QUESTIONS):
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == alone(vr, media, q)


def test_max_batch_option(media, capsys):
    from vr_runtime.cli import build_parser
    from vr_runtime.serve.command import configs
    args = build_parser().parse_args(["serve", "--media-dir", str(media), "--max-batch", "3"])
    assert configs(args)[0].max_batch == 3
    args = build_parser().parse_args(["serve", "--media-dir", str(media)])
    assert configs(args)[0].max_batch == 1
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["serve", "--media-dir", str(media), "--max-batch", "0"])
    assert e.value.code == 2 and "--max-batch" in capsys.readouterr().err
