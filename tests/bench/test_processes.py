"""bench.harness.processes: a benchmark in fresh processes (run here in-process to stay fast),
their results read back in order, a failure named in one line, and rows merged with their
spread; bench.harness.targets and .compare, the other pieces a benchmark states its goals and
comparisons with."""
import json
import sys

import pytest

from bench.harness import processes
from bench.harness.compare import alternate, first_call_s
from bench.harness.processes import merge_rows, run_processes
from bench.harness.targets import meets


def _fake_child(log):
    def run(cmd):
        log.append(cmd)
        out = cmd[cmd.index("--out") + 1]
        with open(out, "w") as f:
            json.dump({"argv": cmd[3:cmd.index("--out")], "i": len(log)}, f)
        return 0
    return run


def test_each_process_is_a_fresh_interpreter_running_the_module(monkeypatch):
    log = []
    monkeypatch.setattr(processes, "run_child", _fake_child(log))
    got = run_processes("bench.scripts.bench_x", [("process 1 of 2", ["--a", "1"]),
                                                  ("process 2 of 2", ["--a", "2"])])
    assert [g["argv"] for g in got] == [["--a", "1"], ["--a", "2"]] and [g["i"] for g in got] == [1, 2]
    assert all(c[:3] == [sys.executable, "-m", "bench.scripts.bench_x"] for c in log)
    assert processes.child_command("m", ["x"]) == [sys.executable, "-m", "m", "x"]


def test_a_failed_process_stops_the_run_in_one_line(monkeypatch):
    monkeypatch.setattr(processes, "run_child", lambda cmd: 3)
    with pytest.raises(SystemExit, match=r"^bench_x: process 1 of 2 failed \(exit 3\)"):
        run_processes("bench.scripts.bench_x", [("process 1 of 2", []), ("process 2 of 2", [])])


def test_an_out_flag_of_the_scripts_choosing(monkeypatch):
    log = []

    def run(cmd):
        log.append(cmd)
        with open(cmd[cmd.index("--child") + 1], "w") as f:
            f.write("{}")
        return 0
    monkeypatch.setattr(processes, "run_child", run)
    assert run_processes("m", [("one", [])], out_flag="--child") == [{}]
    assert "--child" in log[0] and "--out" not in log[0]


def test_merged_rows_take_the_median_and_the_spread():
    rows = [dict(k="a", median_ms=m, host_ms=h, q20_ms=0.1) for m, h in ((1.0, 0.1), (1.25, None), (1.1, 0.3))]
    rows += [dict(k="b", median_ms=2.0, host_ms=None, q20_ms=0.1)]
    a, b = merge_rows(rows, ("k",), medians=("host_ms",), drop=("q20_ms",))
    assert a["median_ms"] == pytest.approx(1.1) and a["per_process_ms"] == [1.0, 1.25, 1.1]
    assert a["processes"] == 3 and a["spread"] == pytest.approx(0.25) and "q20_ms" not in a
    assert a["host_ms"] == pytest.approx(0.2) and b["host_ms"] is None and b["spread"] == 0.0


def test_a_figure_against_its_goal():
    assert meets("fwd: {value} of copy", 0.93, 0.9) == "fwd: 93% of copy (target >= 90%): met"
    assert meets("spread {value}", 0.25, 0.1, at_least=False).endswith("(target <= 10%): NOT met")
    assert meets("{value} vs x", 1.25, 1.3, fmt="{:.1f}x") == "1.2x vs x (target >= 1.3x): NOT met"
    assert meets("{value}", None, 1.0).endswith("NOT met")


def test_two_ways_alternate_in_blocks():
    order = []
    ta, tb = alternate(lambda: order.append("a"), lambda: order.append("b"), rep=10, block=5, warm=1)
    assert order[:2] == ["a", "b"] and order[2:] == ["a"] * 5 + ["b"] * 5 + ["a"] * 5 + ["b"] * 5
    assert ta.samples == tb.samples == 10
    assert first_call_s(lambda: None) >= 0
