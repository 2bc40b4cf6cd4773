"""The pages in a real browser (Debian's headless Chromium through selenium): ``demo --html``'s
and ``ask --html``'s files, ``serve``'s ``/ui`` asking a question, and ``eval --html``'s filters.
Each page loads with no console error and makes no request outside itself (the file, or the test's
127.0.0.1 server; ``data:`` thumbnails), shows as many frames as the JSON report has with the
report's windows, its thumbnails are the sampled frames within JPEG's error, and hostile text
stays text. Where Chromium is missing every test here skips with one line.

A screenshot of each page is taken (into $VIDEOROUTER_SCREENSHOTS when set: docs/img/ is made
that way)."""
import json
import os
import shutil

import pytest

from browser_helpers import (LiveServer, assert_thumbnails_are_the_frames, browser_paths,
                             console_errors, outside, page_thumbnails, requested_urls, run_cli,
                             screenshot, wait_for)

_paths, _why = browser_paths()
pytestmark = [pytest.mark.skipif(_paths is None, reason=str(_why)), pytest.mark.timeout(300)]

SAMPLE = __import__("pathlib").Path(__file__).resolve().parents[2] / "vr_runtime" / "assets" \
    / "sample.mp4"
HOSTILE = ('<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'
           '</script> What <b>shape</b> is the red object?')
ODD = 'clip "quoted" <i>.mp4'


def labels(report) -> list:
    from vr_runtime.report import window_label
    return [window_label(w) for w in report["windows"]]


def page_windows(driver) -> list:
    return driver.execute_script(
        "return [...document.querySelectorAll('#frames figure')].map(f => f.dataset.window)")


def no_markup_from(driver, selector) -> bool:
    """The text at ``selector`` made no element: it holds a text node only, the page has only
    its own two scripts, and every image on it is a frame's thumbnail."""
    return driver.execute_script(
        "const q = document.querySelector(arguments[0]);"
        "return q.children.length === 0 && document.scripts.length === 2 &&"
        " [...document.images].every(i => i.closest('#frames') !== null);", selector)


def open_page(driver, url):
    console_errors(driver)      # empty the logs of what came before
    requested_urls(driver)
    driver.get(url)
    wait_for(driver, "return document.readyState === 'complete'")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    folder = tmp_path_factory.mktemp("demo") / "pages"
    status, out, err = run_cli(["demo", "--html", folder, "--json"])
    assert status == 0, err
    return folder, json.loads(out)


def test_demo_pages(browser, demo, tmp_path):
    folder, out = demo
    index = (folder / "index.html").as_uri()
    open_page(browser, index)
    assert console_errors(browser) == []
    assert outside(requested_urls(browser), [index]) == []
    assert browser.execute_script("return document.querySelectorAll('a[href]').length") == 2
    assert browser.execute_script("return [...document.querySelectorAll('.strip')]"
                                  ".map(s => s.children.length)") == [16, 16]
    screenshot(browser, "demo-index", tmp_path)
    for i, item in enumerate(out["demo"], 1):
        url = (folder / f"question-{i}.html").as_uri()
        open_page(browser, url)
        report = item["report"]
        assert console_errors(browser) == []
        assert outside(requested_urls(browser), [url]) == []
        assert browser.execute_script("return document.querySelector('.answer').textContent") \
            == item["text"].strip()
        assert page_windows(browser) == labels(report)
        assert_thumbnails_are_the_frames(page_thumbnails(browser), SAMPLE,
                                         report["frame_indices"], 16)
        if i == 1:
            screenshot(browser, "ask-page", tmp_path)


def test_ask_page_keeps_a_hostile_question_as_text(browser, tmp_path):
    page = tmp_path / "ask.html"
    status, out, err = run_cli(["ask", SAMPLE, HOSTILE, "--frames", "8", "--max-length",
                                "1400", "--max-new-tokens", "8", "--html", page, "--json"])
    assert status == 0, err
    report = json.loads(out)["report"]
    open_page(browser, page.as_uri())
    assert console_errors(browser) == []
    assert outside(requested_urls(browser), [page.as_uri()]) == []
    assert browser.execute_script("return document.querySelector('.question').textContent") \
        == HOSTILE
    assert browser.execute_script("return window.__pwned === undefined")
    assert no_markup_from(browser, ".question")
    assert browser.title.startswith("VideoRouter: <img src=x")
    assert page_windows(browser) == labels(report)


