"""bench/scripts/bench_long_video.py end to end on a short clip and one frame count: both trees answer
in fresh processes, every stage and the first-token time reach the results, and the markdown
names the device, the date and the command."""
import json
import pathlib

from bench.scripts import bench_long_video as B

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_one_row_before_and_after(tmp_path):
    out = tmp_path / "long.json"
    B.main(["--before", str(ROOT), "--frames", "8", "--minutes", "0.05",
            "--work", str(tmp_path), "--out", str(out)])
    res = json.loads(out.read_text())
    for side in ("before", "after"):
        (row,) = res[side]
        assert "error" not in row, row
        assert row["frames"] == 8 and row["wall_s"] > 0 and row["peak_rss_mb"] > 0
        assert row["first_token"] >= row["ttft"] > 0
    assert res["growth"]["same_at_256"] is None            # no 256-frame row here
    md = (tmp_path / "long.md").read_text()
    assert res["environment"]["device"] in md and "command:" in md
