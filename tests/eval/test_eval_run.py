"""`videorouter eval` end to end on the tiny model: every method at two budgets on a synthetic
Video-MME-layout benchmark, the output files, the visual cache (one decode + Z per video and
model), resumption, and the routers reading the bare question."""
import csv
import json

import pytest
import torch

from eval_helpers import counting_answers, run_cli

METHODS = ("dense,budget,uniform,global,fragment,auto,clip,no-image-router,no-semantic-router,"
           "data-ft")
BUDGETS = (256, 512)
FRAMES = 4


@pytest.fixture(scope="module")
def data_ft_dir(tmp_path_factory):
    """An HF checkpoint directory standing in for the Data FT model (the tiny weights)."""
    from vr_runtime.backbones import load_backbone
    d = tmp_path_factory.mktemp("data_ft")
    lm = load_backbone("tiny")
    lm.model.save_pretrained(d, safe_serialization=True)
    lm.tokenizer.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def run(synth_bench, clip_dir, data_ft_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval_out")
    argv = ["--benchmark", "videomme", "--data", synth_bench["data"], "--videos",
            synth_bench["videos"], "--methods", METHODS, "--budgets",
            ",".join(map(str, BUDGETS)), "--frames", FRAMES, "--clip", clip_dir,
            "--data-ft-model", data_ft_dir, "--answer-mode", "option-text", "--out", out,
            "--no-progress", "--max-new-tokens", 4]
    return out, argv


def test_every_method_two_budgets(run, synth_bench, capsys):
    out, argv = run
    status, stdout, err = run_cli(argv, capsys)
    assert status == 0, err
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    nq = synth_bench["questions"]
    methods = METHODS.split(",")
    assert len(preds) == nq * (1 + 2 * (len(methods) - 1))     # dense has no budget: one row
    want_policy = {"dense": {"dense"}, "budget": {"budget"}, "uniform": {"uniform"},
                   "global": {"global"}, "fragment": {"fragment"}, "auto": {"global", "fragment"},
                   "clip": {"fragment"}, "no-image-router": {"global", "uniform"},
                   "no-semantic-router": {"fragment"}, "data-ft": {"uniform"}}
    for p in preds:
        assert p["policy"] in want_policy[p["method"]], p
        assert p["correct"] == (p["prediction"] == p["answer"])
        if p["method"] == "dense":
            assert p["budget"] is None and p["visual_tokens"] == FRAMES * 256
        else:
            assert p["budget"] in BUDGETS and 0 < p["visual_tokens"] <= p["budget"], p
    # Routing ablation: no Fragment plan survives without the Image Router.
    assert not any(p["policy"] == "fragment" for p in preds if p["method"] == "no-image-router")
    # The visual cache: one miss (decode + Z) per video for each model, hits afterwards
    # (`budget`, InternVL3*, samples its own floor(B/256) frames from the video: not shared).
    for model, ms in (("main", [m for m in methods if m not in ("data-ft", "budget")]),
                      ("ft", ["data-ft"])):
        for v in {p["video"] for p in preds}:
            st = [p["visual_cache"] for p in preds if p["video"] == v and p["method"] in ms]
            assert st.count("miss") == 1 and len(st) > 1, (model, v, st)
    res = json.loads((out / "results.json").read_text())
    rows = {(r["method"], r["budget"]): r for r in res["rows"]}
    assert len(rows) == 1 + 2 * (len(methods) - 1)
    for (m, b), r in rows.items():
        ps = [p for p in preds if p["method"] == m and p["budget"] == b]
        assert r["n"] == len(ps) == nq
        assert r["accuracy"] == pytest.approx(100 * sum(p["correct"] for p in ps) / len(ps), abs=0.01)
        assert r["visual_tokens_mean"] == pytest.approx(
            sum(p["visual_tokens"] for p in ps) / len(ps), abs=0.05)
        assert set(r["by_duration"]) == {"short", "medium", "long"}
    meta = res["meta"]
    assert meta["skipped"] == 0 and meta["device"] and meta["torch"] and "eval" in meta["command"]
    table = list(csv.reader((out / "results.csv").open()))
    assert table[0][:6] == ["Method", "Frames", "B_img", "Visual tokens", "n", "Overall"]
    assert len(table) == 1 + len(rows)
    md = (out / "results.md").read_text()
    assert "| auto | 4 | 512 |" in md and "Command:" in md
    assert (out / "accuracy_vs_tokens.png").stat().st_size > 5000
    assert "auto" in stdout


def test_rerun_resumes(run, monkeypatch, capsys):
    """A rerun makes only the predictions that are missing."""
    out, argv = run
    lines = (out / "predictions.jsonl").read_text().splitlines()
    assert lines, "runs after test_every_method_two_budgets"
    dropped = json.loads(lines[3])
    (out / "predictions.jsonl").write_text("\n".join(lines[:3] + lines[4:]) + "\n")
    calls = counting_answers(monkeypatch)
    status, _, err = run_cli(argv, capsys)
    assert status == 0, err
    assert calls == [(dropped["id"], dropped["method"], dropped["budget"])]
    again = (out / "predictions.jsonl").read_text().splitlines()
    assert sorted(again) != [] and len(again) == len(lines)
    assert not list(out.glob("predictions.part*.jsonl"))
    # Other settings in the same OUT are refused, not silently mixed with the old predictions.
    status, _, err = run_cli(argv + ["--prompt-style", "bare"], capsys)
    assert status == 2 and "prompt_style" in err and len(err.strip().splitlines()) == 1


def test_skip_missing_counts(synth_bench, tmp_path, capsys):
    import pathlib
    import shutil
    videos = tmp_path / "v"
    shutil.copytree(synth_bench["videos"], videos)
    gone = sorted(videos.iterdir())[0]
    gone.unlink()
    argv = ["--benchmark", "videomme", "--data", synth_bench["data"], "--videos", videos,
            "--methods", "uniform", "--budgets", "256", "--frames", 2, "--out", tmp_path / "o",
            "--answer-mode", "option-text", "--no-progress", "--max-new-tokens", 2]
    status, _, err = run_cli(argv, capsys)
    assert status == 2 and pathlib.Path(gone).stem in err and "--skip-missing" in err
    status, out, err = run_cli(argv + ["--skip-missing"], capsys)
    assert status == 0, err
    from vr_runtime.eval.benchmarks import load_benchmark
    k = sum(1 for q in load_benchmark("videomme", synth_bench["data"],
                                      synth_bench["videos"]).questions
            if pathlib.Path(q.video).stem == pathlib.Path(gone).stem)
    assert k >= 2   # every video has several questions
    res = json.loads((tmp_path / "o" / "results.json").read_text())
    assert res["meta"]["skipped"] == k and res["rows"][0]["n"] == synth_bench["questions"] - k
    assert f"skipped {k} question" in out


def test_seek_and_time_window(synth_bench, tmp_path, capsys):
    """--seek and --time-window reach every answer, and are settings a rerun must match."""
    argv = ["--benchmark", "videomme", "--data", synth_bench["data"], "--videos",
            synth_bench["videos"], "--methods", "uniform", "--budgets", "256", "--frames", 2,
            "--out", tmp_path / "o", "--answer-mode", "option-text", "--no-progress",
            "--max-new-tokens", 2, "--limit", 2, "--seek", "keyframe", "--time-window", "0,2"]
    status, _, err = run_cli(argv, capsys)
    assert status == 0, err
    settings = json.loads((tmp_path / "o" / "settings.json").read_text())
    assert settings["seek"] == "keyframe" and settings["time_window"] == [0.0, 2.0]
    status, _, err = run_cli(argv[:-4], capsys)   # the default exact seek: not a resume
    assert status == 2 and "seek" in err, err


def test_routers_read_the_bare_question():
    """answer(prompt, router_question=bare): the Semantic Router and the Image Router decide on
    the bare question exactly as answer(bare) does, while the LLM reads the full prompt."""
    from vr_runtime import VideoRouter
    from vr_runtime.eval.prompting import mc_prompt
    vr = VideoRouter.from_pretrained("tiny")
    assert vr.routers_trained
    g = torch.Generator().manual_seed(11)
    frames = torch.randn(5, 3, 448, 448, generator=g)
    bare = "What shape is the red object?"
    prompt = mc_prompt(bare, ["circle", "square", "triangle"])
    kw = dict(num_frames=5, max_new_tokens=2, budget=600)
    for policy in ("auto", "fragment"):
        a = vr.answer(frames, bare, policy=policy, **kw).report
        b = vr.answer(frames, prompt, policy=policy, router_question=bare, **kw).report
        c = vr.answer(frames, prompt, policy=policy, **kw).report
        assert a["policy_probability"] == b["policy_probability"]
        assert a["frame_scores"] == b["frame_scores"]
        assert b["text_tokens"] > a["text_tokens"]                 # the LLM saw the options
        assert (c["policy_probability"], c["frame_scores"]) != \
            (a["policy_probability"], a["frame_scores"])
    with pytest.raises(ValueError, match="router_question"):
        vr.answer(frames, prompt, router_question="  ", **kw)


def test_eval_runs_unchanged_on_qwen(synth_bench, tmp_path, capsys):
    """docs/CONTRACT.md section 7: evaluation works on the second backbone (tiny-qwen2.5-vl, random weights:
    only the plumbing and the budgets are checked, not accuracy)."""
    out = tmp_path / "qwen"
    argv = ["--benchmark", "videomme", "--data", synth_bench["data"], "--videos",
            synth_bench["videos"], "--model", "tiny-qwen2.5-vl", "--methods",
            "uniform,fragment,no-image-router", "--budgets", "512", "--frames", FRAMES,
            "--limit", 2, "--answer-mode", "option-text", "--out", out, "--no-progress",
            "--max-new-tokens", 2]
    status, _, err = run_cli(argv, capsys)
    assert status == 0, err
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 2 * 3
    assert all(0 < p["visual_tokens"] <= 512 for p in preds)
