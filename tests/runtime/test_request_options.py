"""AnswerOptions' window names, ``scales=`` (a triple or "auto", resolved once per request)
and the per-request text-token count."""
import dataclasses

import pytest
import torch

from vr_runtime.planning.policies import Windows
from vr_runtime.planning.scales import auto_scales, budget_from_text
from vr_runtime.request import AnswerOptions

Q = "What shape is the red object?"


def test_window_fields_and_no_old_names():
    o = AnswerOptions(relevant_window=2, other_window=8, global_window=4)
    assert o.windows == Windows(relevant_window=2, other_window=8, global_window=4)
    assert dataclasses.replace(o, global_window=2).global_window == 2
    # the names before they said which frames they pool are gone (CHANGELOG.md)
    for old in ("high", "low", "global_scale"):
        with pytest.raises(TypeError, match=old):
            AnswerOptions(**{old: 2})
        with pytest.raises(TypeError, match=old):
            Windows(**{old: 2})
        assert not hasattr(o, old)


def test_scales_triple_sets_the_windows():
    o = AnswerOptions(scales="4,1,8")
    assert o.scales == (4, 1, 8)
    assert (o.global_window, o.relevant_window, o.other_window) == (4, 1, 8)
    assert dataclasses.replace(o, num_frames=8).windows == o.windows
    with pytest.raises(ValueError, match="give one of them"):
        AnswerOptions(scales=(4, 1, 8), other_window=2)
    with pytest.raises(ValueError, match="scales"):
        AnswerOptions(scales="2,1")
    with pytest.raises(ValueError, match="auto"):
        AnswerOptions(scales="auto").windows


def _auto_windows(vr, num_frames, max_length, max_new_tokens, margin=100) -> dict:
    """The budget study's windows at the B_img of Q with ``num_frames`` frames' lines."""
    b = budget_from_text(vr.lm.text_tokens(Q, num_frames, None), max_length, max_new_tokens,
                         margin)
    s = auto_scales(b, vr.lm.grid[0] * vr.lm.grid[1])
    return dict(global_window=s[0], relevant_window=s[1], other_window=s[2])


@pytest.mark.parametrize("max_length", [1400, 99999])
def test_scales_auto_resolves_per_request(tiny_vr, max_length):
    kw = dict(num_frames=16, max_length=max_length, max_new_tokens=16)
    want = _auto_windows(tiny_vr, **kw)
    req = tiny_vr.request(torch.zeros(16, 3, 448, 448), Q, scales="auto", **kw)
    got = req.windows
    assert dict(global_window=got.global_window, relevant_window=got.relevant_window,
                other_window=got.other_window) == want
    with pytest.raises(ValueError, match="backbone"):
        from vr_runtime.request import Request
        Request.build("v.mp4", Q, AnswerOptions(scales="auto"))


def test_scales_auto_and_fixed_give_the_same_answer(tiny_vr):
    v = torch.randn(4, 3, 448, 448, generator=torch.Generator().manual_seed(0))
    kw = dict(num_frames=4, max_new_tokens=2, max_length=1400, policy="global")
    fixed = _auto_windows(tiny_vr, **{k: kw[k] for k in ("num_frames", "max_length",
                                                         "max_new_tokens")})
    a = tiny_vr.answer(v, Q, scales="auto", **kw)
    b = tiny_vr.answer(v, Q, **fixed, **kw)
    assert a.text == b.text and a.report["windows"] == b.report["windows"]


def test_text_tokens_counted_once_per_distinct_count(tiny_vr, monkeypatch):
    calls = []
    real = tiny_vr.lm.text_tokens

    def counting(*a, **k):
        calls.append((a[1], None if k.get("kept") is None else tuple(k["kept"])))
        return real(*a, **k)
    monkeypatch.setattr(tiny_vr.lm, "text_tokens", counting)
    v = torch.randn(4, 3, 448, 448, generator=torch.Generator().manual_seed(1))
    tiny_vr.answer(v, Q, num_frames=4, max_new_tokens=2, max_length=1400, policy="fragment",
                   relevant=[True, False, False, True], scales="auto")
    assert calls and len(calls) == len(set(calls))


def test_load_frames_opens_without_decoding(tiny_vr):
    pv = torch.zeros(3, 3, 448, 448)
    from vr_runtime.telemetry.timing import StageTimer
    req = tiny_vr.request(pv, Q, num_frames=3)
    f = tiny_vr.load_frames(req, StageTimer(tiny_vr.lm.device))
    assert f.T == 3 and f.pixel_values is None


def test_long_prompt_routes_to_the_long_planners(tiny_vr):
    """long_prompt="auto": both Semantic Router classes go to the long-prompt planners, capped at
    the backbone's trained frame count (the tiny's 16); the budget stays exact and every
    relevant frame stays at full resolution; a bad value is one line."""
    from vr_runtime.backbones.trained_frames import trained_frames_of
    T, cap = 40, trained_frames_of(tiny_vr.lm)
    rel = [t in (7, 30) for t in range(T)]
    req = tiny_vr.request(torch.zeros(T, 3, 448, 448), Q, num_frames=T, long_prompt="auto",
                          neighbour_window=2)
    assert req.route_to == {"global": "global-long", "fragment": "fragment-long"}
    assert req.windows.prompt_frames == cap == 16 and req.windows.neighbour_window == 2
    r = tiny_vr.answer(torch.zeros(T, 3, 448, 448), Q, num_frames=T, max_length=2400,
                       max_new_tokens=2, policy="fragment-long", relevant=rel,
                       long_prompt="auto").report
    kept = [t for t, w in enumerate(r["windows"]) if w != 0]
    assert len(kept) <= cap and {7, 30} <= set(kept) and r["windows"][7] == 1
    assert r["visual_tokens"] <= r["budget"]
    with pytest.raises(ValueError, match="long_prompt"):
        AnswerOptions(long_prompt="sometimes")
