"""`videorouter eval --scales` and per-method TTFT with the visual cache's cost added back
(issue 27, items 3 and 6)."""
import json

import pytest

from eval_helpers import run_cli


def _report(cache, vision, router, ttft, T=4, kept=4, scorer="image-router-cached"):
    return {"timings_s": {"vision": vision, "router": router, "ttft": ttft},
            "visual_cache": cache, "num_frames_used": T, "scorer": scorer,
            "frame_tokens": [16] * kept + [0] * (T - kept)}


class _Scorer:
    needs_z = True

    def __init__(self, built):
        self.built_s = built


def _cold(order):
    """Cold TTFT per method for one video answered in ``order``; every method's own stages
    cost the same whatever the order: vision 1.0 s for 4 frames, router state 0.3 s, rest 0.5 s."""
    from vr_runtime.eval.ttft import ColdCosts
    costs, out, vision_done, router_done = ColdCosts(), {}, False, False
    for m in order:
        if m == "budget":        # plan-first: keeps 2 of 4 frames, no routers
            v = 0.0 if vision_done else 1.0
            rep, sc = _report("hit" if vision_done else "miss", v, 0.0, v + 0.5, kept=2,
                              scorer=None), None
        else:                    # the Image Router reads all 4 frames
            v = 0.0 if vision_done else 1.0
            built = 0.0 if router_done else 0.3
            rep = _report("hit" if vision_done else "miss", v, built + 0.1, v + built + 0.1 + 0.5)
            sc = _Scorer(built)
            router_done = True
        vision_done = True
        out[m] = costs.add_back(("vr", "video", 4), rep, sc)[0]
    return out


def test_cold_ttft_does_not_depend_on_the_order():
    a = _cold(["budget", "fragment", "auto"])
    b = _cold(["fragment", "auto", "budget"])
    for m in a:
        assert a[m] == pytest.approx(b[m]), m
    assert a["budget"] == pytest.approx(0.5 + 0.5)              # half the vision tower
    assert a["fragment"] == pytest.approx(1.0 + 0.3 + 0.1 + 0.5)
    assert a["auto"] == pytest.approx(a["fragment"])


def test_no_cache_is_left_as_measured():
    from vr_runtime.eval.ttft import ColdCosts
    c = ColdCosts()
    assert c.add_back("k", _report(None, 1.0, 0.2, 1.7)) == (1.7, 0.0)


@pytest.fixture(scope="module")
def scaled(synth_bench, tmp_path_factory):
    return tmp_path_factory.mktemp("eval_scales")


def test_eval_scales_and_cold_ttft(synth_bench, scaled, capsys):
    argv = ["--benchmark", "videomme", "--data", synth_bench["data"], "--videos",
            synth_bench["videos"], "--methods", "global,fragment,budget", "--budgets", "512",
            "--frames", "4", "--answer-mode", "option-text", "--out", scaled, "--no-progress",
            "--max-new-tokens", "1", "--scales", "4,1,8"]
    status, _, err = run_cli(argv, capsys)
    assert status == 0, err
    preds = [json.loads(x) for x in (scaled / "predictions.jsonl").read_text().splitlines()]
    assert json.loads((scaled / "settings.json").read_text())["scales"] == "4,1,8"
    for p in preds:
        if p["method"] == "global":
            assert p["visual_tokens"] == 4 * 16                 # s_g = 4
        # the per-method figure = the cached measurement + what the cache saved this call
        assert p["ttft_s"] == pytest.approx(p["ttft_cached_s"] + p["ttft_added_back_s"], abs=2e-6)
    # `global` is first on every video (the miss, all 4 frames kept: nothing to add back); the
    # Image Router's calls came later and reused Z: their vision tower is added back.
    frag = [p for p in preds if p["method"] == "fragment" and p["visual_cache"] == "hit"]
    assert frag and all(p["ttft_added_back_s"] > 0 for p in frag)
    # a different --scales into the same OUT is refused (one line), the default is not mixed in
    status, _, err = run_cli(argv[:-1] + ["2,1,4"], capsys)
    assert status == 2 and "scales" in err and len(err.strip().splitlines()) == 1
    status, _, err = run_cli(argv[:-2] + ["--scales", "2,1"], capsys)
    assert status == 2 and "three integers" in err


def test_lmms_model_args_scales():
    """The lmms-eval plugin's ``scales=`` model argument (written 4:1:8: model_args split at
    commas) reaches every answer; a bad value fails before the model loads."""
    pytest.importorskip("lmms_eval")
    import torch
    from vr_runtime.eval.lmms_model import VideoRouterLMM
    with pytest.raises(ValueError, match="scales"):
        VideoRouterLMM(pretrained="tiny", scales="2,1", device="cpu")
    lmm = VideoRouterLMM(pretrained="tiny", scales="4:1:8", device="cpu", policy="global",
                         num_frames=4, budget=512)
    assert lmm.scales == (4, 1, 8)
    seen = {}
    real = lmm.vr.answer

    def spy(*a, **kw):
        seen.update(kw)
        return real(*a, **kw)
    lmm.vr.answer = spy
    video = torch.randn(4, 3, 448, 448)
    lmm._text_and_video = lambda messages: ("What?", video)
    res = lmm._respond({"question": "What?"}, None, {"max_new_tokens": 1})
    opts = seen["options"]
    assert (opts.global_window, opts.relevant_window, opts.other_window) == (4, 1, 8)
    assert res.report["frame_tokens"] == [16] * 4


def test_results_carry_both_ttft_figures(scaled):
    """results.json: the per-method mean and, beside it, the mean as measured with the cache
    (runs after test_eval_scales_and_cold_ttft, which wrote this OUT)."""
    rows = json.loads((scaled / "results.json").read_text())["rows"]
    assert rows and all(r["ttft_s_mean"] is not None and r["ttft_cached_s_mean"] is not None
                        for r in rows)
