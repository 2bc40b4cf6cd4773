import json

import pytest

from vr_runtime.training.data import DataFormatError, parse_record, read_jsonl
from vr_runtime.training.policy_labels import (label_questions, policy_labels,
                                               read_accuracies)


def _write(path, lines):
    path.write_text("\n".join(l if isinstance(l, str) else json.dumps(l) for l in lines) + "\n")
    return str(path)


def test_three_formats_parse(tmp_path):
    (tmp_path / "v.mp4").write_bytes(b"x")
    rel = _write(tmp_path / "r.jsonl", [{"video": "v.mp4", "question": "Q?", "answer": "a",
                                         "frame_labels": [0, 1, True]}])
    pol = _write(tmp_path / "p.jsonl", [{"video": "v.mp4", "question": "Q?", "policy": "Fragment"},
                                        "", {"video": "v.mp4", "question": "Q2", "policy": 0}])
    conv = _write(tmp_path / "c.jsonl", [{"video": "v.mp4", "conversations": [
        {"from": "human", "value": "<video>\nWhat is it?"}, {"from": "gpt", "value": "a cat"}]}])
    r = read_jsonl(rel, "relevance")[0]
    assert r.frame_labels == [0, 1, 1] and r.video == str(tmp_path / "v.mp4")
    assert [e.policy for e in read_jsonl(pol, "policy")] == [1, 0]
    c = read_jsonl(conv, "conversation")[0]
    assert (c.question, c.answer, c.frame_labels, c.policy) == ("What is it?", "a cat", None, None)
    # a frame-relevance line is a valid Stage 3 example too
    assert read_jsonl(rel, "conversation")[0].answer == "a"


@pytest.mark.parametrize("rec,kind,field", [
    ({"question": "q", "answer": "a", "frame_labels": [0]}, "relevance", "'video'"),
    ({"video": "v.mp4", "question": "", "answer": "a", "frame_labels": [0]}, "relevance", "'question'"),
    ({"video": "v.mp4", "question": "q", "answer": "a", "frame_labels": [0, 2]}, "relevance", "frame_labels[1]"),
    ({"video": "v.mp4", "question": "q", "answer": "a"}, "relevance", "frame_labels"),
    ({"video": "v.mp4", "question": "q", "policy": "sometimes"}, "policy", "'policy'"),
    ({"video": "v.mp4", "question": "q"}, "policy", "policy"),
    ({"video": "v.mp4", "conversations": [{"from": "gpt", "value": "a"}, {"from": "human", "value": "q"}]},
     "conversation", "'human'"),
])
def test_malformed_lines_name_file_line_and_field(tmp_path, rec, kind, field):
    (tmp_path / "v.mp4").write_bytes(b"x")
    path = _write(tmp_path / "d.jsonl", [{"video": "v.mp4", "question": "ok", "answer": "a",
                                          "frame_labels": [1], "policy": 1}, rec])
    with pytest.raises(DataFormatError) as e:
        read_jsonl(path, kind)
    assert f"{path}:2" in str(e.value) and field in str(e.value)


def test_bad_json_and_missing_video(tmp_path):
    path = _write(tmp_path / "d.jsonl", ["{not json"])
    with pytest.raises(DataFormatError, match=r"d.jsonl:1: not valid JSON"):
        read_jsonl(path, "policy")
    path = _write(tmp_path / "e.jsonl", [{"video": "gone.mp4", "question": "q", "policy": 1}])
    with pytest.raises(DataFormatError, match="does not exist"):
        read_jsonl(path, "policy")
    assert parse_record({"video": "gone.mp4", "question": "q", "policy": 1}, "policy", "x").policy == 1


def test_policy_rule_is_strict_margin():
    acc = {"counting": (0.60, 0.70), "summary": (0.70, 0.65), "tie": (0.5, 0.51),
           "ocr": (40.0, 55.0)}
    assert policy_labels(acc, 0.02) == {"counting": 1, "summary": 0, "tie": 0, "ocr": 1}
    assert policy_labels(acc, -0.1)["summary"] == 1
    with pytest.raises(ValueError, match="tau"):
        policy_labels(acc, "0.1")


