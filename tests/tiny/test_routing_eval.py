"""The held-out routing metrics: the AUC, the targets, the answers' match, the CLI, and a run
on real videos."""
import random

import pytest

from vr_tiny import routing_eval


def brute_auc(pos, neg):
    n = len(pos) * len(neg)
    return sum(1.0 if p > q else 0.5 if p == q else 0.0 for p in pos for q in neg) / n


def test_auc_matches_the_pairwise_definition_with_ties():
    rng = random.Random(0)
    for _ in range(50):
        pos = [rng.choice([0.1, 0.5, 0.9, rng.random()]) for _ in range(rng.randint(1, 5))]
        neg = [rng.choice([0.1, 0.5, 0.9, rng.random()]) for _ in range(rng.randint(1, 5))]
        assert routing_eval.auc(pos, neg) == pytest.approx(brute_auc(pos, neg))
    assert routing_eval.auc([], [0.3]) is None and routing_eval.auc([0.3], []) is None
    assert routing_eval.auc([0.9, 0.8], [0.1]) == 1.0 and routing_eval.auc([0.1], [0.9, 0.8]) == 0.0


def test_check_targets_reads_every_metric_and_compares_both_ways():
    m = {"image_router_frame_accuracy": {"all": {"rate": 0.96}},
         "auc_queried_vs_other_target": {"mean": 0.94},
         "kept_full_res_differ_between_targets": {"rate": 0.9},
         "absent_color_frames_marked": {"mean": 0.6},
         "semantic_router_accuracy": {"phrasing=heldout": {"rate": 1.0}}}
    t = routing_eval.check_targets(m)
    assert t["image_router_frame_accuracy"]["met"] is True
    assert t["auc_queried_vs_other_target"]["met"] is False
    assert t["kept_frames_differ_between_colors"]["met"] is True      # >= is inclusive
    assert t["absent_color_mean_frames_marked"]["met"] is False        # <= 0.5
    assert t["semantic_router_heldout_phrasings"]["met"] is True
    assert t["answers_auto"] == {"value": None, "target": ">= 0.85", "met": None}


def test_an_answer_is_right_as_it_is_or_after_its_color():
    from types import SimpleNamespace
    red = SimpleNamespace(question="What shape is the red object?", answer="circle")
    assert routing_eval.answered("circle", red) and routing_eval.answered(" Red circle.", red)
    assert not routing_eval.answered("blue circle", red)      # another object's color
    assert not routing_eval.answered("red square", red) and not routing_eval.answered("red", red)
    absent = SimpleNamespace(question=red.question, answer="none")
    assert routing_eval.answered("none", absent) and not routing_eval.answered("red none", absent)
    bg = SimpleNamespace(question="What is the background color?", answer="black")
    assert routing_eval.answered("black", bg) and not routing_eval.answered("red black", bg)


def test_routing_eval_on_written_videos(tmp_path):
    from vr_runtime.runtime import VideoRouter
    from vr_runtime.data.synthetic_videos import write_dataset
    paths = write_dataset(str(tmp_path), 2, seed=5, split="heldout")
    vr = VideoRouter.from_pretrained("tiny")
    m = routing_eval.eval_routing(vr, paths["conversations"], limit_videos=2)
    assert m["videos"] == 2
    # every Fragment-category question scored all 16 frames; two targets per video
    frag = m["image_router_frame_accuracy"]["all"]["n"]
    assert frag % 16 == 0 and frag >= 2 * 3 * 16
    assert m["auc_queried_vs_other_target"]["questions"] == 4
    assert m["absent_color_frames_marked"]["n"] == 2
    assert m["answers_auto"]["all"]["n"] == m["answers_forced_correct_frames"]["all"]["n"] >= 8
    assert {"phrasing=train", "phrasing=heldout"} & set(m["semantic_router_accuracy"])
    for v in (m["kept_full_res_differ_between_targets"]["rate"],
              m["answers_auto"]["all"]["rate"]):
        assert 0.0 <= v <= 1.0


def test_cli_checks_arguments_before_loading(tmp_path, capsys):
    from vr_tiny.__main__ import main
    assert main(["routing-eval", "--data", str(tmp_path / "nope.jsonl"),
                 "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such file" in err[0]
    f = tmp_path / "d.jsonl"
    f.write_text("")
    assert main(["routing-eval", "--data", str(f), "--max-length", "0",
                 "--out", str(tmp_path / "o.json")]) == 2
    assert "--max-length" in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()
