"""Intervals on the accuracy tables and `videorouter eval compare` on two small runs built
here (no model): every figure is counted by hand."""
import csv
import io
import json
import math
import shutil

import pytest

from eval_helpers import run_cli


def test_wilson_known_values():
    from vr_runtime.eval.stats import wilson
    lo, hi = wilson(5, 10)
    assert (round(lo, 2), round(hi, 2)) == (23.66, 76.34)
    assert wilson(0, 10) == (0.0, pytest.approx(27.75, abs=0.01))
    assert wilson(10, 10) == (pytest.approx(72.25, abs=0.01), 100.0)
    assert wilson(0, 0) is None
    # one question is 0.7 points at n = 144, but the interval is about +-8
    lo, hi = wilson(67, 144)
    assert (round(lo, 1), round(hi, 1)) == (38.6, 54.7)
    with pytest.raises(ValueError):
        wilson(11, 10)


def test_mcnemar_exact_is_the_binomial_tail():
    from vr_runtime.eval.stats import mcnemar_exact
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(0, 5) == mcnemar_exact(5, 0) == 2 / 32
    assert mcnemar_exact(1, 5) == pytest.approx(2 * (1 + 6) / 64)
    assert mcnemar_exact(3, 3) == 1.0                        # capped, not 2 x 0.66
    # large counts stay exact (integer arithmetic): 2 x P(X <= 400) for X ~ Bin(1000, 1/2)
    p = mcnemar_exact(400, 600)
    assert 0 < p < 1e-9 and p == 2 * sum(math.comb(1000, i) for i in range(401)) / 2 ** 1000


def _pred(qid, method, budget, correct, answer="A", **kw):
    p = {"id": qid, "method": method, "budget": budget, "frames": 4,
         "prediction": answer if correct else "B", "answer": answer, "correct": correct,
         "visual_tokens": 100 if budget else 400, "policy": method, "category": "cat",
         "duration": "short", "video": f"{qid}.mp4"}
    p.update(kw)
    return p


SETTINGS = {"benchmark": "jsonl", "model": "tiny", "prompt_style": "bare",
            "weights": {"model": "0f5a068570ec78a3"}}


def _run(d, preds, settings=SETTINGS):
    d.mkdir()
    (d / "predictions.jsonl").write_text("".join(json.dumps(p) + "\n" for p in preds))
    (d / "settings.json").write_text(json.dumps(settings))
    (d / "results.json").write_text(json.dumps({"rows": [], "meta": {
        "methods": ["dense", "auto"], "model": "tiny", "device": "cpu",
        "date": "2026-11-25 10:50 UTC"}}))
    return d


@pytest.fixture
def two_runs(tmp_path):
    # auto: q1-q8 in both; A right on q1-q6, B right on q1-q2 and q7-q8 -> A only 4 (q3-q6),
    # B only 2 (q7-q8); q9 only in A; q10 failed in B; q11's correct option differs.
    a = [_pred(f"q{i}", "auto", 256, i <= 6) for i in range(1, 9)]
    b = [_pred(f"q{i}", "auto", 256, i <= 2 or i >= 7) for i in range(1, 9)]
    a += [_pred("q9", "auto", 256, True), _pred("q10", "auto", 256, True),
          _pred("q11", "auto", 256, True)]
    b += [_pred("q10", "auto", 256, False, failed="decoder crashed"),
          _pred("q11", "auto", 256, True, answer="C")]
    # dense (budget None) identical in both; a row only B has
    a += [_pred(f"q{i}", "dense", None, i % 2 == 0) for i in range(1, 5)]
    b += [_pred(f"q{i}", "dense", None, i % 2 == 0) for i in range(1, 5)]
    b += [_pred("q1", "auto", 512, True)]
    return _run(tmp_path / "a", a), _run(tmp_path / "b", b)


def test_compare_counts_pairs_and_names_every_unpaired_question(two_runs):
    from vr_runtime.eval.compare import compare
    from vr_runtime.eval.stats import mcnemar_exact
    c = compare(*two_runs)
    rows = {(r["method"], r["budget"]): r for r in c["rows"]}
    assert list(rows) == [("dense", None), ("auto", 256)]   # the run's method order
    r = rows[("auto", 256)]
    assert r["n_paired"] == 8
    assert (r["accuracy_a"], r["accuracy_b"], r["difference"]) == (75.0, 50.0, -25.0)
    assert (r["right_in_a_only"], r["right_in_b_only"]) == (4, 2)
    assert r["mcnemar_p"] == mcnemar_exact(4, 2) == pytest.approx(2 * (1 + 6 + 15) / 64)
    assert r["unpaired"] == {"only_in_a": ["q9"], "only_in_b": [], "failed_in_a": [],
                             "failed_in_b": ["q10"], "answer_differs": ["q11"]}
    d = rows[("dense", None)]
    assert (d["n_paired"], d["difference"], d["mcnemar_p"]) == (4, 0.0, 1.0)
    assert c["rows_only_in_b"] == [{"method": "auto", "budget": 512, "frames": 4}]
    assert c["settings_match"] and c["weights_match"]


