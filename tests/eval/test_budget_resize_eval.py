"""`videorouter eval --methods budget-resize` (issue 27 item 5, the paper's "Qwen2.5-VL Budget"
row): on tiny-qwen2.5-vl every sampled frame is answered at the largest Qwen smart_resize size
whose tokens fit B, and the table shows its frames and visual tokens; InternVL3 refuses it."""
import csv
import json

from eval_helpers import run_cli

from vr_runtime.backbones.qwen2_5_vl import budget_frame_size


def _argv(synth_bench, out, model, methods):
    return ["--benchmark", "videomme", "--data", synth_bench["data"], "--videos",
            synth_bench["videos"], "--model", model, "--methods", methods, "--budgets", "512",
            "--frames", 4, "--limit", 2, "--answer-mode", "option-text", "--out", out,
            "--no-progress", "--max-new-tokens", 1]


def test_budget_resize_row_on_tiny_qwen(synth_bench, tmp_path, capsys):
    out = tmp_path / "out"
    status, stdout, err = run_cli(_argv(synth_bench, out, "tiny-qwen2.5-vl",
                                        "budget-resize,budget"), capsys)
    assert status == 0, err
    h, w = budget_frame_size(4, 512)
    assert (h, w) == (308, 308)                       # 4 x 11 x 11 = 484 <= 512 < 4 x 12 x 12
    per_frame = (h // 28) * (w // 28)
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    rz = [p for p in preds if p["method"] == "budget-resize"]
    assert len(rz) == 2
    # all 4 frames, each at 11x11 tokens (not 2 frames at 16x16 as `budget` takes)
    assert all(p["frames_used"] == 4 and p["frames_kept"] == 4 and
               p["visual_tokens"] == 4 * per_frame == 484 for p in rz)
    assert all(p["visual_tokens"] == 512 and p["frames_used"] == 2
               for p in preds if p["method"] == "budget")
    rows = {r["method"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert rows["budget-resize"]["frames_mean"] == 4.0
    assert rows["budget-resize"]["visual_tokens_mean"] == 484.0
    line = next(r for r in csv.reader((out / "results.csv").open()) if r[0] == "budget-resize")
    assert "484" in line and "budget-resize" in stdout


def test_budget_resize_refused_on_internvl3_before_loading(synth_bench, tmp_path, capsys,
                                                          monkeypatch):
    from vr_runtime import VideoRouter

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the method was refused")
    monkeypatch.setattr(VideoRouter, "from_pretrained", no_load)
    status, _, err = run_cli(_argv(synth_bench, tmp_path / "out", "tiny", "budget-resize"),
                             capsys)
    assert status == 2
    assert "'budget-resize' cannot run on this model: backbone 'internvl3' (tiny)" in err
    assert "448x448 frames only" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
