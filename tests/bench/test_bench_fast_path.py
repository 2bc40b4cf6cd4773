"""bench/scripts/bench_fast_path.py's CPU dry run (eager modes only, so nothing compiles): every
section runs and writes its results (per-stage ms a frame, TTFT rows with the ratio to Dense,
profile tables), and bad arguments are one argparse line."""
import json

import pytest



def test_cpu_dry_run(tmp_path):
    from bench.scripts import bench_fast_path
    out = tmp_path / "fp.json"
    assert bench_fast_path.main(["--cpu", "--frames", "3", "--ttft-frames", "3",
                                 "--dense-max-frames", "3", "--chunks", "2", "--compile-chunks", "2",
                                 "--runs", "1",
                                 "--warmup", "0", "--vision-modes", "off",
                                 "--router-modes", "off", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["label"].startswith("CPU dry run") and doc["environment"]["torch"]
    assert [r["variant"] for r in doc["vision"]] == ["today (eager, chunks of 16)", "off, chunk 2"]
    assert {r["pool"] for r in doc["router"]} == {1, 2}
    for r in doc["vision"] + doc["router"]:
        assert not r.get("error") and r["ms_per_frame"] > 0
    ttft = {(r["settings"], r["policy"]): r for r in doc["ttft"]}
    assert set(ttft) == {(s, p) for s in ("today", "tuned") for p in ("videorouter", "dense")} \
        | {("tuned-pool2", "videorouter")}
    assert ttft["tuned-pool2", "videorouter"]["router_pool"] == 2
    assert ttft["tuned-pool2", "videorouter"]["ratio_to_dense"] > 0
    row = ttft["today", "videorouter"]
    assert row["ttft_s"] > 0 and row["ratio_to_dense"] > 0 and row["visual_tokens"] > 0
    assert 0 < row["floor_ratio_tokens"] < 1
    for name in doc["profiles"].values():
        assert "Name" in (tmp_path / name).read_text()
    assert "TTFT" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize("argv,msg", [(["--sections", "decode"], "--sections"),
                                      (["--vision-modes", "fast"], "modes"),
                                      (["--router-modes", "cudagraphs"], "cudagraphs needs CUDA"),
                                      (["--tuned", "off,16"], "--tuned"),
                                      (["--sections", "floors"], "give --shape 2b or 8b")])
def test_bad_arguments(argv, msg, capsys):
    from bench.scripts import bench_fast_path
    with pytest.raises(SystemExit):
        bench_fast_path.parse(["--cpu"] + argv)
    assert msg in capsys.readouterr().err


def test_floors_are_model_figures(tmp_path):
    """The floors section builds nothing: VideoRouter's floor under Dense's at 64 frames, lower
    at router_pool 2 (fewer router FLOPs), and no Dense row past --dense-max-frames."""
    from bench.scripts import bench_fast_path
    out = tmp_path / "floors.json"
    assert bench_fast_path.main(["--cpu", "--shape", "8b", "--sections", "floors",
                                 "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["label"].startswith("model figures")
    rows = {(r["policy"], r["frames"], r["router_pool"]): r for r in doc["floors"]}
    assert set(rows) == {("videorouter", 64, 1), ("videorouter", 64, 2), ("dense", 64, 1),
                         ("videorouter", 1024, 1), ("videorouter", 1024, 2)}
    one, two = rows["videorouter", 64, 1], rows["videorouter", 64, 2]
    assert two["floor_ratio_to_dense"] < one["floor_ratio_to_dense"] < 1
    assert one["flops"]["router"] > 2 * two["flops"]["router"] > 0
    assert rows["dense", 64, 1]["visual_tokens"] == 64 * 256
