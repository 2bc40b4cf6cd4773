"""``videorouter eval --make-synthetic DIR --synthetic-task needle``: clips and questions the
jsonl benchmark reads, the command that evaluates them, and the accuracy-vs-frames plot."""
import json

import pytest

from vr_runtime.eval import cli as eval_cli
from vr_runtime.eval.benchmarks import load_benchmark
from vr_runtime.eval.synthetic import NEEDLE_METHODS, make_needle, needle_eval_argv
from vr_runtime.eval.methods import parse_methods
from vr_runtime.eval.tables import _table_files, aggregate


def test_make_needle_writes_a_jsonl_benchmark(tmp_path):
    info = make_needle(tmp_path, videos=2, seed=0, minutes=(0.25, 0.3))
    again = make_needle(tmp_path / "b", videos=2, seed=0, minutes=(0.25, 0.3))
    rows = (tmp_path / "needle.jsonl").read_text()
    assert rows == (tmp_path / "b" / "needle.jsonl").read_text()     # deterministic in the seed
    assert info["questions"] == again["questions"] == 6 and info["num_videos"] == 2
    bench = load_benchmark("jsonl", info["data"], info["videos"])
    assert len(bench.questions) == 6
    q = bench.questions[0]
    assert q.question.startswith("What shape is the ") and q.category == "needle"
    assert sorted(q.options) == ["circle", "none", "square", "triangle"]
    first = json.loads(rows.splitlines()[0])
    assert first["event_s"][1] - first["event_s"][0] == 2.0
    argv = needle_eval_argv(info, tmp_path)
    assert argv[argv.index("--methods") + 1] == NEEDLE_METHODS
    assert argv[argv.index("--frames") + 1] == "64,256,1024,2048"
    eval_cli.build_parser().parse_args(argv)        # the printed command parses


def test_the_cli_makes_it_and_prints_the_command(tmp_path, capsys):
    assert eval_cli.main(["--make-synthetic", str(tmp_path), "--synthetic-task", "needle",
                          "--videos-per-split", "1", "--needle-minutes", "0.25,0.25"]) == 0
    out = capsys.readouterr().out
    assert "wrote 3 questions on 1 needle clips" in out and "--benchmark jsonl" in out
    assert (tmp_path / "data" / "needle_000.mp4").is_file()


def test_bad_minutes_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        eval_cli.main(["--make-synthetic", "x", "--synthetic-task", "needle",
                       "--needle-minutes", "20,5"])
    assert e.value.code == 2
    assert "--needle-minutes: expected 0 < LO <= HI" in capsys.readouterr().err


def test_accuracy_vs_frames_plot_with_several_frame_counts(tmp_path):
    def pred(m, f, i):
        return {"id": f"q{i}", "method": m, "budget": 4096, "frames": f, "correct": i < 2,
                "prediction": "A", "answer": "A", "visual_tokens": 1000, "ttft_s": None,
                "ttft_cached_s": None, "policy": "fragment", "category": "needle",
                "duration": "5min", "frames_used": f, "frames_kept": 16,
                "no_relevant_frame": False}
    preds = [pred(m, f, i) for m in ("auto", "uniform") for f in (64, 256) for i in range(3)]
    rows = aggregate(preds, parse_methods("auto,uniform", {}))
    meta = {"benchmark": "jsonl", "model": "tiny", "title": "", "questions": 3, "skipped": 0,
            "prompt_style": "bare", "answer_mode": "option-text", "device_line": "cpu",
            "command": "videorouter eval ..."}
    files = _table_files(tmp_path, {"rows": rows, "meta": meta})
    files[tmp_path / "accuracy_vs_frames.png"](tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    one = [r for r in rows if r["frames"] == 64]
    assert tmp_path / "accuracy_vs_frames.png" not in _table_files(tmp_path, {"rows": one,
                                                                           "meta": meta})
