"""The pytest-benchmark kernel benchmarks (bench/test_pool_pack_benchmark.py) run here on their
smallest shape with a tiny time budget, so the file cannot rot; the suite itself never collects
bench/ (testpaths), which keeps `pytest -m "not gpu"` fast."""
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_suite_does_not_collect_the_benchmarks():
    import tomllib
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert ini["testpaths"] == ["tests"]
    assert (ROOT / "bench" / "test_pool_pack_benchmark.py").is_file()


def test_benchmark_file_runs_on_the_smoke_shape(tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "bench/test_pool_pack_benchmark.py", "-q",
         "-p", "no:cacheprovider", "-k", "smoke", "--benchmark-only",
         "--benchmark-max-time=0.001", "--benchmark-min-rounds=2", f"--benchmark-json={out}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    data = json.loads(out.read_text())
    rows = {(b["group"], b["extra_info"]["method"]): b for b in data["benchmarks"]}
    # every PyTorch row of both groups (triton: -m gpu; compiled: skipped on CPU, said why)
    assert set(rows) == {(f"{d} smoke-T4-D64-bfloat16", m) for d in ("fwd", "bwd")
                         for m in ("torch", "reference", "copy")}
    for b in rows.values():
        info = b["extra_info"]
        assert info["bytes"] > 0 and info["gbps"] > 0 and b["stats"]["rounds"] >= 2
        assert abs(info["gbps"] - info["bytes"] / b["stats"]["median"] / 1e9) < 1e-3 * info["gbps"] + 1e-3
    assert data["machine_info"]["videorouter"]["label"] == "CPU"
    assert "needs a CUDA device" in r.stdout and "--bench-compile runs it" in r.stdout
