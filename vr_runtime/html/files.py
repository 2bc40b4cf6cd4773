"""The pages the commands write: ``ask --html FILE`` (one answer), ``demo --html DIR`` (a page
per question and an index), ``eval --html FILE`` (the predictions). The paths are checked before
any model loads, as ``--plot``'s is; every page is written whole or not at all."""
from __future__ import annotations

import pathlib
from typing import List, Optional, Sequence

from .page import answer_page, eval_page, index_page, write_page

HTML_SUFFIXES = (".html", ".htm")
INDEX = "index.html"


def check_html_file(value: str, flag: str = "--html") -> pathlib.Path:
    """A page's path: a .html name in a folder that exists (ValueError otherwise, one line)."""
    path = pathlib.Path(value)
    if path.suffix.lower() not in HTML_SUFFIXES:
        raise ValueError(f"{flag} {value!r}: expected a file name ending in .html")
    parent = path.parent if str(path.parent) else pathlib.Path(".")
    if not parent.is_dir():
        raise ValueError(f"{flag} {value!r}: directory {str(parent)!r} does not exist")
    if path.is_dir():
        raise ValueError(f"{flag} {value!r}: is a directory; name the page's file")
    return path


def check_html_dir(value: str, flag: str = "--html") -> pathlib.Path:
    """A folder for several pages: one that exists, or a new one in a folder that exists."""
    path = pathlib.Path(value)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {value!r}: is a file; give a directory for the demo's pages")
    parent = path.parent if str(path.parent) else pathlib.Path(".")
    if not path.exists() and not parent.is_dir():
        raise ValueError(f"{flag} {value!r}: directory {str(parent)!r} does not exist")
    return path


def _thumbnails(sink, report: dict) -> Optional[List[Optional[str]]]:
    return None if sink is None else sink.data_urls(report.get("frame_indices") or [])


def write_answer(path, question: str, out: dict, sink=None,
                 back: Optional[str] = None) -> pathlib.Path:
    """The page of ``out`` ({"text", "report"}, as ``ask --json`` prints it); ``sink``: the
    ThumbnailSink its frames were decoded into (vr_runtime.video.thumbnails), or None."""
    report = out["report"]
    return write_page(path, answer_page(question, out["text"], report,
                                        _thumbnails(sink, report), back=back))


def write_demo(folder, questions: Sequence[str], outs: Sequence[dict],
               sink=None) -> List[pathlib.Path]:
    """``question-N.html`` per question and ``index.html`` linking them, in ``folder`` (made if
    missing) -> the pages written, the index first."""
    folder = pathlib.Path(folder)
    folder.mkdir(exist_ok=True)
    entries, pages = [], []
    for i, (q, out) in enumerate(zip(questions, outs), 1):
        name = f"question-{i}.html"
        pages.append(write_answer(folder / name, q, out, sink, back=INDEX))
        entries.append({"href": name, "question": q, "text": out["text"],
                        "report": out["report"]})
    return [write_page(folder / INDEX, index_page(entries))] + pages


def write_eval(path, predictions, rows=(), title: str = "") -> pathlib.Path:
    """An evaluation's page (``eval --html``)."""
    return write_page(path, eval_page(predictions, rows, title))
