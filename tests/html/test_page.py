"""The pages as files (vr_runtime.html), without a browser: self-contained, held to themselves by
their Content-Security-Policy, data that cannot end its block, the size goals, the paths the
commands accept. tests/html/test_browser.py opens the same pages in Chromium."""
import base64
import hashlib
import json
import re

import numpy as np
import pytest

from vr_runtime.html import (answer_page, check_html_dir, check_html_file, eval_page,
                             index_page, page_csp, ui_page, window_code, write_demo)
from vr_runtime.html.page import embed_json
from vr_runtime.video.thumbnails import ThumbnailStore

HOSTILE = 'What is <b>this</b>?</script><script>window.__pwned=1</script><!-- & "\u2028'


def report(n=16, full=(5, 6, 7)):
    windows = [1 if i in full else 4 for i in range(n)]
    return {"policy": "fragment", "policy_probability": 0.97, "model": "tiny", "device": "cpu",
            "frame_indices": list(range(n)), "frame_times_s": [i / 2 for i in range(n)],
            "frame_scores": [0.99 if i in full else 0.01 for i in range(n)],
            "windows": windows, "frame_tokens": [256 if w == 1 else 16 for w in windows],
            "visual_tokens": 256 * len(full) + 16 * (n - len(full)), "budget": 1262,
            "dense_visual_tokens": 256 * n, "text_tokens": 138, "relevant": None,
            "timings_s": {"frames": 0.3, "frames_wait": 0.01, "vision": 0.4, "router": 0.1,
                          "compress": 0.01, "prefill": 0.2, "ttft": 0.7, "first_token": 0.75,
                          "generate": 0.05},
            "notes": ["a note with <i>markup</i>"], "frames_dropped": 0}


def data_block(page: str):
    m = re.search(r'<script type="application/json" id="vr-data">(.*?)</script>', page, re.S)
    assert m, "no data block"
    return json.loads(m.group(1))


def inline(page: str, tag: str) -> list:
    return re.findall(rf"<{tag}>(.*?)</{tag}>", page, re.S)


def test_hostile_text_cannot_leave_the_data_block():
    page = answer_page(HOSTILE, "<img src=x onerror=alert(1)>", report())
    assert page.count("</script>") == 2     # the data block and the script, nothing more
    assert "<b>" not in page and "<img src=x" not in page and "<!--" not in page
    data = data_block(page)
    assert data["question"] == HOSTILE and data["text"] == "<img src=x onerror=alert(1)>"
    assert data["report"]["notes"] == ["a note with <i>markup</i>"]
    assert "&lt;/script&gt;" in page.split("<title>")[1].split("</title>")[0]


def test_nan_becomes_null():
    assert json.loads(embed_json({"p": float("nan"), "x": [float("inf"), 1.5]})) == \
        {"p": None, "x": [None, 1.5]}


