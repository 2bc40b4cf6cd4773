"""`videorouter eval --batch-size N` (issue 21, item 4): the questions of one video, method and
budget go through `VideoRouter.answer_batch`, and the predictions are those of the one-by-one
path; a bad video's questions are still recorded as failed, and a rerun resumes."""
import json

import pytest

from eval_helpers import failing_decode, run_cli

METHODS = "dense,uniform,auto"
FIELDS = ("answer", "prediction", "response", "visual_tokens", "policy", "frames_used",
          "correct")


def argv_for(bench, out, batch, videos=None):
    return ["--benchmark", "videomme", "--data", bench["data"], "--videos",
            videos or bench["videos"], "--methods", METHODS, "--budgets", "256", "--frames", 2,
            "--answer-mode", "option-text", "--prompt-style", "bare", "--max-new-tokens", 4,
            "--out", out, "--no-progress", "--batch-size", batch]


def preds_of(out):
    return [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]


def keyed(preds):
    return {(p["id"], p["method"], p["budget"]): {k: p.get(k) for k in FIELDS} for p in preds}


@pytest.fixture(scope="module")
def sequential(synth_bench, tmp_path_factory):
    out = tmp_path_factory.mktemp("seq") / "out"
    from vr_runtime.cli import main
    assert main(["eval"] + [str(a) for a in argv_for(synth_bench, out, 1)]) == 0
    return preds_of(out)


def spy_batches(monkeypatch):
    """The sizes of the batches `VideoRouter.answer_batch` is given."""
    from vr_runtime.runtime import VideoRouter
    sizes = []
    real = VideoRouter.answer_batch

    def spy(self, videos, *a, **kw):
        sizes.append(len(list(videos)))
        return real(self, videos, *a, **kw)

    monkeypatch.setattr(VideoRouter, "answer_batch", spy)
    return sizes


def test_batched_predictions_equal_one_by_one(synth_bench, sequential, tmp_path, capsys,
                                              monkeypatch):
    sizes = spy_batches(monkeypatch)
    out = tmp_path / "o"
    status, _, err = run_cli(argv_for(synth_bench, out, 8), capsys)
    assert status == 0, err
    batched = preds_of(out)
    assert sizes and max(sizes) > 1, sizes              # the batched path did run
    assert keyed(batched) == keyed(sequential)
    assert all(1 <= p.get("batch", 1) <= 8 for p in batched)
    assert sum(1 for p in batched if p.get("batch", 1) > 1) == sum(s for s in sizes if s > 1)
    assert all("batch" not in p for p in sequential)    # batch size 1: rows as before


def test_batches_never_mix_methods_budgets_or_videos():
    from vr_runtime.eval.runner import batches

    class Q:
        def __init__(self, i, video):
            self.id, self.video = i, video

    class M:
        def __init__(self, name):
            self.name = name

    a, b = M("uniform"), M("auto")
    todo = ([(Q(i, "v1"), a, 256, 2) for i in range(5)] + [(Q(i, "v1"), b, 256, 2)
                                                            for i in range(2)]
            + [(Q(i, "v1"), b, 512, 2) for i in range(2)] + [(Q(9, "v2"), b, 512, 2)])
    groups = batches(todo, 3)
    assert [len(g) for g in groups] == [3, 2, 2, 2, 1]
    for g in groups:
        assert len({(j[0].video, j[1].name, j[2], j[3]) for j in g}) == 1
    assert [j for g in groups for j in g] == todo        # the order is kept
    assert [len(g) for g in batches(todo, 1)] == [1] * len(todo)


def test_a_bad_video_is_recorded_as_failed_and_retried(synth_bench, sequential, tmp_path,
                                                       capsys, monkeypatch):
    import pathlib

    from vr_runtime.video import stream
    bad_name = sorted(pathlib.Path(synth_bench["videos"]).iterdir())[1].name
    decode = failing_decode(bad_name)

    out = tmp_path / "o"
    argv = argv_for(synth_bench, out, 8)
    with monkeypatch.context() as m:
        m.setattr(stream, "decode_frames", decode)
        status, stdout, err = run_cli(argv, capsys)
    assert status == 0, err
    preds = preds_of(out)
    failed = [p for p in preds if p.get("failed")]
    assert failed and all(p["video"] == bad_name and "frame 7" in p["failed"] for p in failed)
    assert len(preds) == len(sequential)                 # every question is recorded
    ref = keyed(sequential)
    assert all(v == ref[k] for k, v in keyed(p for p in preds if not p.get("failed")).items())
    status, stdout, err = run_cli(argv, capsys)          # the rerun retries and answers them
    assert status == 0, err
    assert keyed(preds_of(out)) == keyed(sequential)


def test_batch_size_must_be_positive(synth_bench, tmp_path, capsys):
    status, _, err = run_cli(argv_for(synth_bench, tmp_path / "o", 0), capsys)
    assert status == 2
    assert err.strip().splitlines()[-1].endswith("--batch-size: expected >= 1, got 0")
