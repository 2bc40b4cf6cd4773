"""What a newcomer meets at the command line (issue 24, item 6): "did you mean" for policy and
method typos, a line while the model loads (terminals only, never with --json), and where the
demo's sample clip is."""
import json
import pathlib

import pytest

from vr_runtime import cli
from vr_runtime.errors import did_you_mean
from vr_runtime.planning.policies import get_planner, policy_names

SAMPLE = str(cli.SAMPLE_VIDEO)


def test_did_you_mean():
    assert did_you_mean("fragmnet", policy_names()) == "; did you mean 'fragment'?"
    assert did_you_mean("Global", policy_names()) == "; did you mean 'global'?"
    assert did_you_mean("zzzz", policy_names()) == ""


def _usage_error(capsys, argv):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    return err


def test_policy_and_method_typos_suggest_the_name(capsys):
    err = _usage_error(capsys, ["ask", SAMPLE, "What?", "--policy", "fragmnet"])
    assert "--policy 'fragmnet'" in err and "did you mean 'fragment'?" in err
    from vr_runtime.eval.methods import MethodError, get_method
    with pytest.raises(MethodError, match="did you mean 'no-image-router'"):
        get_method("no-image-routr")
    with pytest.raises(ValueError, match="did you mean 'global'"):
        get_planner("globl")
    from vr_runtime import VideoRouter
    vr = VideoRouter.from_pretrained("tiny")
    with pytest.raises(ValueError, match="did you mean 'uniform'"):
        vr.answer(SAMPLE, "What?", num_frames=2, policy="unifrom")


def test_serve_policy_typo_suggests_the_name():
    pytest.importorskip("fastapi")
    from vr_runtime.serve.errors import APIError
    from vr_runtime.serve.schema import Limits, parse_request, to_settings
    req = parse_request({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What?"},
        {"type": "video_url", "video_url": {"url": "file:///v.mp4"}}]}], "policy": "fragmnet"})
    with pytest.raises(APIError, match="did you mean 'fragment'"):
        to_settings(req, Limits(), ["tiny"])


def test_demo_prints_the_sample_path(capsys):
    assert cli.main(["demo", "--print-sample-path"]) == 0
    out = capsys.readouterr().out
    assert out == f"{cli.SAMPLE_VIDEO}\n" and pathlib.Path(out.strip()).is_file()


def test_model_load_feedback_on_a_terminal_only(monkeypatch, capsys):
    monkeypatch.setattr(cli, "stderr_is_tty", lambda: True)
    argv = ["ask", SAMPLE, "Which shape is blue?", "--frames", "4", "--max-new-tokens", "4",
            "--device", "cpu"]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "loading model tiny on cpu (float32)" in err
    assert cli.main(argv + ["--json"]) == 0
    cap = capsys.readouterr()
    assert "loading model" not in cap.err + cap.out
    assert json.loads(cap.out)["text"] is not None
