"""`videorouter eval` on Qwen3-VL (tiny-qwen3-vl): the routed methods and budget-resize run
with temporal patches as units, within the budget."""
import json

from eval_helpers import run_cli


def test_eval_on_tiny_qwen3_vl(synth_bench, tmp_path, capsys):
    from vr_runtime.backbones.qwen3_vl import Qwen3VLBackbone
    out = tmp_path / "out"
    status, _, err = run_cli(["--benchmark", "videomme", "--data", synth_bench["data"],
                              "--videos", synth_bench["videos"], "--model", "tiny-qwen3-vl",
                              "--methods", "auto,fragment,uniform,budget-resize",
                              "--budgets", "300", "--frames", 4, "--limit", 2,
                              "--answer-mode", "option-text", "--out", out, "--no-progress",
                              "--max-new-tokens", 1], capsys)
    assert status == 0, err
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert {p["method"] for p in preds} == {"auto", "fragment", "uniform", "budget-resize"}
    assert all(0 < p["visual_tokens"] <= 300 for p in preds)
    # budget-resize: both units (4 frames) at the largest factor-32 size whose tokens fit
    h, w = Qwen3VLBackbone.budget_frame_size(Qwen3VLBackbone.tiny(), 4, 300)
    assert (h, w) == (384, 384)                       # 2 x 12 x 12 = 288 <= 300 < 2 x 13 x 13
    assert all(p["visual_tokens"] == 2 * (h // 32) * (w // 32)
               for p in preds if p["method"] == "budget-resize")
