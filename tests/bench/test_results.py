"""bench.harness results files, tables and environment: the one ending every script uses
(write + print), the page most scripts write, and runs appended to one file."""
import json
import sys

from bench.harness import env as henv
from bench.harness.env import environment, environment_line
from bench.harness.results import finish, report, runs_of, runs_table, with_run, write_results
from bench.harness.tables import markdown_grid, markdown_table


def test_finish_writes_json_and_markdown_and_prints(tmp_path, capsys):
    out = tmp_path / "sub" / "r.json"
    env = environment()
    md = "# title\n\n" + environment_line(env) + "\n\n" + markdown_table(
        [{"a": 1.23456, "b": None}], ["a", "b"])
    assert finish(str(out), {"environment": env}, md) == str(out)
    assert json.loads(out.read_text())["environment"]["device"] == env["device"]
    assert (tmp_path / "sub" / "r.md").read_text() == md + "\n"
    printed = capsys.readouterr().out
    assert "| 1.23 | - |" in printed and printed.rstrip().endswith(f"wrote {out}")
    assert not [p for p in (tmp_path / "sub").iterdir() if ".tmp" in p.name]  # no temp file left
    finish(str(out), {"x": 1}, md, show=False)
    assert capsys.readouterr().out == f"wrote {out}\n"


def test_markdown_grid_alignment_and_environment_line():
    assert markdown_grid(["m", "s"], [["x", "1"]], numbers_right=True) == \
        "| m | s |\n|:--|--:|\n| x | 1 |"
    assert markdown_grid(["m"], []) == "| m |\n|---|"
    env = dict(device="D", torch="2", triton="3", date_utc="T", command="c", load_avg_1m=0.5)
    assert environment_line(env) == "D; torch 2; T; command: `c`; 1-min load average 0.5"
    assert environment_line(env, ("triton",), load=False) == "D; triton 3; T; command: `c`"


def test_the_command_line_names_a_module_run_with_dash_m(monkeypatch):
    class Spec:
        name = "bench.scripts.bench_x"
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", Spec(), raising=False)
    monkeypatch.setattr(sys, "argv", ["/abs/bench/scripts/bench_x.py", "--rep", "2"])
    assert henv.command_line() == "python -m bench.scripts.bench_x --rep 2"


def test_report_writes_the_page_the_scripts_wrote_by_hand(tmp_path, capsys):
    """report: title, environment line, notes as quotes, then the body; the payload starts with
    environment, label and notes, then the script's own fields."""
    env = dict(device="D", torch="2", date_utc="T", command="c", load_avg_1m=0.5)
    out = tmp_path / "r.json"
    body = ["| a |", "|---|", "", "## More"]
    payload = report(str(out), "# Title", env, ["n1", "n2"], body, label="CPU", rows=[1])
    by_hand = ["# Title", "", environment_line(env), ""] + ["> n1", "> n2"] + [""] + body
    assert (tmp_path / "r.md").read_text() == "\n".join(by_hand) + "\n"
    assert list(payload) == ["environment", "label", "notes", "rows"]
    assert json.loads(out.read_text())["rows"] == [1]
    report(str(out), "# T", env, [], [], label="x", head=["model figures"], show=False)
    assert (tmp_path / "r.md").read_text() == "# T\n\nmodel figures\n"   # trailing blanks trimmed
    assert capsys.readouterr().out.endswith(f"wrote {out}\n")


def _run(date, figure):
    return {"environment": dict(device="CPU", date_utc=date, command=f"python -m x --f {figure}",
                                torch="2", load_avg_1m=1.0), "figure": figure}


def test_a_run_appended_keeps_the_earlier_ones(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert with_run(str(out), _run("T1", 1)) == _run("T1", 1)     # no file yet: the run alone
    finish(str(out), _run("T1", 1), "# page 1", append=True)
    assert json.loads(out.read_text()) == _run("T1", 1)          # one run: no runs list
    finish(str(out), _run("T2", 2), "# page 2", append=True, show=False)
    finish(str(out), _run("T3", 3), "# page 3", append=True, show=False)
    doc = json.loads(out.read_text())
    assert [r["figure"] for r in runs_of(doc)] == [1, 2, 3] and list(doc) == ["runs"]
    page = (tmp_path / "r.md").read_text()
    assert page.startswith("# page 3\n\n## Runs in this file\n")
    assert "| 3 | T3 | CPU | 1 | `python -m x --f 3` |" in page
    finish(str(out), _run("T4", 4), "# page 4", show=False)        # without append: replaced
    assert json.loads(out.read_text()) == _run("T4", 4)


def test_runs_table_and_runs_of_a_one_run_file(tmp_path):
    assert runs_of({"x": 1}) == [{"x": 1}]
    assert runs_table([{"environment": {"date_utc": "T"}}]).splitlines()[-1] == "| 1 | T | - | - | - |"
    write_results(str(tmp_path / "a.json"), {"runs": [_run("T1", 1)]})
    assert len(runs_of(json.loads((tmp_path / "a.json").read_text()))) == 1
