"""Assembling a page: the shared shell, the inline style and script from ``assets/``, the data as
a JSON block, and the Content-Security-Policy that holds the page to itself.

The data goes in ``<script type="application/json">`` with every ``<``, ``>`` and ``&`` written
as a JSON escape, so nothing in it (a question holding ``</script>``) can end the block; the
script reads it with ``JSON.parse`` and puts strings on the page as text nodes only. The policy
allows exactly the page's own style and script (by their SHA-256), images from ``data:`` URLs
and, for ``/ui`` alone, connections to the server that sent it.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import html
import json
import math
import pathlib
import string
from typing import Iterable, List, Optional, Sequence

from ..data.atomic import write_atomic

ASSETS = pathlib.Path(__file__).resolve().parent / "assets"
JPEG_PREFIX = "data:image/jpeg;base64,"

# The renderer every page shares, then the page's own start-up script.
_SCRIPTS = {"answer": ("timeline.js", "answer.js"), "index": ("timeline.js", "index.js"),
            "eval": ("timeline.js", "eval.js"), "ui": ("timeline.js", "ui.js")}


@functools.lru_cache(maxsize=None)
def _asset(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


def _finite(obj):
    """JSON the browser's ``JSON.parse`` reads: NaN and infinities (which Python's json writes
    as bare words) become null; arrays and numbers of numpy or torch become lists and numbers."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    if hasattr(obj, "tolist"):
        return _finite(obj.tolist())
    return str(obj)


def embed_json(obj) -> str:
    """``obj`` as JSON that is safe inside a ``<script type="application/json">`` block."""
    text = json.dumps(_finite(obj), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                    ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() \
        + "'"


def page_csp(style: str, script: str, connect: str = "'none'") -> str:
    """The policy of a page whose only style and script are ``style`` and ``script``."""
    return (f"default-src 'none'; style-src {_sha256(style)}; script-src {_sha256(script)}; "
            f"img-src data:; connect-src {connect}; base-uri 'none'; form-action 'none'")


def _render(kind: str, title: str, data, connect: str = "'none'"):
    """(the page's HTML, its Content-Security-Policy)."""
    style = _asset("page.css")
    script = "\n".join(_asset(name) for name in _SCRIPTS[kind])
    csp = page_csp(style, script, connect)
    page = string.Template(_asset("shell.html")).substitute(
        csp=html.escape(csp), title=html.escape(title), kind=kind, style=style, script=script,
        data=embed_json(data))
    return page, csp


def _thumbnails(thumbnails: Optional[Sequence[Optional[str]]], n: int) -> List[Optional[str]]:
    """One ``data:image/jpeg`` URL (or None) per frame; anything else is refused."""
    if thumbnails is None:
        return [None] * n
    thumbs = list(thumbnails)
    if len(thumbs) != n:
        raise ValueError(f"thumbnails: {len(thumbs)} for {n} frames")
    bad = [i for i, t in enumerate(thumbs) if t is not None and not (
        isinstance(t, str) and t.startswith(JPEG_PREFIX))]
    if bad:
        raise ValueError(f"thumbnails: frame {bad[0]} is not a data:image/jpeg;base64 URL")
    return thumbs


def answer_page(question: str, text: str, report: dict,
                thumbnails: Optional[Sequence[Optional[str]]] = None,
                title: Optional[str] = None, back: Optional[str] = None) -> str:
    """The page of one answer: the question and answer, the policy, every sampled frame on the
    timeline (thumbnail, time, score, window, tokens, share of the budget), the budget, the
    stage timings and the notes. ``thumbnails``: a ``data:image/jpeg`` URL or None per sampled
    frame (the report's ``frame_indices``); ``back``: a relative link to an index page."""
    n = len(report.get("frame_indices") or [])
    data = {"question": question, "text": text, "report": report,
            "thumbnails": _thumbnails(thumbnails, n), "back": back}
    return _render("answer", title or f"VideoRouter: {question}", data)[0]


def index_page(entries: Iterable[dict], title: str = "VideoRouter demo") -> str:
    """The demo's index: per question (``{"href", "question", "text", "report"}``) its answer,
    a link to its page and the windows of its frames in a strip."""
    items = [{"href": e["href"], "question": e["question"], "text": e["text"],
              "windows": [window_code(w) for w in e["report"].get("windows") or []],
              "policy": e["report"].get("policy"),
              "visual_tokens": e["report"].get("visual_tokens"),
              "budget": e["report"].get("budget")} for e in entries]
    return _render("index", title, {"title": title, "pages": items})[0]


# The prediction fields an evaluation page shows (predictions.jsonl, docs/CONTRACT.md section 5).
EVAL_FIELDS = ("id", "method", "budget", "frames", "prediction", "answer", "correct",
               "visual_tokens", "policy", "video", "category", "duration", "failed", "error",
               "frames_kept", "frames_used", "response")


def eval_page(predictions: Iterable[dict], rows: Sequence[dict] = (), title: str = "") -> str:
    """An evaluation's predictions, filterable by method, budget and correctness, each with the
    windows its method gave the sampled frames (a strip; the prediction's ``windows``, absent
    from runs made before they were recorded) and the results table's rows."""
    preds = []
    for p in predictions:
        item = {k: p.get(k) for k in EVAL_FIELDS if k in p}
        item["windows"] = None if p.get("windows") is None else \
            "".join(window_code(w) for w in p["windows"])
        preds.append(item)
    keep = ("method", "budget", "frames", "n", "accuracy", "visual_tokens_mean", "unanswered",
            "failed")
    table = [{k: r.get(k) for k in keep} for r in rows]
    return _render("eval", title or "VideoRouter evaluation",
                   {"title": title or "VideoRouter evaluation", "predictions": preds,
                    "rows": table})[0]


def ui_page(key_required: bool = False) -> tuple:
    """(``/ui``'s HTML, its Content-Security-Policy header): the same shell and renderer, with
    connections allowed to the server that sent it ('self') and nowhere else. ``key_required``:
    the page waits for the key before it lists the media directory."""
    return _render("ui", "VideoRouter", {"key_required": bool(key_required)}, connect="'self'")


def window_code(w) -> str:
    """One character per frame for the strips: ``0`` dropped, ``1``-``9`` a square window of that
    side, ``r`` anything else (a rectangle, a window over 9)."""
    if w in (0, None):
        return "0"
    if isinstance(w, (list, tuple)):
        if len(w) == 2 and w[0] == w[1]:
            w = w[0]
        else:
            return "r"
    return str(w) if isinstance(w, int) and 1 <= w <= 9 else "r"


def write_page(path, page: str) -> pathlib.Path:
    """Write ``page`` to ``path`` whole or not at all (a temporary file renamed over it)."""
    path = pathlib.Path(path)
    write_atomic(path, page)
    return path
