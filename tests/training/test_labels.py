"""Label construction (paper Appendix A, vr_runtime.training.labels): the counterfactual rule on
toy scorers whose answer we know, the greedy set against a plain re-implementation, the
driver on both tiny backbones against direct option_logprobs calls, the A/B probe feeding
policy-labels, and the CLI's errors."""
from vr_runtime.eval.option_scoring import option_logprobs
import itertools
import json
import random

import pytest
import torch

from vr_runtime.training import labels
from vr_tiny.label_study import synthetic_mc   # the synthetic task as a multiple-choice file


def toy(T, evidence, joint=(), correct=0, n_opt=3, off_hides=lambda w: w == 0 or w >= 8):
    """A 'model': the correct option wins (and gains +3 nats) when any ``evidence`` frame is
    visible at full resolution or all ``joint`` frames are; option 1 wins otherwise. A frame at
    window 0 / 8 shows nothing."""
    def score(plans):
        rows = []
        for plan in plans:
            seen = {t for t, w in enumerate(plan) if not off_hides(w)}
            good = bool(seen & set(evidence)) or (bool(joint) and set(joint) <= seen)
            lp = [-4.0] * n_opt
            lp[correct] = -0.2 if good else -3.2
            lp[(correct + 1) % n_opt] = -1.0
            rows.append(lp)
        return torch.tensor(rows)
    return score


@pytest.mark.parametrize("mode", ["drop", "pool8"])
def test_a_frame_the_model_needs_is_labelled(mode):
    res = labels.counterfactual_labels(toy(7, evidence=[4]), 7, 0, mode=mode, margin=0.5)
    assert res["status"] == "ok"
    assert res["necessary"] == [0, 0, 0, 0, 1, 0, 0]
    assert res["minimal_set"] == [4] and res["sufficient"]
    assert res["frame_labels"] == [0, 0, 0, 0, 1, 0, 0]
    assert res["answer_flips"][4] == 1


def test_repeated_evidence_needs_the_minimal_set():
    """Evidence in frames 1 and 5: neither is necessary alone; the greedy set takes one copy."""
    score = toy(6, evidence=[1, 5])
    res = labels.counterfactual_labels(score, 6, 0, margin=0.5, validate="off")
    assert res["necessary"] == [0] * 6
    assert res["minimal_set"] == [1]                    # ties: the earlier frame
    assert res["frame_labels"] == [0, 1, 0, 0, 0, 0] and res["validation"] == "off"
    assert labels.counterfactual_labels(score, 6, 0, margin=0.5, rule="necessary")[
        "frame_labels"] == [0] * 6
    # jointly needed frames: each is necessary and the set holds both
    res = labels.counterfactual_labels(toy(5, evidence=[], joint=[0, 3]), 5, 0, margin=0.5)
    assert res["necessary"] == [1, 0, 0, 1, 0] and sorted(res["minimal_set"]) == [0, 3]


def test_validation_adds_the_evidence_that_survives_masking():
    """The paper's third filter: with frame 1 (the first set) masked, frame 5 still gives the
    answer, so the labels are corrected to hold it too; then masking both loses the answer."""
    res = labels.counterfactual_labels(toy(6, evidence=[1, 5]), 6, 0, margin=0.5)
    assert res["evidence_sets"] == [[1], [5]] and res["validation"] == "corrected"
    assert res["frame_labels"] == [0, 1, 0, 0, 0, 1] and res["minimal_set"] == [1]
    three = labels.counterfactual_labels(toy(9, evidence=[2, 4, 8]), 9, 0, margin=0.5,
                                         rule="minimal-set")
    assert three["evidence_sets"] == [[2], [4], [8]]
    assert three["frame_labels"] == [int(t in (2, 4, 8)) for t in range(9)]
    removed = labels.counterfactual_labels(toy(6, evidence=[1, 5]), 6, 0, margin=0.5,
                                           validate="remove")
    assert removed["status"] == "removed" and removed["frame_labels"] is None
    single = labels.counterfactual_labels(toy(6, evidence=[3]), 6, 0, margin=0.5, validate="remove")
    assert single["validation"] == "passed" and single["frame_labels"] == [0, 0, 0, 1, 0, 0]
    # jointly needed frames: masking both loses the answer at once
    joint = labels.counterfactual_labels(toy(5, evidence=[], joint=[0, 3]), 5, 0, margin=0.5)
    assert joint["validation"] == "passed" and joint["evidence_sets"] == [joint["minimal_set"]]
    # nothing claimed (the answer needs no frame): nothing to validate
    prior = labels.counterfactual_labels(toy(4, evidence=[0, 1, 2, 3], off_hides=lambda w: False),
                                         4, 0, margin=0.5)
    assert prior["frame_labels"] == [0] * 4 and prior["validation"] == "empty"
    with pytest.raises(labels.LabelError, match="validate"):
        labels.counterfactual_labels(toy(4, [1]), 4, 0, validate="fix")
    with pytest.raises(labels.LabelError, match="--validate"):
        labels.check_config(labels.LabelConfig(validate="fix"))


