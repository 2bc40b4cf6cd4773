"""`videorouter eval --scorer NAME --scorer-model DIR` (issue 25 item 4): the methods that use the
default Image Router score frames with the named scorer instead; a bad name fails in one line."""
import json

from eval_helpers import run_cli


def _argv(synth_bench, out, *extra):
    return ["--benchmark", "videomme", "--data", synth_bench["data"], "--videos",
            synth_bench["videos"], "--budgets", "1024", "--frames", 4, "--limit", 2,
            "--out", out, "--no-progress", "--max-new-tokens", 1, *extra]


def _preds(out):
    return {(p["id"], p["method"]): p for p in
            (json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines())}


def test_fragment_with_a_named_scorer_is_the_clip_fill_method(synth_bench, clip_dir, tmp_path,
                                                              capsys):
    out = tmp_path / "named"
    status, _, err = run_cli(_argv(synth_bench, out, "--methods", "fragment,clip-fill",
                                   "--clip", clip_dir, "--scorer", "clip-fill",
                                   "--scorer-model", clip_dir), capsys)
    assert status == 0, err
    preds = _preds(out)
    ids = sorted({i for i, _ in preds})
    for i in ids:
        a, b = preds[(i, "fragment")], preds[(i, "clip-fill")]
        assert (a["visual_tokens"], a["response"]) == (b["visual_tokens"], b["response"])
    settings = json.loads((out / "settings.json").read_text())
    assert settings["scorer"] == "clip-fill" and settings["scorer_model"] == str(clip_dir)


def test_bad_scorer_is_one_line(synth_bench, tmp_path, capsys):
    status, _, err = run_cli(_argv(synth_bench, tmp_path / "o", "--methods", "fragment",
                                   "--scorer", "clip-fil"), capsys)
    assert status == 2 and "did you mean 'clip-fill'" in err and len(err.strip().splitlines()) == 1
    status, _, err = run_cli(_argv(synth_bench, tmp_path / "o", "--methods", "fragment",
                                   "--scorer", "clip"), capsys)
    assert status == 2 and "needs --scorer-model" in err
