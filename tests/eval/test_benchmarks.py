"""Benchmark readers (published layouts from local files), multiple-choice prompting and answer
extraction, and the one-line exit-2 errors (file:line + field) -- no model is loaded."""
import json

import pytest

from eval_helpers import run_cli
from vr_runtime.eval.benchmarks import BenchmarkError, load_benchmark
from vr_runtime.eval.prompting import (PromptConfig, extract_answer, extract_letter,
                                       match_option_text, mc_prompt)


def _videos(tmp_path, *names):
    d = tmp_path / "videos"
    for n in names:
        p = d / n
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"\0")
    return d


VMME = [{"video_id": "001", "duration": "short", "domain": "Knowledge", "sub_category": "Humanity",
         "url": "", "videoID": "abc", "question_id": "001-1", "task_type": "Counting Problem",
         "question": "How many cats?", "options": ["A. 1", "B. 2", "C. 3", "D. 4"],
         "answer": "C"},
        {"video_id": "002", "duration": "long", "domain": "Sports", "sub_category": "Football",
         "url": "", "videoID": "xyz", "question_id": "002-1", "task_type": "Action Reasoning",
         "question": "Who scores?", "options": ["A. red", "B. blue", "C. nobody", "D. both"],
         "answer": "A"}]


def test_videomme_json_and_parquet(tmp_path):
    videos = _videos(tmp_path, "abc.mp4", "xyz.MP4")
    f = tmp_path / "videomme.json"
    f.write_text(json.dumps(VMME, indent=2))
    b = load_benchmark("videomme", f, videos)
    q = b.questions[0]
    assert (q.id, q.question, q.options, q.answer, q.category, q.duration) == (
        "001-1", "How many cats?", ["1", "2", "3", "4"], "C", "Counting Problem", "short")
    assert b.questions[1].video.endswith("xyz.MP4")
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    d = tmp_path / "pq" / "videomme"
    d.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(VMME), str(d / "test-00000-of-00001.parquet"))
    b2 = load_benchmark("videomme", tmp_path / "pq", videos)
    assert [vars(x) | {"where": ""} for x in b2.questions] == \
        [vars(x) | {"where": ""} for x in b.questions]
    assert b2.questions[1].where.endswith("test-00000-of-00001.parquet:row 1")


def test_longvideobench_mlvu_jsonl(tmp_path):
    videos = _videos(tmp_path, "v1.mp4", "1_plotQA/m1.mp4", "j1.mp4")
    lvb = tmp_path / "lvb_val.json"
    lvb.write_text(json.dumps([{"video_path": "v1.mp4", "question": "What next?", "id": "L1",
                                "candidates": ["run", "sit", "jump"], "correct_choice": 2,
                                "duration_group": 600, "question_category": "T3O"}]))
    q = load_benchmark("longvideobench", lvb, videos).questions[0]
    assert (q.id, q.answer, q.options, q.duration, q.category) == \
        ("L1", "C", ["run", "sit", "jump"], "600", "T3O")
    mdir = tmp_path / "mlvu" / "json"
    mdir.mkdir(parents=True)
    (mdir / "1_plotQA.json").write_text(json.dumps([
        {"video": "m1.mp4", "duration": 300, "question": "Who?", "candidates": ["a", "b"],
         "answer": "b", "question_type": "plotQA"}]))
    q = load_benchmark("mlvu", tmp_path / "mlvu", videos).questions[0]
    assert (q.answer, q.category, q.id) == ("B", "plotQA", "1_plotQA-0")
    jl = tmp_path / "q.jsonl"
    jl.write_text(json.dumps({"id": "j", "video": "j1.mp4", "question": "Q?",
                              "options": ["A. x", "B. y"], "answer": "y", "category": "c"}) + "\n")
    q = load_benchmark("jsonl", jl, videos).questions[0]
    assert (q.options, q.answer, q.category) == (["x", "y"], "B", "c")


def test_errors_name_file_line_and_field(tmp_path):
    videos = _videos(tmp_path, "abc.mp4")
    rows = [dict(VMME[0]), dict(VMME[0], question_id="001-2", answer="E")]
    f = tmp_path / "v.json"
    f.write_text(json.dumps(rows, indent=1))
    line = f.read_text().splitlines().index(" {", 2) + 1     # where the second row starts
    with pytest.raises(BenchmarkError, match=rf"v.json:{line}: field 'answer'"):
        load_benchmark("videomme", f, videos)
    f.write_text(json.dumps([dict(VMME[0], options="A. 1")]))
    with pytest.raises(BenchmarkError, match=r"v.json:1: field 'options'"):
        load_benchmark("videomme", f, videos)
    f.write_text(json.dumps([VMME[0], VMME[1]]))             # xyz.mp4 is missing
    with pytest.raises(BenchmarkError, match=r"v.json:1: field 'videoID': video 'xyz'"):
        load_benchmark("videomme", f, videos)
    b = load_benchmark("videomme", f, videos, skip_missing=True)
    assert len(b.questions) == 1 and len(b.skipped) == 1
    jl = tmp_path / "q.jsonl"
    jl.write_text('{"id": "a", "video": "abc.mp4", "question": "q", "options": ["x", "y"], '
                  '"answer": "A"}\n{"id": "b", "video": "abc.mp4"\n')
    with pytest.raises(BenchmarkError, match=r"q.jsonl:2: not valid JSON"):
        load_benchmark("jsonl", jl, videos)


def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys):
    videos = _videos(tmp_path, "abc.mp4")
    f = tmp_path / "v.json"
    f.write_text(json.dumps(VMME))
    base = ["--benchmark", "videomme", "--data", f, "--videos", videos, "--out", tmp_path / "o"]
    for extra, want in ((["--methods", "dense,bogus"], "unknown method 'bogus'"),
                        ([], "field 'videoID': video 'xyz'"),
                        (["--methods", "clip"], "needs --clip"),
                        (["--methods", "data-ft"], "needs --data-ft-model"),
                        (["--budgets", "0"], "--budgets")):
        status, out, err = run_cli(base + extra, capsys)
        assert status == 2, (extra, err)
        assert len(err.strip().splitlines()) == 1 and want in err, (extra, err)
        assert "Traceback" not in err


def test_mc_prompt_and_extraction():
    p = mc_prompt("What shape?", ["circle", "square"])
    assert p == ("What shape?\nA. circle\nB. square\n"
                 "Answer with the option's letter from the given choices directly.")
    assert mc_prompt("Q", ["x", "y"], PromptConfig("Pre: ", "Go.")) == "Pre: Q\nA. x\nB. y\nGo."
    cases = {"B": "B", "(C)": "C", "C.": "C", "The best answer is D": "D",
             "Answer: A) cat": "A", "I think it is B, the dog": "B", "It is": None, "": None,
             "E": None, "b": None}
    for text, want in cases.items():
        assert extract_letter(text, 4) == want, text
    opts = ["circle", "square", "red square"]
    assert match_option_text("Circle.", opts) == "A"
    assert match_option_text("a red square", opts) is None        # two options inside: ambiguous
    assert match_option_text("red square", opts) == "C"
    assert extract_answer("circle", opts, "option-text") == "A"
    assert extract_answer("circle", opts, "letter") is None        # no letter: wrong, not guessed
    assert extract_answer("B", opts, "option-text") == "B"         # falls back to the letter
    assert mc_prompt(" What shape? ", ["x", "y"], PromptConfig(style="bare")) == "What shape?"
    with pytest.raises(ValueError, match="answer-mode"):
        PromptConfig(answer_mode="loglik")
    with pytest.raises(ValueError, match="prompt-style"):
        PromptConfig(style="chat")
