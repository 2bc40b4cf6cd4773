"""Scorers by name (issue 25 item 4): ``--scorer NAME [--scorer-model DIR]`` on ``videorouter
ask`` picks a registered scorer; a bad name or directory is one line and exit 2 before the model
loads; the scorer sees a ScoringInput only (no runtime) and says its own notes."""
import json

import pytest

from vr_runtime.routing import scorers
from vr_runtime.cli import SAMPLE_VIDEO, main

Q = "What shape is the red object?"


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    from vr_runtime.eval.synthetic import make_random_clip
    return make_random_clip(tmp_path_factory.mktemp("clip"))


def _ask(capsys, *extra):
    rc = main(["ask", str(SAMPLE_VIDEO), Q, "--frames", "4", "--max-new-tokens", "1",
               "--policy", "fragment", "--json", *extra])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)["report"]


def _usage_error(capsys, monkeypatch, *argv):
    """Exit 2 with one line on stderr, and no model was loaded."""
    from vr_runtime.runtime import VideoRouter

    def no_load(*a, **k):
        raise AssertionError("the model loaded before the arguments were checked")
    monkeypatch.setattr(VideoRouter, "from_pretrained", no_load)
    with pytest.raises(SystemExit) as e:
        main(["ask", str(SAMPLE_VIDEO), Q, *argv])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    return err


def test_the_default_is_the_image_router(capsys):
    assert scorers.DEFAULT_SCORER == "image-router"
    rep = _ask(capsys)
    named = _ask(capsys, "--scorer", "image-router")
    assert rep["scorer"] == named["scorer"] == "image-router"
    assert named["frame_scores"] == rep["frame_scores"] and named["windows"] == rep["windows"]


def test_clip_by_name_through_ask(capsys, clip_dir):
    rep = _ask(capsys, "--scorer", "clip", "--scorer-model", str(clip_dir))
    assert rep["scorer"] == "clip-matched" and len(rep["frame_scores"]) == 4
    rep = _ask(capsys, "--scorer", "clip-fill", "--scorer-model", str(clip_dir))
    assert rep["scorer"] == "clip" and not any("untrained" in n for n in rep["notes"])


def test_bad_scorer_arguments_fail_before_the_model_loads(capsys, monkeypatch, tmp_path):
    err = _usage_error(capsys, monkeypatch, "--scorer", "clp")
    assert "--scorer 'clp'" in err and "did you mean 'clip'" in err
    err = _usage_error(capsys, monkeypatch, "--scorer", "clip")
    assert "needs --scorer-model" in err
    err = _usage_error(capsys, monkeypatch, "--scorer", "clip", "--scorer-model", str(tmp_path))
    assert "--scorer-model" in err and "no config.json" in err
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    err = _usage_error(capsys, monkeypatch, "--scorer", "clip", "--scorer-model", str(tmp_path))
    assert "expected clip or siglip" in err
    err = _usage_error(capsys, monkeypatch, "--scorer-model", str(tmp_path))
    assert "loads no model" in err


def test_registry_refuses_a_second_registration():
    with pytest.raises(ValueError, match="already registered"):
        scorers.register_scorer("clip", lambda model_dir, **kw: None)


def test_untrained_router_notes_come_from_the_scorer(tiny_vr, frames):
    """The runtime adds no scorer-specific note: the Image Router scorer says them, a scorer
    that does not use the routers says none."""
    pv = frames(3, seed=5)
    r = tiny_vr.answer(pv, Q, num_frames=3, max_new_tokens=1, policy="fragment",
                       router_pool=2).report
    assert any("untrained" in n for n in r["notes"])
    assert any("router_pool=2 differs" in n for n in r["notes"])
    r = tiny_vr.answer(pv, Q, num_frames=3, max_new_tokens=1, policy="fragment",
                       relevant=[True, False, True]).report
    assert not any("untrained" in n or "router_pool" in n for n in r["notes"])


def test_a_scorer_sees_no_runtime(tiny_vr, frames):
    seen = {}

    class Spy(scorers.FrameScorer):
        name = "spy"
        needs_z = True
        uses_routers = False

        def score(self, inp):
            seen.update(q=inp.question_embeddings(), grid=inp.grid, Z=inp.Z,
                        routers=inp.routers, spec=inp.frame_spec)
            T = int(inp.pixel_values.shape[0])
            return scorers.FrameScores([True] * T, None, self.name, notes=["spy ran"])

    r = tiny_vr.answer(frames(2, seed=6), Q, num_frames=2, max_new_tokens=1, policy="fragment",
                       scorer=Spy()).report
    assert r["scorer"] == "spy" and "spy ran" in r["notes"]
    assert seen["routers"] is tiny_vr.routers and seen["grid"] == tiny_vr.lm.grid
    assert seen["Z"].shape[0] == 2 and seen["spec"] == tiny_vr.lm.frame_spec
    assert seen["q"].shape[-1] == tiny_vr.lm.hidden_size