def _media(tmp_path_factory):
    root = tmp_path_factory.mktemp("ui_media")
    shutil.copy(SAMPLE, root / "sample.mp4")
    shutil.copy(SAMPLE, root / ODD)
    return root


def _server(vr, media, media_kw=None, **app_kw):
    from vr_runtime.serve.app import create_app
    from vr_runtime.serve.engine import Engine, EngineConfig
    from vr_runtime.serve.media import MediaConfig, MediaStore
    engine = Engine(vr, MediaStore(MediaConfig(media_dir=media, **(media_kw or {}))),
                    EngineConfig())
    return LiveServer(create_app(engine, **app_kw))


@pytest.fixture(scope="module")
def ui(vr, tmp_path_factory):
    media = _media(tmp_path_factory)
    with _server(vr, media) as server:
        server.media = media
        yield server


def ask_in_page(driver, question, video_name, frames=8):
    """Pick ``video_name`` in the list, type the question, press Ask; wait for the answer."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    wait_for(driver, "return document.querySelectorAll('#video option').length > 1")
    Select(driver.find_element(By.ID, "video")).select_by_visible_text(video_name)
    box = driver.find_element(By.ID, "question")
    box.clear()
    box.send_keys(question)
    driver.find_element(By.ID, "frames").send_keys(str(frames))
    before = int(driver.execute_script("return Number(document.body.dataset.answered || 0)"))
    driver.find_element(By.ID, "submit").click()
    wait_for(driver, f"return Number(document.body.dataset.answered || 0) > {before} || "
                     "document.getElementById('status').className.includes('error')", 120)
    assert "error" not in driver.find_element(By.ID, "status").get_attribute("class"), \
        driver.find_element(By.ID, "status").text


def api_answer(server, question, url, frames=8):
    import httpx
    body = {"messages": [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": question}]}],
        "num_frames": frames}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_ui_asks_streams_and_shows_the_report(browser, ui, tmp_path):
    open_page(browser, f"{ui.url}/ui")
    wait_for(browser, "return document.querySelectorAll('#video option').length > 1")
    assert console_errors(browser) == []
    q = "What shape is the red object?"
    ask_in_page(browser, q, "sample.mp4")
    assert console_errors(browser) == []
    urls = requested_urls(browser)
    assert outside(urls, [ui.url + "/"]) == []
    assert {u.split("?")[0] for u in urls if not u.startswith("data:")} == \
        {f"{ui.url}/ui", f"{ui.url}/ui/media", f"{ui.url}/v1/chat/completions"}
    want = api_answer(ui, q, (ui.media / "sample.mp4").as_uri())
    report = want["videorouter"]
    assert browser.execute_script("return document.getElementById('answer-stream').textContent") \
        == want["choices"][0]["message"]["content"]
    assert browser.execute_script("return document.querySelector('#result .answer').textContent") \
        == want["choices"][0]["message"]["content"].strip()
    assert page_windows(browser) == labels(report)
    shown = json.loads(browser.execute_script(
        "return document.getElementById('report-json').textContent"))
    assert shown["frame_indices"] == report["frame_indices"]
    assert_thumbnails_are_the_frames(page_thumbnails(browser), SAMPLE, report["frame_indices"], 8)
    screenshot(browser, "ui", tmp_path)


def test_ui_keeps_hostile_questions_and_names_as_text(browser, ui):
    open_page(browser, f"{ui.url}/ui")
    wait_for(browser, "return document.querySelectorAll('#video option').length > 1")
    names = browser.execute_script(
        "return [...document.querySelectorAll('#video option')].map(o => o.textContent)")
    assert names == [ODD, "sample.mp4"]
    ask_in_page(browser, HOSTILE, ODD)
    assert browser.execute_script(
        "return document.querySelector('#result .question').textContent") == HOSTILE
    assert browser.execute_script("return window.__pwned === undefined")
    assert no_markup_from(browser, "#result .question")
    assert console_errors(browser) == []
    urls = requested_urls(browser)
    assert outside(urls, [ui.url + "/"]) == []
    assert not [u for u in urls if u.startswith(ui.url) and u.split("?")[0] not in (
        f"{ui.url}/ui", f"{ui.url}/ui/media", f"{ui.url}/v1/chat/completions")]


def test_ui_uploads_a_video_within_the_limits(browser, ui, vr, tmp_path_factory):
    """An uploaded file goes as a data: URL in the request body; one over --max-video-mb is
    refused on the page before anything is sent."""
    from selenium.webdriver.common.by import By
    upload = tmp_path_factory.mktemp("upload") / "mine.mp4"
    shutil.copy(SAMPLE, upload)
    open_page(browser, f"{ui.url}/ui")
    wait_for(browser, "return document.querySelectorAll('#video option').length > 1")
    browser.find_element(By.ID, "upload").send_keys(str(upload))
    ask_in_page(browser, "What shape is the blue object?", "sample.mp4")
    want = api_answer(ui, "What shape is the blue object?", (ui.media / "sample.mp4").as_uri())
    assert page_windows(browser) == labels(want["videorouter"])
    assert_thumbnails_are_the_frames(page_thumbnails(browser), SAMPLE,
                                     want["videorouter"]["frame_indices"], 8)
    assert console_errors(browser) == []
    with _server(vr, ui.media, media_kw={"max_video_bytes": 10_000}) as small:
        open_page(browser, f"{small.url}/ui")
        wait_for(browser, "return document.querySelectorAll('#video option').length > 1")
        browser.find_element(By.ID, "upload").send_keys(str(upload))
        browser.find_element(By.ID, "question").send_keys("What is it?")
        browser.find_element(By.ID, "submit").click()
        wait_for(browser, "return document.getElementById('status').className.includes('error')")
        assert "--max-video-mb" in browser.find_element(By.ID, "status").text
        assert not [u for u in requested_urls(browser) if "/v1/" in u]


def test_ui_with_a_key(browser, vr, tmp_path_factory):
    from selenium.webdriver.common.by import By
    with _server(vr, _media(tmp_path_factory), api_key="sekret") as server:
        open_page(browser, f"{server.url}/ui")
        assert console_errors(browser) == []   # nothing is asked before the key is given
        assert "API key" in browser.find_element(By.ID, "status").text
        key = browser.find_element(By.ID, "key")
        key.send_keys("wrong")
        browser.find_element(By.ID, "question").click()     # the key field's change event
        wait_for(browser, "return document.getElementById('status').textContent"
                          ".includes('401')")
        assert "missing or wrong API key" in browser.find_element(By.ID, "status").text
        key.clear()
        key.send_keys("sekret")
        browser.find_element(By.ID, "question").click()
        ask_in_page(browser, "What shape is the blue object?", "sample.mp4")
        assert page_windows(browser)
        assert outside(requested_urls(browser), [server.url + "/"]) == []


def test_eval_page_filters(browser, tmp_path):
    """Filters on made-up predictions (tests/eval/test_eval_html.py opens a real run's page)."""
    from vr_runtime.html import write_eval
    preds = []
    for method in ("auto", "uniform"):
        for budget in (256, 512):
            for q in range(3):
                right = (q + budget // 256) % 2 == 0
                preds.append({"id": f"q{q}", "method": method, "budget": budget, "frames": 4,
                              "prediction": "A" if right else "B", "answer": "A",
                              "correct": right, "visual_tokens": 200, "policy": "fragment",
                              "windows": [4, 1, 1, 4] if method == "auto" else [2, 2, 2, 2]})
    preds.append({"id": "q9", "method": "auto", "budget": 256, "frames": 4, "failed": "bad file",
                  "correct": False, "answer": "A"})
    page = write_eval(tmp_path / "eval.html", preds, [], "<b>run</b>")
    open_page(browser, page.as_uri())
    assert console_errors(browser) == []
    assert outside(requested_urls(browser), [page.as_uri()]) == []
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    def shown():
        return browser.execute_script("return [...document.querySelectorAll('#predictions tr')]"
                                      ".slice(1).filter(r => !r.hidden).length")
    assert shown() == 13
    Select(browser.find_element(By.ID, "f-method")).select_by_visible_text("auto")
    assert shown() == 7
    Select(browser.find_element(By.ID, "f-budget")).select_by_visible_text("512")
    assert shown() == 3
    Select(browser.find_element(By.ID, "f-correct")).select_by_visible_text("right")
    assert shown() == sum(1 for p in preds if p["method"] == "auto" and p.get("budget") == 512
                          and p["correct"])
    Select(browser.find_element(By.ID, "f-budget")).select_by_visible_text("all")
    Select(browser.find_element(By.ID, "f-correct")).select_by_visible_text("failed")
    assert shown() == 1
    assert browser.execute_script("return document.querySelector('h1').textContent") == \
        "<b>run</b>"
    assert os.path.getsize(page) < 100_000
