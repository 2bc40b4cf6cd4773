"""The committed results files: a benchmark's runs are kept in one file, not side by side.

A file that holds several runs holds them one way (bench.harness.results): a ``runs`` list,
oldest first, each run with its own environment (device, date, command, torch); nothing else in
bench/results is named ``runs``; no re-run or per-process file sits beside its benchmark's; and
the figures BENCHMARKS.md cites from the folded files are still in them."""
import json
import pathlib
import re

import pytest

from bench.harness.results import RESULTS, runs_of

FILES = sorted(p for p in RESULTS.rglob("*.json"))
ENVIRONMENT = ("device", "date_utc", "command", "torch")
# What a re-run or a process of one run was once named beside the benchmark's own file
SIDE_BY_SIDE = re.compile(r"_(process\d+|rerun\d*|run\d+|runs\d+|quiet\d*)\.(json|md)$")


def _doc(path: pathlib.Path):
    return json.loads(path.read_text())


def _with_runs():
    return [p for p in FILES if isinstance(_doc(p), dict) and "runs" in _doc(p)]


def test_every_results_file_is_json_and_the_folded_ones_hold_runs():
    assert FILES, RESULTS
    names = {str(p.relative_to(RESULTS)) for p in _with_runs()}
    assert {"deepstack_pack_cpu.json", "ask_one_shot_cpu.json", "cost_model.json",
            "gpu_h100_2026-11-24/pool_pack_gpu.json"} <= names


@pytest.mark.parametrize("path", _with_runs(), ids=lambda p: str(p.relative_to(RESULTS)))
def test_a_file_with_runs_has_one_environment_a_run(path):
    runs = _doc(path)["runs"]
    assert isinstance(runs, list) and len(runs) >= 2, "a runs list holds two runs or more"
    for i, run in enumerate(runs, 1):
        env = run.get("environment") or {}
        missing = [k for k in ENVIRONMENT if not isinstance(env.get(k), str) or not env[k]]
        assert not missing, f"run {i}: environment lacks {missing}"
    dates = [r["environment"]["date_utc"] for r in runs]
    assert dates == sorted(dates), "runs are kept oldest first"


def test_no_rerun_files_side_by_side():
    beside = [str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*")
              if p.is_file() and SIDE_BY_SIDE.search(p.name)]
    assert not beside, beside
    assert not [p for p in RESULTS.rglob("*") if p.is_dir() and p.name.endswith("_runs")]


def test_the_cited_figures_are_in_the_folded_files():
    deepstack = runs_of(_doc(RESULTS / "deepstack_pack_cpu.json"))
    stacked = [round(r["plans"]["global"]["stacked_ms"], 1) for r in deepstack]
    assert stacked == [124.0, 181.5, 27.1, 61.9, 19.9]      # BENCHMARKS.md, DeepStack table
    ask = runs_of(_doc(RESULTS / "ask_one_shot_cpu.json"))
    assert [a["ask"]["median_wall_s"]["/tmp/before"] for a in ask] == [18.315, 20.123]
    cost = runs_of(_doc(RESULTS / "cost_model.json"))
    assert [r["environment"]["load_avg_1m"] for r in cost] == [1.18, 1.35, 2.0, 1.07]
    h100 = runs_of(_doc(RESULTS / "gpu_h100_2026-11-24" / "pool_pack_gpu.json"))[0]
    fracs = {s["dir"]: round(100 * s["copy_frac"]) for s in h100["speedups"]}
    assert fracs == {"fwd": 88, "bwd": 65}


def test_processes_are_inside_their_run():
    for path in (RESULTS / "pool_pack_cpu.json", RESULTS / "gpu_h200_2026-11-28" / "pool_pack_gpu_8b.json"):
        doc = _doc(path)
        assert doc["processes"] == len(doc["per_process"]) == 3
        assert all(p["environment"]["date_utc"] for p in doc["per_process"])
        for row in doc["results"]:
            assert row["per_process_ms"] == [p_row["median_ms"] for p in doc["per_process"]
                                             for p_row in p["results"]
                                             if all(p_row[k] == row[k] for k in ("T", "D", "mix", "dir", "method"))]
