"""Markdown tables of results."""
from __future__ import annotations

from typing import Dict, List, Optional


def markdown_grid(headers: List[str], cells: List[List[str]], numbers_right: bool = False) -> str:
    """A GitHub markdown table of already formatted ``cells``; ``numbers_right`` left-aligns the
    first column and right-aligns the others (tables of figures)."""
    rule = [(":--" if i == 0 else "--:") if numbers_right else "---" for i in range(len(headers))]
    return "\n".join(["| " + " | ".join(headers) + " |", "|" + "|".join(rule) + "|"]
                     + ["| " + " | ".join(row) + " |" for row in cells])


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v != v:
            return "-"
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def markdown_table(rows: List[Dict[str, object]], columns: List[str],
                   headers: Optional[List[str]] = None) -> str:
    """A GitHub markdown table of ``rows`` (dicts) restricted to ``columns``."""
    return markdown_grid(headers or columns, [[_cell(r.get(c)) for c in columns] for r in rows])
