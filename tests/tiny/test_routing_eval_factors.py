"""routing-eval on task-v2 data (issue 23): per-line frame counts, a quarter-of-dense budget, the
AUC against every other target, per-factor rows with the issue's goals, the markdown table, and
per-line T through the training data path (data.py, features.py, loop.py)."""
import json
import os
from types import SimpleNamespace

import pytest
import torch

from vr_tiny import routing_eval
from vr_runtime.data import synthetic_videos as syn


@pytest.fixture(scope="module")
def v2_split(tmp_path_factory):
    """The held-out settings base, aspect 16:9, n_targets 1 and 3, frames 16/8, one video each
    (written for real: the stub router reads the labels, the real one decodes them)."""
    root = tmp_path_factory.mktemp("v2")
    settings = syn.heldout_settings()
    paths = syn.write_dataset(str(root), len(settings), seed=2, split="heldout", task="v2")
    keep = {0: "base"}
    for i, (varies, f) in enumerate(settings):
        if (varies, f[varies] if varies != "base" else None) in (
                ("aspect", "16:9"), ("n_targets", 1), ("n_targets", 3), ("frames", "16/8")):
            keep[i] = varies
    names = {f"heldout/heldout_v2_{i:05d}.mp4" for i in keep}
    lines = [json.loads(x) for x in open(paths["conversations"])]
    out = root / "subset_conversations.jsonl"
    out.write_text("".join(json.dumps(x) + "\n" for x in lines if x["video"] in names))
    return {"root": str(root), "conversations": str(out), "lines": lines, "names": names}


class StubRouter:
    """A VideoRouter stand-in whose Image Router scores are fixed by the labels: 0.9 on the
    queried target's frames, 0.95 on the frames of one 'salient' target (whatever the
    question), 0.1 elsewhere; answers are always right; it records the budgets it was given."""

    def __init__(self, lines):
        self.routers = SimpleNamespace(config=SimpleNamespace(threshold=0.5, router_pool=1))
        self.lm = SimpleNamespace(grid=(16, 16))
        self.calls = []
        self.labels, self.answers, self.salient = {}, {}, {}
        for x in lines:
            q = x["conversations"][0]["value"].replace("<video>\n", "")
            key = (x["video"], q)
            self.answers[key] = x["conversations"][1]["value"]
            if "frame_labels" in x:
                self.labels[key] = x["frame_labels"]
                if x["category"] == "object_shape" and x["video"] not in self.salient:
                    self.salient[x["video"]] = x["frame_labels"]   # the first target

    def _key(self, video, question):
        name = os.path.join(*video.split(os.sep)[-2:])
        return name, question

    def answer(self, video, question, **kw):
        self.calls.append(kw)
        key = self._key(video, question)
        y = self.labels.get(key, [0] * kw["num_frames"])
        sal = self.salient.get(key[0], [0] * len(y))
        scores = [0.9 if a else 0.95 if b else 0.1 for a, b in zip(y, sal)]
        relevant = [s > 0.5 for s in scores]
        report = {"frame_scores": scores, "policy": "fragment" if key in self.labels else "global",
                  "windows": [1 if r else 4 for r in relevant]}
        return SimpleNamespace(text=self.answers[key], report=report)

    def clear_visual_cache(self):
        pass