def test_compare_cli_prints_table_and_names(two_runs, capsys):
    a, b = two_runs
    status, out, err = run_cli(["compare", a, b], capsys)
    assert status == 0, err
    assert "| auto | 4 | 256 | 8 | 75.0 | 50.0 | -25.0 | 4 | 2 | 0.688 | 3 |" in out
    assert "| dense | 4 | - | 4 | 50.0 | 50.0 | +0.0 | 0 | 0 | 1 | 0 |" in out
    assert "1 only in A: q9" in out and "1 failed in B: q10" in out
    assert "q11" in out and "row only in B: auto B_img 512" in out
    assert "settings: the same" in out and "model the same (0f5a068570ec78a3)" in out
    status, out, err = run_cli(["compare", a, b, "--json"], capsys)
    assert status == 0 and json.loads(out)["rows"][1]["unpaired"]["only_in_a"] == ["q9"]


def test_compare_flags_other_settings_and_weights(tmp_path, capsys):
    preds = [_pred("q1", "auto", 256, True)]
    other = dict(SETTINGS, prompt_style="mc", weights={"model": "ffff000011112222"})
    a, b = _run(tmp_path / "a", preds), _run(tmp_path / "b", preds, other)
    status, out, err = run_cli(["compare", a, b], capsys)
    assert status == 0, err
    assert "settings DIFFER: prompt_style: 'bare' (A) vs 'mc' (B)" in out
    assert "model DIFFER (0f5a068570ec78a3 vs ffff000011112222)" in out
    from vr_runtime.eval.compare import compare
    c = compare(a, b)
    assert not c["settings_match"] and not c["weights_match"]


def test_compare_bad_input_is_one_line(tmp_path, capsys):
    a = _run(tmp_path / "a", [_pred("q1", "auto", 256, True)])
    status, _, err = run_cli(["compare", a, tmp_path / "missing"], capsys)
    assert status == 2 and "no such directory" in err and len(err.strip().splitlines()) == 1
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "predictions.jsonl").write_text('{"id": "q1"}\n')
    status, _, err = run_cli(["compare", a, bad], capsys)
    assert status == 2 and "predictions.jsonl:1: missing field" in err
    assert len(err.strip().splitlines()) == 1


def test_tables_carry_wilson_intervals():
    from vr_runtime.eval.methods import parse_methods
    from vr_runtime.eval.tables import aggregate, csv_text, markdown
    preds = [_pred(f"q{i}", "uniform", 256, i <= 5, category="c1" if i <= 4 else "c2")
             for i in range(1, 11)]
    rows = aggregate(preds, parse_methods("uniform", {}))
    r = rows[0]
    assert (r["correct"], r["n"], r["accuracy"]) == (5, 10, 50.0)
    assert r["accuracy_ci95"] == [23.66, 76.34]
    assert r["by_category_n"] == {"c1": 4, "c2": 6}
    assert r["by_category_ci95"]["c1"] == [51.01, 100.0]          # 4 of 4
    assert r["by_duration_ci95"]["short"] == r["accuracy_ci95"]
    table = list(csv.reader(io.StringIO(csv_text(rows))))
    head = table[0]
    assert head[5] == "Overall" and table[1][5] == "50.0"        # positions as before
    ci = dict(zip(head, table[1]))
    assert (ci["Overall ci95 low"], ci["Overall ci95 high"]) == ("23.7", "76.3")
    assert (ci["c1 ci95 low"], ci["c2 ci95 high"]) == ("51.0", "56.4")    # 1 of 6
    meta = {"benchmark": "b", "model": "m", "questions": 10, "skipped": 0,
            "prompt_style": "bare", "answer_mode": "letter", "device_line": "d",
            "command": "c"}
    md = markdown(rows, meta)
    assert "| 50.0 (23.7-76.3) | 0 | 0 |" in md and "95% Wilson interval" in md


def test_retabulate_adds_intervals_and_keeps_the_rest(tmp_path):
    """The committed quick run, retabulated: every old figure and the meta unchanged."""
    import pathlib
    from vr_runtime.eval.tables import retabulate
    src = pathlib.Path(__file__).resolve().parents[2] / "studies/results/eval_synthetic_quick"
    d = tmp_path / "run"
    d.mkdir()
    for name in ("predictions.jsonl", "results.json"):
        shutil.copy(src / name, d / name)
    before = json.loads((d / "results.json").read_text())
    after = retabulate(d)
    assert after["meta"] == before["meta"]
    for old, new in zip(before["rows"], after["rows"]):
        assert {k: new[k] for k in old} == old and new["accuracy_ci95"]
        assert new["accuracy_ci95"][0] <= new["accuracy"] <= new["accuracy_ci95"][1]
    assert (d / "accuracy_vs_tokens.png").stat().st_size > 5000
    assert "(" in (d / "results.md").read_text().split("| dense |")[1].split("\n")[0]


def test_tiny_dense_row_says_why_it_is_low():
    from vr_runtime.eval.methods import parse_methods
    from vr_runtime.eval.tables import TINY_DENSE_NOTE, aggregate, markdown
    preds = [_pred("q1", "dense", None, False), _pred("q1", "auto", 256, True)]
    rows = aggregate(preds, parse_methods("dense,auto", {}))
    meta = {"benchmark": "b", "model": "tiny", "questions": 1, "skipped": 0,
            "prompt_style": "bare", "answer_mode": "letter", "device_line": "d", "command": "c"}
    assert TINY_DENSE_NOTE in markdown(rows, meta)
    assert TINY_DENSE_NOTE not in markdown(rows, dict(meta, model="path/to/InternVL3-8B-hf"))
    assert TINY_DENSE_NOTE not in markdown(rows[1:], meta)        # no dense row
