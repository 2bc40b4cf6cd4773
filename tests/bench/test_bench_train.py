"""bench/scripts/bench_train.py's CPU dry run at the tiny shape: Stage 3 steps with the fused
pool_pack and with the reference (same first loss), the routers' Stages 1-2, and results files
that name device, versions and command; bad arguments are one argparse line."""
import json

import pytest



def test_cpu_dry_run(tmp_path):
    from bench.scripts import bench_train
    out = tmp_path / "train.json"
    assert bench_train.main(["--cpu", "--shape", "tiny", "--frames", "5", "--steps", "2",
                             "--warmup", "0", "--stages", "3,1,2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["label"].startswith("CPU dry run") and doc["environment"]["torch"]
    rows = {(r["stage"], r["backend"]): r for r in doc["rows"]}
    assert set(rows) == {(3, "kernel"), (3, "reference"), (1, "kernel"), (2, "kernel")}
    for r in rows.values():
        assert not r.get("error") and r["step_s"] > 0 and len(r["steps_s"]) == 2
    assert rows[3, "kernel"]["first_loss"] == rows[3, "reference"]["first_loss"]
    assert rows[3, "kernel"]["visual_tokens_per_step"] == 2 * 256 + 3 * 16
    assert "Visual tokens/s" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize("argv,msg", [(["--shape", "70b"], "--shape"),
                                      (["--stages", "4"], "--stages"),
                                      (["--backends", "fast"], "--backends"),
                                      (["--frames", "4", "--relevant", "9"], "--relevant")])
def test_bad_arguments(argv, msg, capsys):
    from bench.scripts import bench_train
    with pytest.raises(SystemExit):
        bench_train.parse(["--cpu"] + argv)
    assert msg in capsys.readouterr().err