def test_every_plan_is_scored_once():
    """The validation's searches repeat the first search's plans; the memo scores each once and
    ``forwards`` counts the model's passes."""
    seen = []

    def counting(plans):
        seen.extend(tuple(p) for p in plans)
        return toy(8, evidence=[1, 4, 6])(plans)

    res = labels.counterfactual_labels(counting, 8, 0, margin=0.5)
    assert res["frame_labels"] == [int(t in (1, 4, 6)) for t in range(8)]
    assert len(seen) == len(set(seen)) == res["forwards"]


def closure_reference(score, T, c, off, margin):
    """The validated labels written plainly: the first greedy set, then while the answer
    survives with every labelled frame masked, the greedy set of the remaining frames."""
    ref = score([[1] * T])[0]

    def ok(lp):
        return int(lp.argmax()) == c and float(lp[c]) >= float(ref[c]) - margin

    def greedy(masked):
        S = []
        cur = score([[off] * T])[0]
        while not ok(cur):
            best, best_lp = None, None
            for t in range(T):
                if t in S or t in masked:
                    continue
                lp = score([[1 if u in S + [t] else off for u in range(T)]])[0]
                if best is None or float(lp[c]) > float(best_lp[c]):
                    best, best_lp = t, lp
            if best is None:
                return S, False
            S.append(best)
            cur = best_lp
        return S, True

    labels, ok_ = greedy(set())
    if not labels or not ok_:
        return sorted(labels), "empty" if not labels else "insufficient"
    sets = 1
    while ok(score([[off if u in labels else 1 for u in range(T)]])[0]):
        more, found = greedy(set(labels))
        if not more or not found:
            return None, "removed"
        labels, sets = labels + more, sets + 1
    return sorted(labels), "passed" if sets == 1 else "corrected"


@pytest.mark.parametrize("seed", range(8))
def test_validation_matches_the_plain_rule(seed):
    """Random scorers where several frames each carry the answer (repeated evidence, odd T)."""
    rng = random.Random(100 + seed)
    T = rng.choice([5, 7, 9, 11])
    n_opt = rng.randint(2, 4)
    w = torch.tensor([[rng.gauss(0, 1) for _ in range(n_opt)] for _ in range(T)])
    for t in rng.sample(range(T), rng.randint(1, 3)):    # strong, repeated evidence for option 0
        w[t, 0] += 4.0
    bias = torch.tensor([rng.gauss(0, 1) for _ in range(n_opt)])

    def score(plans):
        vis = torch.tensor([[float(x == 1) for x in p] for p in plans])
        return torch.log_softmax(bias + vis @ w, -1)

    c = int(score([[1] * T])[0].argmax())
    for mode, margin in itertools.product(["drop", "pool8"], [0.0, 0.5, 2.0]):
        res = labels.counterfactual_labels(score, T, c, mode=mode, margin=margin,
                                           rule="minimal-set")
        want, how = closure_reference(score, T, c, labels.MODES[mode], margin)
        assert res["validation"] == how
        got = res["frame_labels"]
        assert (got is None and want is None) or [t for t in range(T) if got[t]] == want


def greedy_reference(score, T, c, off, margin, cap):
    """The documented greedy rule, written plainly (one plan per call)."""
    ref = score([[1] * T])[0]

    def ok(lp):
        return int(lp.argmax()) == c and float(lp[c]) >= float(ref[c]) - margin

    S = []
    cur = score([[off] * T])[0]
    while not ok(cur) and len(S) < cap:
        best, best_lp = None, None
        for t in range(T):
            if t in S:
                continue
            lp = score([[1 if u in S + [t] else off for u in range(T)]])[0]
            if best is None or float(lp[c]) > float(best_lp[c]):
                best, best_lp = t, lp
        S.append(best)
        cur = best_lp
    return S, ok(cur)