def test_policy_label_files(tmp_path):
    acc = _write(tmp_path / "ab.jsonl", [{"category": "where", "acc_global": 0.4, "acc_fragment": 0.6},
                                         {"category": "overall", "acc_global": 0.7, "acc_fragment": 0.7}])
    q = _write(tmp_path / "q.jsonl", [{"video": "a.mp4", "question": "Where?", "category": "where"},
                                      {"video": "b.mp4", "question": "Mood?", "category": "overall"}])
    labels = policy_labels(read_accuracies(acc), 0.05)
    out = tmp_path / "p.jsonl"
    assert label_questions(q, labels, str(out)) == 2
    assert [json.loads(l)["policy"] for l in out.read_text().splitlines()] == [1, 0]
    bad = _write(tmp_path / "q2.jsonl", [{"video": "a.mp4", "question": "?", "category": "nope"}])
    with pytest.raises(DataFormatError, match="q2.jsonl:1: category 'nope'"):
        label_questions(bad, labels, str(out))
    dup = _write(tmp_path / "ab2.jsonl", [{"category": "a", "acc_global": 1, "acc_fragment": 1}] * 2)
    with pytest.raises(DataFormatError, match="listed twice"):
        read_accuracies(dup)


def test_policy_labels_command(tmp_path, capsys):
    from vr_runtime.training.__main__ import main
    acc = _write(tmp_path / "ab.jsonl", [{"category": "needle", "acc_global": 0.3, "acc_fragment": 0.5}])
    assert main(["policy-labels", "--accuracies", acc, "--tau", "0.1"]) == 0
    assert json.loads(capsys.readouterr().out) == {"needle": 1}
    bad = _write(tmp_path / "bad.jsonl", [{"category": "x", "acc_global": "high", "acc_fragment": 1}])
    assert main(["policy-labels", "--accuracies", bad, "--tau", "0.1"]) == 2
    assert "acc_global" in capsys.readouterr().err


def test_jsonl_helpers_are_shared_and_training_keeps_its_names(tmp_path):
    """The JSON-lines helpers live in vr_runtime.data.jsonl; training.data re-exports them and
    raises its own DataFormatError (a JsonlError, a ValueError) for a bad line."""
    from vr_runtime.data import jsonl
    from vr_runtime.training import data as training_data
    assert training_data.write_jsonl is jsonl.write_jsonl
    assert issubclass(DataFormatError, jsonl.JsonlError) and issubclass(DataFormatError, ValueError)
    path = tmp_path / "sub" / "x.jsonl"
    jsonl.write_jsonl(str(path), [{"a": 1}, [2]], atomic=True)
    assert path.read_text() == '{"a": 1}\n[2]\n'
    jsonl.write_jsonl(str(path), [{"a": 1}])
    assert [r for _, r in jsonl.iter_jsonl(str(path))] == [{"a": 1}]
    path.write_text('{"a": 1}\n\nnot json\n')
    with pytest.raises(jsonl.JsonlError, match=r"x\.jsonl:3: not valid JSON"):
        list(jsonl.iter_jsonl(str(path)))
    with pytest.raises(DataFormatError, match=r"x\.jsonl:3: not valid JSON"):
        list(training_data.iter_jsonl(str(path)))
    with pytest.raises(DataFormatError, match="no such relevance file"):
        list(training_data.iter_jsonl(str(tmp_path / "none.jsonl"), "relevance"))



def test_training_config_refuses_an_unknown_key_in_one_line(tmp_path):
    from vr_runtime.training.config import CONFIG_DIR, ConfigError, load_config
    out = str(tmp_path / "run")
    new = load_config("stage1", output_dir=out)
    raw = json.loads((CONFIG_DIR / "train_stage1.json").read_text())
    raw["fragment_scales"] = raw.pop("fragment_windows")
    old_file = tmp_path / "old.json"
    old_file.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=r"unknown keys \['fragment_scales'\] \(did you mean "
                                          r"'fragment_windows'\?\)") as e:
        load_config(str(old_file), output_dir=out)
    assert "\n" not in str(e.value)
    assert new.fragment_windows
