"""`videorouter eval` rows as the paper ran them (issue 27): InternVL3* samples floor(B/256)
frames from the video itself; every table shows the frames kept and how often Algorithm 1 found
no relevant frame."""
import csv
import json

from eval_helpers import run_cli


def test_budget_samples_by_context_and_tables_show_frames(synth_bench, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--benchmark", "videomme", "--data", synth_bench["data"], "--videos",
            synth_bench["videos"], "--methods", "budget,budget-subset,no-image-router,auto-literal",
            "--budgets", "512", "--frames", 4, "--limit", 2, "--answer-mode", "option-text",
            "--out", out, "--no-progress", "--max-new-tokens", 1]
    status, _, err = run_cli(argv, capsys)
    assert status == 0, err
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    by = {}
    for p in preds:
        by.setdefault(p["method"], []).append(p)
    # 512 // 256 = 2 frames sampled from the video (not 2 of the 4 sampled)
    assert all(p["frames_used"] == 2 and p["frames_kept"] == 2 for p in by["budget"])
    # decoded on its own, outside the shared visual cache (it would evict the 4-frame state)
    assert all(p["visual_cache"] is None for p in by["budget"])
    assert all(p["frames_used"] == 4 and p["frames_kept"] == 2 for p in by["budget-subset"])
    assert all(p["policy"] == "uniform" for p in by["no-image-router"])
    rows = {r["method"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert rows["budget"]["frames_mean"] == 2.0 and rows["no-image-router"]["frames_mean"] == 4.0
    assert rows["auto-literal"]["no_relevant"] == sum(p["no_relevant_frame"]
                                                      for p in by["auto-literal"])
    head = next(csv.reader((out / "results.csv").open()))
    assert head[8:10] == ["Frames kept", "No relevant"]
