"""The label study (vr_tiny/label_study.py): rule (a)'s labels on the synthetic task against
the generator's, its agreement and AUC against plain counts."""
import json
import random

import pytest
import torch

from vr_runtime.training import labels
from vr_tiny import label_study
from vr_tiny.routing_eval import auc


def test_agreement_and_auc_against_counts():
    a = label_study.agreement([([1, 0, 1, 0], [1, 1, 0, 0]), ([0, 0], [0, 1])])
    assert (a["frames"], a["agreement"], a["precision"], a["recall"]) == (6, 0.5, 0.5, 1 / 3)
    assert a["f1"] == pytest.approx(2 * 0.5 * (1 / 3) / (0.5 + 1 / 3))
    rng = random.Random(0)
    for _ in range(10):
        pos = [rng.choice([0.1, 0.5, rng.random()]) for _ in range(rng.randint(1, 4))]
        neg = [rng.choice([0.1, 0.5, rng.random()]) for _ in range(rng.randint(1, 4))]
        ref = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))
        assert auc(pos, neg) == pytest.approx(ref)
    assert auc([], [1.0]) is None


def test_label_study_keeps_the_generator_labels_next_to_its_own(tmp_path, monkeypatch):
    """The study's counterfactual labels go to their own file; the generator's ground truth
    (Stage 1's control data on the same videos) is left as written. (The tiny model at its
    random fill: the file plumbing is under test, not the labels.)"""
    from vr_runtime import VideoRouter
    from vr_runtime.backbones.tiny import init_weights_

    def random_tiny(cfg):
        vr = VideoRouter.from_pretrained("tiny", dtype=torch.float32, warmup_frames=0)
        init_weights_(vr.lm.model, 0)
        return vr

    monkeypatch.setattr(label_study, "load_router", random_tiny)
    work, results = tmp_path / "study", tmp_path / "study.json"
    cfg = labels.LabelConfig(frames=12, mode="drop", max_set=1, answer_mode="option-text",
                             prompt_style="bare", batch=4)
    label_study.synthetic_mc(str(work), 1, seed=4, frames=12)
    truth = (work / "study_relevance.jsonl").read_text()
    res = label_study.label_study(cfg, str(work), str(results), videos=1, seed=4, command="test")
    assert (work / "study_relevance.jsonl").read_text() == truth
    assert res["relevance_jsonl"] == str(work / "counterfactual_relevance.jsonl")
    lines = [json.loads(x) for x in open(res["relevance_jsonl"])]
    assert len(lines) == res["labelled"] and res["questions"] == 3
    assert res["labelled"] + res["unanswerable"] + res["removed"] == 3
    assert res["settings"]["validate"] == "correct" and sum(res["validation"].values()) == 3
    assert res["evidence_sets_only"]["frames"] == res["labels"]["frames"]
    assert json.load(open(results))["command"] == "test"
