"""bench/common.py: the one ending (write + print) and the tables every bench script uses."""
import json
import pathlib
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"
sys.path[:0] = [str(BENCH / "scripts"), str(BENCH)]

import common  # noqa: E402


def test_finish_writes_json_and_markdown_and_prints(tmp_path, capsys):
    out = tmp_path / "sub" / "r.json"
    env = common.environment()
    md = "# title\n\n" + common.environment_line(env) + "\n\n" + common.markdown_table(
        [{"a": 1.23456, "b": None}], ["a", "b"])
    assert common.finish(str(out), {"environment": env}, md) == str(out)
    assert json.loads(out.read_text())["environment"]["device"] == env["device"]
    assert (tmp_path / "sub" / "r.md").read_text() == md + "\n"
    printed = capsys.readouterr().out
    assert "| 1.23 | - |" in printed and printed.rstrip().endswith(f"wrote {out}")
    assert not [p for p in (tmp_path / "sub").iterdir() if ".tmp" in p.name]  # no temp file left
    common.finish(str(out), {"x": 1}, md, show=False)
    assert capsys.readouterr().out == f"wrote {out}\n"


def test_markdown_grid_alignment_and_environment_line():
    assert common.markdown_grid(["m", "s"], [["x", "1"]], numbers_right=True) == \
        "| m | s |\n|:--|--:|\n| x | 1 |"
    assert common.markdown_grid(["m"], []) == "| m |\n|---|"
    env = dict(device="D", torch="2", triton="3", date_utc="T", command="c", load_avg_1m=0.5)
    assert common.environment_line(env) == "D; torch 2; T; command: `c`; 1-min load average 0.5"
    assert common.environment_line(env, ("triton",), load=False) == "D; triton 3; T; command: `c`"


def test_report_writes_the_page_the_scripts_wrote_by_hand(tmp_path, capsys):
    """common.report: title, environment line, notes as quotes, then the body; the payload
    starts with environment, label and notes, then the script's own fields."""
    env = dict(device="D", torch="2", date_utc="T", command="c", load_avg_1m=0.5)
    out = tmp_path / "r.json"
    body = ["| a |", "|---|", "", "## More"]
    payload = common.report(str(out), "# Title", env, ["n1", "n2"], body, label="CPU", rows=[1])
    by_hand = ["# Title", "", common.environment_line(env), ""] + ["> n1", "> n2"] + [""] + body
    assert (tmp_path / "r.md").read_text() == "\n".join(by_hand) + "\n"
    assert list(payload) == ["environment", "label", "notes", "rows"]
    assert json.loads(out.read_text())["rows"] == [1]
    common.report(str(out), "# T", env, [], [], label="x", head=["model figures"], show=False)
    assert (tmp_path / "r.md").read_text() == "# T\n\nmodel figures\n"   # trailing blanks trimmed
    assert capsys.readouterr().out.endswith(f"wrote {out}\n")