def test_v2_metrics_per_factor_with_auc_against_every_other_target(v2_split):
    vr = StubRouter(v2_split["lines"])
    m = routing_eval.eval_routing(vr, v2_split["conversations"],
                                  budget_fraction=routing_eval.QUARTER)
    assert m["videos"] == 5
    # every call used the line's own T and a quarter of its dense tokens
    for kw in vr.calls:
        assert kw["budget"] == kw["num_frames"] * 256 // 4
    assert {kw["num_frames"] for kw in vr.calls} == {16, 8}
    assert m["num_frames"] == [8, 16] and m["budget"]["fraction_of_dense"] == 0.25
    bf = m["by_factor"]
    assert set(bf) == set(syn.FACTORS)
    # the base video is the base value's row of every factor; a varied video only its own
    assert bf["aspect"]["1:1"]["videos"] == 1 and bf["aspect"]["16:9"]["videos"] == 1
    assert set(bf["aspect"]) == {"1:1", "16:9"} and set(bf["codec"]) == {"h264"}
    assert set(bf["n_targets"]) == {"1", "2", "3"} and set(bf["frames"]) == {"16/16", "16/8"}
    # one target: no other target to compare with
    one = bf["n_targets"]["1"]
    assert one["auc_queried_vs_other_target"] is None
    assert one["goals"]["auc_queried_vs_other_target"]["met"] is None
    # three targets: the first is salient (0.95 on its frames whatever the question), above
    # the queried target's 0.9, so targets 2 and 3 lose against its frames and win against the
    # other one's: the AUC pools every other target's frames (the plain definition below)
    lines = [x for x in v2_split["lines"] if x["factors"]["n_targets"] == 3
             and x["varies"] == "n_targets" and x["video"] in v2_split["names"]]
    tgts = [x["frame_labels"] for x in lines if x["category"] == "object_shape"]
    assert len(tgts) == 3
    want = []
    for i, y in enumerate(tgts):
        sal = tgts[0]
        s = [0.9 if a else 0.95 if b else 0.1 for a, b in zip(y, sal)]
        others = [t for j, o in enumerate(tgts) if j != i for t, v in enumerate(o) if v]
        want.append(routing_eval.auc([s[t] for t, v in enumerate(y) if v], [s[t] for t in others]))
    three = bf["n_targets"]["3"]
    assert three["auc_queried_vs_other_target"] == pytest.approx(sum(want) / 3)
    assert 0 < three["auc_queried_vs_other_target"] < 1   # the third target counts too
    assert three["goals"]["auc_queried_vs_other_target"]["met"] is False
    assert three["answers_auto"] == 1.0 and three["goals"]["answers_auto"]["met"] is True
    # the table: a header, a rule, the overall row and one row per (factor, value)
    table = routing_eval.markdown_table(m).splitlines()
    rows = sum(len(v) for v in bf.values())
    assert len(table) == 3 + rows and table[2].startswith("| overall |")
    assert any(r.startswith("| n_targets | 1 |") and "n/a" in r for r in table)
    assert any(r.startswith("| n_targets | 3 |") and "MISS" in r for r in table)


def test_factor_groups_of_a_random_split_are_marginal():
    f = dict(syn.BASE, aspect="4:3", codec="vp9")
    assert routing_eval.factor_groups({"factors": f}) == [f"{k}={v}" for k, v in f.items()]
    assert routing_eval.factor_groups({"factors": f, "varies": "aspect"}) == ["aspect=4:3"]
    base = {"factors": dict(syn.BASE), "varies": "base"}
    assert len(routing_eval.factor_groups(base)) == len(syn.FACTORS)
    assert routing_eval.factor_groups({}) == []


def test_check_goals_per_row():
    g = routing_eval.check_goals({"image_router_frame_accuracy": 0.97,
                                  "absent_color_frames_marked": 0.6, "answers_auto": 0.89})
    assert g["image_router_frame_accuracy"]["met"] is True       # >= is inclusive
    assert g["absent_color_frames_marked"]["met"] is False
    assert g["answers_auto"]["met"] is False
    assert g["auc_queried_vs_other_target"]["met"] is None


def test_real_router_reads_each_lines_frame_count(v2_split):
    from vr_runtime.runtime import VideoRouter
    vr = VideoRouter.from_pretrained("tiny")
    m = routing_eval.eval_routing(vr, v2_split["conversations"],
                                  budget_fraction=routing_eval.QUARTER, answers=False,
                                  limit_videos=2)
    n = m["image_router_frame_accuracy"]["all"]["n"]
    lines = [x for x in v2_split["lines"] if x["video"] in v2_split["names"]]
    vids = sorted({x["video"] for x in lines})[:2]
    assert n == sum(x["num_frames"] for x in lines if x["video"] in vids and "frame_labels" in x)
    assert "by_factor" in m


