"""The load-time request warm-up (issue 21, cold start): one throw-away answer through every stage,
forgotten afterwards, so the first real request pays no first-call costs and gets the same answer."""
import torch

from vr_runtime.runtime import VideoRouter


def _ask(vr, video):
    res = vr.answer(video, "What shape is the red object?", num_frames=video.shape[0],
                    max_new_tokens=4, policy="fragment", cache_visual=True)
    return res.text, res.report["visual_tokens"], res.report["generated_tokens"]


def test_off_by_default_on_cpu(tiny_lm):
    vr = VideoRouter(tiny_lm, warmup_frames=0)
    assert "skipped" in vr.request_warmup


def test_warm_request_runs_every_stage_and_changes_no_answer(tiny_lm, monkeypatch):
    video = torch.randn(5, 3, 448, 448, generator=torch.Generator().manual_seed(3))
    cold = VideoRouter(tiny_lm, warmup_frames=0)
    before = _ask(cold, video)

    stages = []
    real_prepare = VideoRouter.prepare

    def spy(self, req):
        p = real_prepare(self, req)
        stages.append(sorted(p.timer.times))
        return p
    monkeypatch.setattr(VideoRouter, "prepare", spy)
    warm = VideoRouter(tiny_lm, routers=cold.routers, warmup_frames=0, warm_request=True)
    monkeypatch.undo()
    # the throw-away request ran vision and the routers (FixedRelevance(run_routers=True))
    assert len(stages) == 1 and {"vision", "router", "compress"} <= set(stages[0])
    assert warm.request_warmup["frames"] == 8 and warm.request_warmup["seconds"] > 0
    assert len(warm.visual_cache) == 0          # forgotten: nothing of it is served to a user
    assert _ask(warm, video) == before     # the same answer, tokens and length
