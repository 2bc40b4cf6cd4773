"""scripts/studies/dense_errors.py: a wrong shape answer is the other target's shape, ``none`` or
another shape; right and wrong answers are counted by question kind."""
import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("dense_errors",
                                              ROOT / "scripts" / "studies" / "dense_errors.py")
de = importlib.util.module_from_spec(spec)
spec.loader.exec_module(de)

OPTS = ["A. circle", "B. none", "C. triangle", "D. square"]
QUESTIONS = {
    "v-1": {"task_type": "Object Recognition", "options": OPTS, "answer": "A"},    # circle
    "v-2": {"task_type": "Object Recognition", "options": OPTS, "answer": "D"},    # square
    "v-3": {"task_type": "Object Reasoning", "options": OPTS, "answer": "B"},      # absent
    "v-4": {"task_type": "Attribute Perception", "options": ["A. gray", "B. black"],
            "answer": "A"},
    "w-1": {"task_type": "Object Recognition", "options": OPTS, "answer": "C"},    # triangle
    "u-1": {"task_type": "Object Recognition", "options": OPTS, "answer": "A"},    # two circles:
    "u-2": {"task_type": "Object Recognition", "options": OPTS, "answer": "A"},    # no binding
}


def _p(qid, letter, said, method="dense"):
    truth = QUESTIONS[qid]["answer"]
    return {"id": qid, "video": qid.split("-")[0] + ".mp4", "method": method,
            "answer": truth, "prediction": letter, "response": said,
            "correct": letter == truth}


def test_wrong_shapes_are_told_apart():
    preds = [_p("v-1", "D", "square"),          # the other target's shape
             _p("v-2", "B", "none"),
             _p("v-3", "B", "none"), _p("v-4", "A", "gray"),
             _p("w-1", "A", "circle"),          # no other target in w: another shape
             _p("v-1", "A", "circle", method="auto")]
    got = de.breakdown(QUESTIONS, preds, "dense")
    assert got == {"absent colour: right": 1, "other: right": 1, "shape: wrong": 3,
                   "shape wrong: the other target's shape": 1, "shape wrong: none": 1,
                   "shape wrong: another shape": 1, "shape, two shapes: wrong": 2,
                   "shape, one shape: wrong": 1}
    assert de.breakdown(QUESTIONS, preds, "auto") == {"shape: right": 1,
                                                      "shape, two shapes: right": 1}


def test_shape_questions_split_by_whether_the_targets_share_their_shape():
    preds = [_p("u-1", "A", "circle"), _p("u-2", "A", "circle"), _p("v-1", "A", "circle"),
             _p("v-2", "A", "circle")]
    got = de.breakdown(QUESTIONS, preds, "dense")
    assert got["shape, one shape: right"] == 2 and got["shape, two shapes: right"] == 1
    assert got["shape, two shapes: wrong"] == 1 and got["shape: right"] == 3


def test_a_run_without_predictions_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="no predictions.jsonl"):
        de.main(["--data", str(tmp_path), "--runs", str(tmp_path), "--out", "x.json"])
    (tmp_path / "predictions.jsonl").write_text(json.dumps(_p("v-1", "A", "circle")) + "\n")
    with pytest.raises(SystemExit, match="no .parquet"):
        de.main(["--data", str(tmp_path), "--runs", str(tmp_path), "--out", "x.json"])
