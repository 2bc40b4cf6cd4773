"""bench/scripts/bench_ask_one_shot.py without running the command: what counts as the same answer, and the
import tree read from -X importtime (a module after its imports, the chain of importers)."""
import subprocess

import pytest

from bench.scripts import bench_ask_one_shot as ask_one_shot


def test_timings_and_memory_do_not_decide_sameness():
    a = {"text": "square", "report": {"frame_indices": [0, 1], "timings_s": {"ttft": 1.0},
                                      "peak_memory_bytes": 5, "windows": [1, 4]}}
    b = {"text": "square", "report": {"frame_indices": [0, 1], "timings_s": {"ttft": 9.0},
                                      "peak_memory_bytes": 7, "windows": [1, 4]}}
    assert ask_one_shot.decision(a) == ask_one_shot.decision(b)
    b["report"]["windows"] = [4, 1]
    assert ask_one_shot.decision(a) != ask_one_shot.decision(b)


def test_import_tree_names_the_chain_that_pulled_a_module_in(monkeypatch):
    err = "\n".join([
        "import time: self [us] | cumulative | imported package",
        "import time:       500 |     900000 |       torch._dynamo",
        "import time:       100 |     950000 |     transformers.masking_utils",
        "import time:       100 |    2000000 |   transformers.models.qwen2.modeling_qwen2",
        "import time:       100 |    3000000 | transformers",
    ])
    done = subprocess.CompletedProcess([], 0, stdout="", stderr=err)
    monkeypatch.setattr(ask_one_shot, "ask_once", lambda tree, extra=(): (0.0, 0.0, done))
    rows = {r["module"]: r for r in ask_one_shot.import_tree("unused")}
    assert rows["torch._dynamo"]["cumulative_s"] == pytest.approx(0.9)
    assert rows["torch._dynamo"]["imported_by"] == (
        "transformers.masking_utils <- transformers.models.qwen2.modeling_qwen2 <- transformers")
    assert rows["transformers"]["imported_by"] == ""