def sha(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


@pytest.mark.parametrize("make", [
    lambda: answer_page("q", "a", report()),
    lambda: index_page([{"href": "question-1.html", "question": "q", "text": "a",
                         "report": report()}]),
    lambda: eval_page([{"id": "1", "method": "auto", "budget": 256, "windows": [4, 1, 0]}]),
    lambda: ui_page()[0]])
def test_a_page_is_self_contained_and_its_policy_names_its_own_code(make):
    page = make()
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", page)
    assert "<link rel=\"icon\" href=\"data:,\">" in page   # no /favicon.ico request either
    (style,), scripts = inline(page, "style"), inline(page, "script")
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
    csp = csp.replace("&#x27;", "'")
    assert f"style-src {sha(style)};" in csp and f"script-src {sha(scripts[-1])};" in csp
    assert "default-src 'none'" in csp and "img-src data:;" in csp


def test_only_the_ui_may_connect_and_only_to_its_server():
    assert "connect-src 'none'" in page_csp("a", "b")
    assert "connect-src 'self'" in ui_page()[1]
    assert data_block(ui_page(key_required=True)[0]) == {"key_required": True}


def test_thumbnails_must_be_jpeg_data_urls():
    with pytest.raises(ValueError, match="2 for 16 frames"):
        answer_page("q", "a", report(), thumbnails=["data:image/jpeg;base64,AA"] * 2)
    with pytest.raises(ValueError, match="frame 1 is not a data:image/jpeg"):
        answer_page("q", "a", report(), ["data:image/jpeg;base64,AA", "javascript:alert(1)"]
                    + [None] * 14)


def test_window_codes():
    assert [window_code(w) for w in (0, 1, 2, 4, [2, 2], [1, 2], 16, None)] == \
        ["0", "1", "2", "4", "2", "r", "r", "0"]


def _page_with_thumbnails(n: int, noise: bool) -> str:
    sink = ThumbnailStore(None).sink("video").prepare(n, 16 / 9)
    rng = np.random.default_rng(1)
    for i in range(n):
        frame = rng.integers(0, 256, (448, 448, 3), dtype=np.uint8) if noise else \
            np.full((448, 448, 3), i % 256, np.uint8)
        sink.put(i, frame)
    return answer_page("q", "a", report(n, full=range(0, n, 8)), sink.data_urls(range(n)))


def test_page_sizes_keep_to_the_goals():
    """16 frames at most 500 KB and 256 frames at most 3 MB, even when every frame is noise
    (JPEG's worst case); docs/serving.md gives the demo's own page's size."""
    assert len(_page_with_thumbnails(16, noise=True).encode()) <= 500 * 1000
    assert len(_page_with_thumbnails(256, noise=True).encode()) <= 3 * 1000 * 1000


def test_html_paths_are_checked_with_one_line(tmp_path):
    assert check_html_file(str(tmp_path / "a.html")) == tmp_path / "a.html"
    with pytest.raises(ValueError, match=r"--html '.*a\.png': expected a file name ending in "
                                         r"\.html"):
        check_html_file(str(tmp_path / "a.png"))
    with pytest.raises(ValueError, match="does not exist"):
        check_html_file(str(tmp_path / "missing" / "a.html"))
    (tmp_path / "d.html").mkdir()
    with pytest.raises(ValueError, match="is a directory"):
        check_html_file(str(tmp_path / "d.html"))
    assert check_html_dir(str(tmp_path / "new")) == tmp_path / "new"
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        check_html_dir(str(tmp_path / "f"))
    with pytest.raises(ValueError, match="does not exist"):
        check_html_dir(str(tmp_path / "missing" / "new"))


def test_write_demo_makes_an_index_and_a_page_per_question(tmp_path):
    outs = [{"text": "red circle", "report": report()}, {"text": "blue", "report": report()}]
    pages = write_demo(tmp_path / "demo", ["q1 <b>", "q2"], outs)
    assert [p.name for p in pages] == ["index.html", "question-1.html", "question-2.html"]
    index = data_block(pages[0].read_text())
    assert [p["href"] for p in index["pages"]] == ["question-1.html", "question-2.html"]
    assert index["pages"][0]["windows"] == ["4"] * 5 + ["1"] * 3 + ["4"] * 8
    assert data_block(pages[1].read_text())["back"] == "index.html"
    assert not list((tmp_path / "demo").glob("*.tmp"))


def test_the_commands_refuse_a_bad_html_path_in_one_line(tmp_path):
    """Before any model loads: exit status 2 and one line naming the flag and what to fix."""
    from browser_helpers import run_cli
    from vr_runtime.cli import SAMPLE_VIDEO
    status, out, err = run_cli(["ask", SAMPLE_VIDEO, "What?", "--html",
                                tmp_path / "missing" / "a.html"])
    assert status == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("videorouter: error: --html ") and "does not exist" in err
    (tmp_path / "file").write_text("x")
    status, _, err = run_cli(["demo", "--html", tmp_path / "file"])
    assert status == 2 and err.count("\n") == 1 and "is a file" in err
