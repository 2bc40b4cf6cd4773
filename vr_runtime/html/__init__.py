"""The HTML pages that show what the router kept: one answer laid over the video's timeline
(``ask --html``, ``demo --html``, ``serve``'s ``/ui`` after each answer), the demo's index,
and an evaluation's predictions (``eval --html``).

Every page is one self-contained file: its style, its script and its data are inline, so it
opens offline and asks nothing of any server (the pages' Content-Security-Policy says so to the
browser: no script, style or connection but the page's own, images only from ``data:`` URLs).
The one renderer of a timeline is ``assets/timeline.js``; it reads the same JSON report that
``ask --json`` prints and the server returns, so the pages of ``ask``, ``demo`` and ``/ui`` are
drawn by the same code. Text from outside (the question, the answer, file names, notes) only
ever reaches the page as text nodes, never as markup.
"""
from __future__ import annotations

from .files import check_html_dir, check_html_file, write_answer, write_demo, write_eval
from .page import (answer_page, eval_page, index_page, page_csp, ui_page, window_code,
                   write_page)

__all__ = ["answer_page", "index_page", "eval_page", "ui_page", "page_csp", "window_code",
           "write_page", "check_html_file", "check_html_dir", "write_answer", "write_demo",
           "write_eval"]
