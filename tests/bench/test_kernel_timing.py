"""The kernel-timing method for figures that must hold across processes (bench/common.time_kernel)
and bench_pool_pack's --processes mode, on CPU (graph replay is GPU-only; its skip is checked
here, its use by -m gpu)."""
import importlib.util
import json
import pathlib
import subprocess
import sys
import time

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "bench" / "scripts"), str(ROOT / "bench")]

import common  # noqa: E402


def _bench():
    spec = importlib.util.spec_from_file_location("bench_pool_pack", ROOT / "bench" / "scripts" / "bench_pool_pack.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_time_kernel_warms_rotates_and_says_how_it_timed():
    calls = []
    fns = [lambda i=i: (calls.append(i), time.sleep(0.0005)) for i in range(3)]
    t0 = time.perf_counter()
    t = common.time_kernel(fns, device="cpu", rep=7, warm_s=0.03)
    assert time.perf_counter() - t0 >= 0.03
    assert t.extra["warm"]["seconds"] >= 0.03 and t.extra["warm"]["calls"] >= 3
    timed = calls[-7:]  # the reps rotate through every set in turn
    assert timed == [0, 1, 2, 0, 1, 2, 0]
    assert t.samples == 7 and t.median >= 0.0005 and t.q20 <= t.median <= t.q80
    assert t.extra["rotation"] == 3 and t.extra["timed_by"] == "host clock (CPU)"
    assert t.extra["graph_ms"] is None and "CPU" in t.extra["graph_note"]
    assert t.extra["events_ms"] is None and t.extra["host_ms"] == pytest.approx(t.median * 1e3)


def test_time_kernel_setup_runs_before_every_call_and_disables_graphs():
    seen = []
    state = {}
    t = common.time_kernel([lambda: seen.append(state["i"])], device="cpu", rep=4, warm_s=0.0,
                           setup=lambda i: state.__setitem__("i", i))
    assert seen[-4:] == [0, 1, 2, 3] and t.samples == 4
    with pytest.raises(ValueError, match="at least one"):
        common.time_kernel([], device="cpu")


def test_rotation_count_covers_twice_the_cache(monkeypatch):
    monkeypatch.setattr(common, "cache_bytes", lambda device=None: 50 * 2**20)
    assert common.rotation_count(10 * 2**20) == 10        # 10 sets x 10 MiB = 2 x 50 MiB
    assert common.rotation_count(30 * 2**20) == 4         # ceil(100 / 30)
    assert common.rotation_count(500 * 2**20) == 2        # always at least two sets
    assert common.rotation_count(1) == common.MAX_ROTATION
    with pytest.raises(ValueError, match="set_bytes"):
        common.rotation_count(0)
    monkeypatch.undo()
    assert common.cache_bytes("cpu") > 0


def test_spread_is_max_over_min_minus_one():
    assert common.spread([0.057, 0.175]) == pytest.approx(0.175 / 0.057 - 1)
    assert common.spread([2.0]) == 0.0
    assert common.spread([1.0, 1.1, 1.05]) == pytest.approx(0.1)


def _row(method, direction, ms, nbytes=2_000_000, host=0.01):
    return dict(T=8, D=128, mix="paper", dir=direction, method=method, median_ms=ms, q20_ms=ms,
                q80_ms=ms, gbps=nbytes / ms / 1e6, bytes=nbytes, host_ms=host, copy_frac=0.123)


def test_merge_processes_takes_median_and_spread_and_recomputes_copy_fraction():
    bpp = _bench()
    payloads = [{"results": [_row("copy", "fwd", 1.0), _row("kernel", "fwd", a)]} for a in (1.0, 1.25, 1.1)]
    rows = {r["method"]: r for r in bpp.merge_processes(payloads)}
    k = rows["kernel"]
    assert k["per_process_ms"] == [1.0, 1.25, 1.1] and k["processes"] == 3
    assert k["median_ms"] == pytest.approx(1.1) and k["spread"] == pytest.approx(0.25)
    assert k["gbps"] == pytest.approx(2_000_000 / 1.1e-3 / 1e9)
    assert k["copy_frac"] == pytest.approx(1.0 / 1.1)       # from the merged medians
    assert rows["copy"]["spread"] == 0.0 and "copy_frac" not in rows["copy"]
    sp = bpp.speedups(list(rows.values()))
    assert sp[0]["spread"] == pytest.approx(0.25)
    verdict = bpp.check_targets([dict(sp[0], T=64, D=3584)])
    assert any("spread over 3 processes 25%" in v and "NOT met" in v for v in verdict)


def test_processes_mode_runs_fresh_processes_with_the_same_cases(tmp_path, monkeypatch):
    """The parent's command lines are complete: each child (run here in-process instead of in a
    fresh interpreter, to stay fast) measures the same case and the parent merges their files."""
    bpp = _bench()
    cmds = []

    def fake_run(cmd, env):
        cmds.append(cmd)
        assert cmd[0] == sys.executable and cmd[1].endswith("bench_pool_pack.py")
        assert str(ROOT) in env["PYTHONPATH"].split(":")
        bpp.main(cmd[2:])
        return 0

    monkeypatch.setattr(bpp, "_run_child", fake_run)
    out = tmp_path / "pp.json"
    payload = bpp.main(["--quick", "--rep", "2", "--warm-ms", "1", "--methods", "copy",
                        "--processes", "3", "--out", str(out)])
    assert len(cmds) == 3 and all("--processes" in c and c[c.index("--processes") + 1] == "1" for c in cmds)
    assert all(c[c.index("--methods") + 1] == "copy" and "--quick" in c for c in cmds)
    data = json.loads(out.read_text())
    assert data["processes"] == 3 and len(data["process_files"]) == 3
    assert all((tmp_path / f).exists() for f in data["process_files"])
    assert {r["method"] for r in data["results"]} == {"copy"}
    for r in data["results"]:
        assert r["processes"] == 3 and len(r["per_process_ms"]) == 3 and r["spread"] >= 0
    assert "spread" in (tmp_path / "pp.md").read_text()
    assert payload["results"] == data["results"]


def test_processes_mode_stops_on_a_failed_child(tmp_path, monkeypatch):
    bpp = _bench()
    monkeypatch.setattr(bpp, "_run_child", lambda cmd, env: 3)
    with pytest.raises(SystemExit, match="process 1 of 3 failed"):
        bpp.main(["--quick", "--processes", "3", "--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("argv, msg", [(["--processes", "0"], "--processes"),
                                       (["--methods", "kernel,fast"], "--methods"),
                                       (["--warm-ms", "-1"], "--warm-ms"), (["--rep", "0"], "--rep")])
def test_bad_arguments_fail_in_one_line(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        _bench().main(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_time_kernel_on_cuda_times_graph_replays_and_host_apart():
    n = 8 * 2**20
    pairs = [(torch.randn(n, device="cuda"), torch.empty(n, device="cuda")) for _ in range(3)]
    t = common.time_kernel([lambda s=s, d=d: d.copy_(s) for s, d in pairs], device="cuda", rep=10, warm_s=0.2)
    assert t.extra["timed_by"] == "cuda-graph replay" and t.extra["graph_ms"] > 0
    assert t.extra["events_ms"] > 0 and t.extra["host_ms"] > 0
    assert t.extra["warm"]["seconds"] >= 0.2


def _script_commands(name):
    """The command lines of gpu_run.sh that run ``name`` (continuations joined)."""
    text = (ROOT / "bench" / "gpu_run.sh").read_text().replace("\\\n", " ")
    cmds = []
    for line in text.splitlines():
        if f"bench/scripts/{name}" in line and line.strip().startswith("stage "):
            words = line.split(f"bench/scripts/{name}", 1)[1].replace('"$W', '"/tmp/x').split()
            cmds.append([w.strip('"').rstrip(";") for w in words if w not in (";;",)])
    return cmds


def test_gpu_script_kernels_and_cold_stages_parse(monkeypatch):
    import bench_cold_start
    bpp = _bench()
    seen = []
    monkeypatch.setattr(bpp, "run_processes", lambda args, methods: seen.append(args) or {})
    (kernels,) = _script_commands("bench_pool_pack.py")
    bpp.main(kernels)
    assert seen[0].processes == 3 and seen[0].warm_ms >= 200 and seen[0].no_sweep
    colds = _script_commands("bench_cold_start.py")
    assert {bench_cold_start.parse_args(c).shape for c in colds} == {"tiny", "8b"}
    r = subprocess.run(["bash", str(ROOT / "bench" / "gpu_run.sh"), "nope"], capture_output=True, text=True)
    assert r.returncode == 2 and "extra" in r.stderr