def test_cli_defaults_to_a_quarter_on_v2_data_and_checks_the_fraction(v2_split, tmp_path,
                                                                       capsys):
    from vr_tiny.__main__ import main
    assert routing_eval.is_task_v2(v2_split["conversations"])
    assert main(["routing-eval", "--data", v2_split["conversations"], "--budget-fraction", "0",
                 "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--budget-fraction" in err[0]
    assert not (tmp_path / "o.json").exists()


def test_training_path_samples_each_lines_own_frame_count(v2_split, tiny_lm):
    """data.py reads a line's num_frames, FeatureCache samples that T, and one file may mix
    frame counts (loop._num_frames only constrains lines without their own)."""
    from vr_runtime.training.data import DataFormatError, parse_record, read_jsonl
    from vr_runtime.training.features import FeatureCache
    from vr_runtime.training.loop import StageDataset, _num_frames
    rel = os.path.join(v2_split["root"], "heldout_relevance.jsonl")
    ex = [e for e in read_jsonl(rel, "relevance")
          if os.path.join(*e.video.split(os.sep)[-2:]) in v2_split["names"]]
    assert {e.frames for e in ex} == {8, 16}
    cfg = SimpleNamespace(num_frames=16)
    assert _num_frames(cfg, ex) == 16
    cache = FeatureCache(tiny_lm, 16, None)
    ds = StageDataset(ex, 1, tiny_lm.tokenizer, cache)
    for i, e in enumerate(ex):
        assert ds[i]["v"].shape[0] == e.frames == len(e.frame_labels)
    with pytest.raises(DataFormatError, match="num_frames"):
        parse_record({"video": "v.mp4", "question": "q", "answer": "a", "frame_labels": [0, 1],
                      "num_frames": 3}, "relevance", "f.jsonl:1")
    with pytest.raises(DataFormatError, match="num_frames"):
        parse_record({"video": "v.mp4", "question": "q", "policy": 0, "num_frames": 0},
                     "policy", "f.jsonl:1")
    assert torch.equal(cache.get(ex[0].video, ex[0].frames), ds[0]["v"])


@pytest.mark.parametrize("stage", [1, 3])
def test_stages_train_and_evaluate_on_mixed_frame_counts(stage, v2_split, tiny_lm, tmp_path):
    """A v2 file mixes 8- and 16-frame lines: Stage 1 and Stage 3 (with the fraction-of-dense
    budget task v2 trains 3b with) take each line at its own T, in training and evaluation."""
    import sys
    sys.path.insert(0, os.path.dirname(__file__))
    from tiny_helpers import stage_config
    from vr_runtime.training.loop import train
    root = v2_split["root"]
    # the base video (16 frames) and the one sampled at 8
    lines = [json.loads(x) for x in open(v2_split["conversations"])]
    names = {x["video"] for x in lines if x["varies"] in ("base", "frames")}
    data = {}
    for kind in ("relevance", "conversations"):
        lines = [json.loads(x) for x in open(os.path.join(root, f"heldout_{kind}.jsonl"))]
        sub = os.path.join(root, f"mixed_{kind}.jsonl")
        with open(sub, "w") as f:
            f.writelines(json.dumps(x) + "\n" for x in lines if x["video"] in names)
        data[kind] = sub
    extra = dict(plan_from="routers", train_budget_fraction=[0.2, 0.4]) if stage == 3 else {}
    cfg = stage_config(stage, data, tmp_path / "out", eval_data=data["relevance"], eval_limit=0,
                       max_steps=2, per_device_train_batch_size=1, **extra)
    # Stage 3's held-out answers are slow on CPU (no KV cache): its training steps only
    res = train(cfg, lm=tiny_lm, progress=False, evaluate=stage == 1)
    assert res["global_step"] == 2 and len(res["history"]) == 2
    if stage == 1:
        lines = [json.loads(x) for x in open(data["relevance"])]
        assert {x["num_frames"] for x in lines} == {8, 16}
        assert res["metrics"]["frames"] == sum(x["num_frames"] for x in lines)
