"""``videorouter eval --html``: a real run's page of predictions (the tiny model on the synthetic
benchmark), each with the window its method gave every sampled frame; the path checked before
anything loads; a rerun rewrites the page without answering again; and, where Chromium is
installed, the page in the browser (tests/html/browser_helpers.py)."""
import json
import pathlib
import re
import sys

import pytest

from eval_helpers import counting_answers, run_cli

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "html"))
import browser_helpers  # noqa: E402


def page_data(path: pathlib.Path) -> dict:
    m = re.search(r'<script type="application/json" id="vr-data">(.*?)</script>',
                  path.read_text(), re.S)
    return json.loads(m.group(1))


@pytest.fixture(scope="module")
def run(synth_bench, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval_html")
    argv = ["--benchmark", "videomme", "--data", synth_bench["data"], "--videos",
            synth_bench["videos"], "--methods", "auto,uniform", "--budgets", "256,512",
            "--frames", 4, "--answer-mode", "option-text", "--out", out, "--no-progress",
            "--max-new-tokens", 4, "--title", "Synthetic benchmark, tiny model", "--html",
            out / "predictions.html"]
    return out, argv


def test_bad_html_path_is_one_line_before_anything_runs(run, capsys, tmp_path):
    out, argv = run
    bad = argv[:-1] + [tmp_path / "missing" / "p.html"]
    status, _, err = run_cli(bad, capsys)
    assert status == 2 and err.count("\n") == 1 and "does not exist" in err
    assert not (out / "predictions.jsonl").exists()


def test_the_page_of_a_run(run, capsys, monkeypatch, tmp_path):
    out, argv = run
    status, stdout, err = run_cli(argv, capsys)
    assert status == 0, err
    assert f"wrote {out / 'predictions.html'}" in stdout
    preds = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert all(len(p["windows"]) == p["frames_used"] for p in preds)
    data = page_data(out / "predictions.html")
    assert len(data["predictions"]) == len(preds) and data["title"].startswith("Synthetic")
    from vr_runtime.html import window_code
    assert [p["windows"] for p in data["predictions"]] == \
        ["".join(window_code(w) for w in p["windows"]) for p in preds]
    assert {(r["method"], r["budget"]) for r in data["rows"]} == \
        {(m, b) for m in ("auto", "uniform") for b in (256, 512)}
    # a rerun with every prediction made answers nothing and writes the page again
    (out / "predictions.html").unlink()
    calls = counting_answers(monkeypatch)
    status, _, err = run_cli(argv, capsys)
    assert status == 0 and calls == [] and (out / "predictions.html").is_file()
    _in_the_browser(out / "predictions.html", preds, tmp_path)


def _in_the_browser(page, preds, tmp_path):
    paths, why = browser_helpers.browser_paths()
    if paths is None:
        pytest.skip(why)
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    driver = browser_helpers.start_browser()
    try:
        driver.get(page.as_uri())
        assert browser_helpers.console_errors(driver) == []
        assert browser_helpers.outside(browser_helpers.requested_urls(driver),
                                       [page.as_uri()]) == []
        Select(driver.find_element(By.ID, "f-method")).select_by_visible_text("auto")
        Select(driver.find_element(By.ID, "f-correct")).select_by_visible_text("right")
        shown = driver.execute_script(
            "return [...document.querySelectorAll('#predictions tr')].slice(1)"
            ".filter(r => !r.hidden).map(r => r.querySelectorAll('.strip span').length)")
        right = [p for p in preds if p["method"] == "auto" and p["correct"]]
        assert shown == [len(p["windows"]) for p in right]
        Select(driver.find_element(By.ID, "f-correct")).select_by_visible_text("all")
        Select(driver.find_element(By.ID, "f-method")).select_by_visible_text("all")
        browser_helpers.screenshot(driver, "eval-page", tmp_path)
    finally:
        driver.quit()