@pytest.mark.parametrize("seed", range(6))
def test_greedy_set_matches_the_plain_rule(seed):
    """Random additive scorers (odd T): each visible frame adds its own evidence to each
    option; the implementation's set, stop rule and cap equal the plain loop's."""
    rng = random.Random(seed)
    T = rng.choice([3, 5, 7, 9])
    n_opt = rng.randint(2, 4)
    w = torch.tensor([[rng.gauss(0, 1) for _ in range(n_opt)] for _ in range(T)])
    bias = torch.tensor([rng.gauss(0, 1) for _ in range(n_opt)])

    def score(plans):
        vis = torch.tensor([[float(x == 1) for x in p] for p in plans])
        return torch.log_softmax(bias + vis @ w, -1)

    c = int(score([[1] * T])[0].argmax())
    for mode, margin, cap in itertools.product(["drop", "pool8"], [0.0, 0.3], [None, 2]):
        res = labels.counterfactual_labels(score, T, c, mode=mode, margin=margin, max_set=cap)
        S, ok = greedy_reference(score, T, c, labels.MODES[mode], margin, T if cap is None else cap)
        assert res["minimal_set"] == S and res["sufficient"] == ok
        ref = score([[1] * T])[0]
        for t in range(T):
            lp = score([[labels.MODES[mode] if u == t else 1 for u in range(T)]])[0]
            want = int(int(lp.argmax()) != c or float(ref[c] - lp[c]) > margin)
            assert res["necessary"][t] == want


def test_keep_window_sets_the_reference_and_the_set():
    """keep=4: every plan scored keeps its non-ablated frames at 4, never at full resolution; a
    model that only reads the evidence at 4 (and answers wrong at 1) is then labelled."""
    seen_windows = set()

    def at4(plans):          # evidence visible only at window 4 (the tiny model's shortcut)
        seen_windows.update(w for p in plans for w in p)
        return toy(6, evidence=[2], off_hides=lambda w: w != 4)(plans)

    res = labels.counterfactual_labels(at4, 6, 0, mode="pool8", margin=0.5, keep=4)
    assert res["status"] == "ok" and res["frame_labels"] == [0, 0, 1, 0, 0, 0]
    assert seen_windows == {4, 8}
    assert labels.counterfactual_labels(at4, 6, 0, mode="pool8")["status"] == "unanswerable"
    for keep, mode in ((8, "pool8"), (0, "drop"), (2.0, "drop")):
        with pytest.raises(labels.LabelError, match="keep window"):
            labels.counterfactual_labels(at4, 6, 0, mode=mode, keep=keep)
    with pytest.raises(labels.LabelError, match="--keep-window"):
        labels.check_config(labels.LabelConfig(mode="pool8", keep_window=8))


def test_unanswerable_and_argument_checks():
    res = labels.counterfactual_labels(toy(4, evidence=[]), 4, 0)   # option 1 wins with every frame
    assert res["status"] == "unanswerable" and res["frame_labels"] is None
    for kw, msg in (({"mode": "blur"}, "mode"), ({"margin": -1}, "margin"),
                    ({"rule": "x"}, "rule")):
        with pytest.raises(labels.LabelError, match=msg):
            labels.counterfactual_labels(toy(4, [1]), 4, 0, **kw)


# ----------------------------------------------------------------------------- on the backbones
@pytest.fixture(scope="module")
def mc(tmp_path_factory):
    root = tmp_path_factory.mktemp("labels")
    return str(root), synthetic_mc(str(root), 2, seed=3, frames=12)


@pytest.fixture(scope="module", params=["tiny", "tiny-qwen2.5-vl"])
def vr(request):
    from vr_runtime import VideoRouter
    return VideoRouter.from_pretrained(request.param, dtype=torch.float32, warmup_frames=0)


