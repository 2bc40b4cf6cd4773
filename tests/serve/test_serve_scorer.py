"""`videorouter serve --scorer NAME --scorer-model DIR` (issue 25 item 4): the server's requests
use the named scorer; a bad name or directory stops the start in one line, before the model."""
import pytest


def _start_error(capsys, *argv):
    from vr_runtime import cli
    with pytest.raises(SystemExit) as e:
        cli.main(["serve", *argv])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    return err


def test_bad_scorer_stops_the_start(media, tmp_path, capsys):
    assert "did you mean 'clip'" in _start_error(capsys, "--media-dir", str(media),
                                                 "--scorer", "clp")
    assert "no config.json" in _start_error(capsys, "--media-dir", str(media), "--scorer",
                                            "clip", "--scorer-model", str(tmp_path))


def test_the_engine_answers_with_the_named_scorer(media, tmp_path):
    from vr_runtime.cli import build_parser
    from vr_runtime.eval.synthetic import make_random_clip
    from vr_runtime.routing.scorers import CLIPScorer
    from vr_runtime.serve.command import configs
    from vr_runtime.serve.engine import Engine
    from vr_runtime.serve.media import MediaStore
    from vr_runtime.serve.schema import Settings
    clip = make_random_clip(tmp_path / "clip")
    args = build_parser().parse_args(["serve", "--media-dir", str(media), "--device", "cpu",
                                      "--scorer", "clip-fill", "--scorer-model", str(clip)])
    engine_cfg, media_cfg, _, _ = configs(args)
    assert (engine_cfg.scorer, engine_cfg.scorer_model) == ("clip-fill", str(clip))
    engine = Engine.load(engine_cfg, MediaStore(media_cfg))
    try:
        assert isinstance(engine.scorer, CLIPScorer)
        s = Settings(video_url="x", question="What shape is the red object?", system=None,
                     num_frames=4, max_length=1400, max_new_tokens=1, policy="fragment",
                     stream=False, include_usage=False)
        opts = engine.options(s)
        assert opts.scorer is engine.scorer and opts.cache_visual
        res = engine.run_sync(lambda vr: vr.answer(str(media / "sample.mp4"), s.question,
                                                   options=opts))
        assert res.report["scorer"] == "clip"
    finally:
        engine.close()
