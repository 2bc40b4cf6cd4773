"""Names of the evaluation runner: Evaluator.predict / predict_batch, and their deprecated
aliases answer / answer_batch."""
import pytest

from vr_runtime.eval import runner


def test_evaluator_answer_aliases_warn_and_call_predict(monkeypatch):
    ev = runner.Evaluator(runner.EvalConfig(benchmark="jsonl", data="d", videos="v", out="o",
                                            methods="dense"))
    monkeypatch.setattr(runner.Evaluator, "predict", lambda self, *a: ("predict", a))
    monkeypatch.setattr(runner.Evaluator, "predict_batch", lambda self, *a: ("batch", a))
    with pytest.warns(DeprecationWarning, match="Evaluator.predict"):
        assert ev.answer(1, 2, 3, 4, 5) == ("predict", (1, 2, 3, 4, 5))
    with pytest.warns(DeprecationWarning, match="Evaluator.predict_batch"):
        assert ev.answer_batch(1, [2], 3, 4, 5) == ("batch", (1, [2], 3, 4, 5))
