"""bench/scripts/bench_pool_pack.py on CPU: a --quick run writes its results (PyTorch paths
only), --processes merges fresh processes (run in-process here to stay fast), --append keeps
the earlier runs, the goals are checked at the paper shape, a bad argument is one line, and the
GPU run's command line parses."""
import json
import pathlib

import pytest
import torch

from bench.harness import processes
from bench.report import pool_pack_report
from bench.scripts import bench_pool_pack as bpp
from bench.scripts import bench_cold_start

ROOT = pathlib.Path(__file__).resolve().parents[2]
QUICK = ["--quick", "--no-compile", "--rep", "2", "--warm-ms", "1"]


def test_quick_run_writes_results(tmp_path):
    out = tmp_path / "pool_pack.json"
    payload = bpp.main(QUICK + ["--out", str(out)])
    data = json.loads(out.read_text())
    env = data["environment"]
    for k in ("device", "date_utc", "torch", "triton", "command"):
        assert env[k]
    assert (tmp_path / "pool_pack.md").exists()
    methods = {r["method"] for r in data["results"]}
    assert {"copy", "llava", "torch"} <= methods
    for r in data["results"]:
        assert r["median_ms"] > 0 and r["bytes"] > 0
    if not torch.cuda.is_available():
        assert "kernel" not in methods
        assert any("need a GPU" in n for n in payload["notes"])


def test_append_keeps_the_earlier_run(tmp_path):
    out = tmp_path / "pp.json"
    for _ in range(2):
        bpp.main(QUICK + ["--methods", "copy", "--out", str(out), "--append"])
    runs = json.loads(out.read_text())["runs"]
    assert len(runs) == 2 and all(r["environment"]["date_utc"] for r in runs)
    assert "## Runs in this file" in (tmp_path / "pp.md").read_text()


def _row(method, direction, ms, nbytes=2_000_000, host=0.01):
    return dict(T=8, D=128, mix="paper", dir=direction, method=method, median_ms=ms, q20_ms=ms,
                q80_ms=ms, gbps=nbytes / ms / 1e6, bytes=nbytes, host_ms=host, copy_frac=0.123)


def test_merge_processes_takes_median_and_spread_and_recomputes_copy_fraction():
    payloads = [{"results": [_row("copy", "fwd", 1.0), _row("kernel", "fwd", a)]} for a in (1.0, 1.25, 1.1)]
    rows = {r["method"]: r for r in bpp.merge_processes(payloads)}
    k = rows["kernel"]
    assert k["per_process_ms"] == [1.0, 1.25, 1.1] and k["processes"] == 3
    assert k["median_ms"] == pytest.approx(1.1) and k["spread"] == pytest.approx(0.25)
    assert k["gbps"] == pytest.approx(2_000_000 / 1.1e-3 / 1e9)
    assert k["copy_frac"] == pytest.approx(1.0 / 1.1)       # from the merged medians
    assert rows["copy"]["spread"] == 0.0 and "copy_frac" not in rows["copy"]
    sp = pool_pack_report.speedups(list(rows.values()))
    assert sp[0]["spread"] == pytest.approx(0.25)
    verdict = pool_pack_report.check_targets([dict(sp[0], T=64, D=3584)], bpp.TARGETS)
    assert verdict[0] == "fwd: 91% of copy bandwidth (target >= 90%): met"
    assert verdict[1] == "fwd: kernel spread over 3 processes 25% (target <= 10%): NOT met"


def test_processes_mode_runs_fresh_processes_with_the_same_cases(tmp_path, children_in_process):
    """The parent's command lines are complete: each child (run here in-process instead of in a
    fresh interpreter) measures the same case and the parent merges their results."""
    cmds = children_in_process(bpp.main)
    out = tmp_path / "pp.json"
    payload = bpp.main(["--quick", "--rep", "2", "--warm-ms", "1", "--methods", "copy",
                        "--processes", "3", "--out", str(out)])
    assert len(cmds) == 3 and all(c[1:3] == ["-m", bpp.MODULE] for c in cmds)
    assert all(c[c.index("--processes") + 1] == "1" and "--quick" in c for c in cmds)
    assert all(c[c.index("--methods") + 1] == "copy" for c in cmds)
    data = json.loads(out.read_text())
    assert data["processes"] == 3 and len(data["per_process"]) == 3
    assert all(p["environment"]["date_utc"] for p in data["per_process"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pp.json", "pp.md"]   # nothing beside
    assert {r["method"] for r in data["results"]} == {"copy"}
    for r in data["results"]:
        assert r["processes"] == 3 and len(r["per_process_ms"]) == 3 and r["spread"] >= 0
    assert "spread" in (tmp_path / "pp.md").read_text()
    assert payload["results"] == data["results"]


def test_processes_mode_stops_on_a_failed_child(tmp_path, monkeypatch):
    monkeypatch.setattr(processes, "run_child", lambda cmd: 3)
    with pytest.raises(SystemExit, match="process 1 of 3 failed"):
        bpp.main(["--quick", "--processes", "3", "--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("argv, msg", [(["--processes", "0"], "--processes"),
                                       (["--methods", "kernel,fast"], "--methods"),
                                       (["--warm-ms", "-1"], "--warm-ms"), (["--rep", "0"], "--rep")])
def test_bad_arguments_fail_in_one_line(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        bpp.main(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err


def _script_commands(name):
    """The argument lists of gpu_run.sh's stages that run ``name`` (continuations joined)."""
    text = (ROOT / "bench" / "gpu_run.sh").read_text().replace("\\\n", " ")
    cmds = []
    for line in text.splitlines():
        if f"-m bench.scripts.{name} " in line and line.strip().startswith("stage "):
            words = line.split(f"bench.scripts.{name}", 1)[1].replace('"$W', '"/tmp/x').split()
            cmds.append([w.strip('"').rstrip(";") for w in words if w not in (";;",)])
    return cmds


def test_gpu_script_kernels_and_cold_stages_parse(monkeypatch):
    seen = []
    monkeypatch.setattr(bpp, "in_processes", lambda args, methods: seen.append(args) or {})
    (kernels,) = _script_commands("bench_pool_pack")
    bpp.main(kernels)
    assert seen[0].processes == 3 and seen[0].warm_ms >= 200 and seen[0].no_sweep
    colds = _script_commands("bench_cold_start")
    assert {bench_cold_start.parse_args(c).shape for c in colds} == {"tiny", "8b"}