def test_label_frames_on_both_backbones(vr, mc, tmp_path):
    """The driver's decisions equal the rule applied to direct option_logprobs calls; its output
    is a valid Stage 1 relevance file. The question's answer is set to the option the model
    picks with every frame, so the question is answerable by construction."""
    from vr_runtime.eval.prompting import PromptConfig, mc_prompt
    from vr_runtime.training.data import read_jsonl
    root, data = mc
    T = 5                                            # 5 of the 12 frames sampled: odd, fast
    line = json.loads(open(data).readline())
    cfg = labels.LabelConfig(data=data, videos=root, frames=T, mode="pool8", margin=0.05,
                             max_set=2, answer_mode="option-text", prompt_style="bare", batch=3)
    clip = labels.load_clip(vr, f"{root}/{line['video']}", T)
    Z = vr.lm.encode_frames(clip.pixel_values)
    prompt = mc_prompt(line["question"], line["options"],
                       PromptConfig("", "", "option-text", "bare"))
    conts = labels.option_continuations(vr.lm.tokenizer, line["options"], "option-text")
    ref = option_logprobs(vr.lm, Z, prompt, [[1] * T], conts, batch_size=1)[0]
    c = int(ref.argmax())
    (tmp_path / "q.jsonl").write_text(json.dumps({**line, "answer": line["options"][c]}) + "\n")
    cfg.data = str(tmp_path / "q.jsonl")
    out = tmp_path / "flr.jsonl"
    res = labels.label_frames(vr, labels.load_questions(cfg), cfg, str(out),
                              str(tmp_path / "diag.jsonl"))
    d = res["diagnostics"][0]
    assert d["status"] == "ok"
    assert d["reference_logprobs"] == pytest.approx(ref.tolist(), abs=1e-3)
    for t in range(T):
        lp = option_logprobs(vr.lm, Z, prompt, [[8 if u == t else 1 for u in range(T)]], conts,
                                batch_size=1)[0]
        assert d["logprob_drop"][t] == pytest.approx(float(ref[c] - lp[c]), abs=1e-3)
        assert d["necessary"][t] == int(int(lp.argmax()) != c or float(ref[c] - lp[c]) > 0.05)
    ex = read_jsonl(str(out), "relevance")
    assert len(ex) == 1 and ex[0].answer == line["options"][c]
    assert ex[0].frame_labels == [int(a or t in d["minimal_set"])
                                  for t, a in enumerate(d["necessary"])]
    assert json.loads((tmp_path / "diag.jsonl").read_text())["id"] == line["id"]


def test_ab_probe_feeds_policy_labels(mc, tmp_path, capsys):
    """Fixed relevance (the generator's labels): Fragment keeps exactly those frames at full
    resolution; the accuracies file is what policy-labels reads."""
    from vr_runtime import VideoRouter
    from vr_runtime.training.__main__ import main
    root, data = mc
    vr = VideoRouter.from_pretrained("tiny", dtype=torch.float32, warmup_frames=0)
    cfg = labels.LabelConfig(data=data, videos=root, frames=12, answer_mode="option-text",
                             prompt_style="bare")
    qs = labels.load_questions(cfg)
    rel = labels.read_relevance(data)
    acc_path, preds = tmp_path / "ab.jsonl", tmp_path / "preds.jsonl"
    acc = labels.ab_probe(vr, qs, cfg, str(acc_path), rel, budget=1024, predictions=str(preds))
    rows = [json.loads(x) for x in preds.read_text().splitlines()]
    assert len(rows) == len(qs) >= 2
    for r in rows:
        relevant = [t for t, x in enumerate(rel[r["id"]]) if x]
        assert [t for t, s in enumerate(r["fragment"]["windows"]) if s == 1] == relevant
        assert set(r["global"]["windows"]) <= {0, 2}
    cats = {q.id: q.category for q in qs}
    want = {}
    for cat in sorted(set(cats.values())):
        rs = [r for r in rows if cats[r["id"]] == cat]
        want[cat] = (sum(r["global"]["prediction"] == r["answer"] for r in rs) / len(rs),
                     sum(r["fragment"]["prediction"] == r["answer"] for r in rs) / len(rs))
    assert acc == want and "object_shape" in want
    assert main(["policy-labels", "--accuracies", str(acc_path), "--tau", "-1"]) == 0
    assert json.loads(capsys.readouterr().out) == {c: 1 for c in want}
    with pytest.raises(labels.LabelError, match="frame labels"):
        labels.ab_probe(vr, qs, labels.LabelConfig(frames=8), str(acc_path), rel)


@pytest.mark.parametrize("extra, msg", [
    (["frame-labels", "--mode", "pool8", "--margin", "-1"], "--margin"),
    (["frame-labels", "--frames", "0"], "--frames"),
    (["frame-labels", "--model", "/nonexistent"], "--model"),
    (["frame-labels", "--data", "/nonexistent.jsonl"], "/nonexistent.jsonl"),
    (["ab-probe", "--relevance", "MISSING.jsonl"], "MISSING.jsonl"),
    (["ab-probe", "--relevance", "DATA", "--frames", "8"], "frame labels"),
    (["ab-probe", "--budget", "0"], "--budget"),
])
def test_cli_errors_are_one_line(mc, tmp_path, capsys, extra, msg):
    """Bad input: one line, exit 2, nothing written (checked before a model loads)."""
    from vr_runtime.training.__main__ import main
    root, data = mc
    out = tmp_path / "o.jsonl"
    argv = [extra[0], "--data", data, "--videos", root, "--out", str(out), "--frames", "12"]
    argv += [data if x == "DATA" else x for x in extra[1:]]      # later flags win
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and msg in err[0], err
    assert not out.exists()
