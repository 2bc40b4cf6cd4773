"""Names of the evaluation runner: Evaluator.predict / predict_batch (the pre-1.0 names answer /
answer_batch are gone)."""
from vr_runtime.eval import runner


def test_evaluator_predicts_under_one_name():
    assert hasattr(runner.Evaluator, "predict") and hasattr(runner.Evaluator, "predict_batch")
    assert not hasattr(runner.Evaluator, "answer") and not hasattr(runner.Evaluator, "answer_batch")
