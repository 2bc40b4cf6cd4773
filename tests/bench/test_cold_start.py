"""bench/scripts/bench_cold_start.py: argument checks, the per-mode summary, and one
run end to end on the tiny model (the child runs in-process here to stay fast; the script
itself starts a fresh interpreter per measurement)."""
import json

import pytest
import torch

from bench.harness import processes
from bench.scripts import bench_cold_start as bcs


@pytest.mark.parametrize("argv, msg", [(["--shape", "70b"], "--shape"), (["--modes", "plain,hot"], "--modes"),
                                       (["--processes", "0"], "--processes"), (["--frames", "0"], "--frames"),
                                       (["--device", "tpu"], "--device"), (["--warmup-frames", "-1"], "--warmup-frames"),
                                       (["--threads", "0"], "--threads")])
def test_bad_arguments_fail_in_one_line(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        bcs.main(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err


def _run(mode, cold, warm, **kw):
    r = dict(mode=mode, import_s=1.0, load_s=2.0, warmup_s=0.5, hook_s=None, cold_ttft_s=cold,
             cold_router_s=0.1, cold_wall_s=cold + 0.1, warm_ttft_s=warm, warm_router_s=0.05,
             warm_wall_s=warm + 0.1)
    r.update(kw)
    return r


def test_summary_is_the_median_per_mode_with_the_cold_spread():
    rows = bcs.summarise([_run("plain", 2.0, 0.5), _run("plain", 3.0, 0.4), _run("plain", 2.5, 0.6),
                          _run("hook", 0.6, 0.5, hook_s=1.5)])
    plain, hook = rows
    assert plain["mode"] == "plain" and plain["processes"] == 3
    assert plain["cold_ttft_s"] == 2.5 and plain["warm_ttft_s"] == 0.5
    assert plain["cold_over_warm"] == pytest.approx(5.0)
    assert plain["cold_ttft_spread"] == pytest.approx(0.5) and plain["hook_s"] is None
    assert hook["hook_s"] == 1.5 and hook["cold_ttft_spread"] == 0.0


def test_tiny_cpu_run_writes_a_labelled_results_file(tmp_path, monkeypatch, children_in_process):
    cmds = children_in_process(bcs.main)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # in-process: keep pytest's threads
    out = tmp_path / "cold.json"
    payload = bcs.main(["--device", "cpu", "--frames", "2", "--max-new-tokens", "1", "--modes", "plain", "--threads", "1",
                        "--out", str(out)])
    assert len(cmds) == 1 and "--child" in cmds[0] and cmds[0][1:3] == ["-m", bcs.MODULE]
    assert cmds[0][cmds[0].index("--threads") + 1] == "1"
    data = json.loads(out.read_text())
    for k in ("device", "date_utc", "torch", "command"):
        assert data["environment"][k]
    assert data["label"] == "CPU" and "CPU figures" in data["notes"][0]
    (row,) = data["results"]
    assert row["mode"] == "plain" and row["warmup_s"] == 0  # CPU: nothing to compile
    for k in ("load_s", "cold_ttft_s", "warm_ttft_s", "cold_router_s"):
        assert row[k] > 0
    (run,) = data["per_process"]
    assert run["cold"]["ttft_s"] == pytest.approx(sum(run["cold"]["timings_s"][k] for k in
                                                      ("vision", "router", "compress", "prefill")), abs=1e-5)
    assert "skipped" in run["kernel_warmup"]
    assert (tmp_path / "cold.md").exists() and payload["results"] == data["results"]


def test_a_failed_process_stops_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(processes, "run_child", lambda cmd: 1)
    with pytest.raises(SystemExit, match="plain process 1 failed"):
        bcs.main(["--device", "cpu", "--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()
