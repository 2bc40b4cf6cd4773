"""The kernel benchmark runs end to end in --quick mode (on CPU: PyTorch paths only)."""
import importlib.util
import json
import os

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load():
    path = os.path.join(ROOT, "bench", "scripts", "bench_pool_pack.py")
    spec = importlib.util.spec_from_file_location("bench_pool_pack", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_quick_writes_results(tmp_path):
    out = tmp_path / "pool_pack.json"
    payload = _load().main(["--quick", "--no-compile", "--rep", "2", "--out", str(out)])
    data = json.loads(out.read_text())
    env = data["environment"]
    for k in ("device", "date_utc", "torch", "triton", "command"):
        assert env[k]
    assert (tmp_path / "pool_pack.md").exists()
    methods = {r["method"] for r in data["results"]}
    assert {"copy", "llava", "grouped"} <= methods
    for r in data["results"]:
        assert r["median_ms"] > 0 and r["bytes"] > 0
    if not torch.cuda.is_available():
        assert "kernel" not in methods
        assert any("need a GPU" in n for n in payload["notes"])
