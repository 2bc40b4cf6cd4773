"""bench/scripts/bench_decode.py at its smallest on CPU: every mode runs, the static path's tokens are
the dynamic path's, and the results files name device, versions and command."""
import json

import pytest



def test_cpu_smoke(tmp_path):
    from bench.scripts import bench_decode
    out = tmp_path / "decode.json"
    assert bench_decode.main(["--cpu", "--shape", "tiny", "--prompt-tokens", "48",
                              "--new-tokens", "3", "--runs", "1", "--warmup", "0",
                              "--batch-sizes", "1,2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["label"].startswith("CPU figures") and doc["environment"]["torch"]
    rows = {(r["mode"], r["batch"]): r for r in doc["rows"]}
    assert set(rows) == {("dynamic", 1), ("static", 1), ("dynamic", 2), ("static", 2)}
    for r in rows.values():
        assert not r.get("error") and r["tokens_equal_dynamic"] is True and r["ms_per_token"] > 0
    assert "ms/token" in out.with_suffix(".md").read_text()


def test_graph_modes_refused_on_cpu():
    from bench.scripts import bench_decode
    with pytest.raises(SystemExit):
        bench_decode.parse(["--cpu", "--modes", "graph"])
