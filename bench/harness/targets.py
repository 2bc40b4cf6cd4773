"""A figure against its goal, as one line that says whether the goal is met."""
from __future__ import annotations

from typing import Optional


def meets(what: str, value: Optional[float], target: float, *, at_least: bool = True,
          fmt: str = "{:.0%}") -> str:
    """``what`` (its ``{value}`` filled in), the target and ``met`` / ``NOT met``, e.g.
    ``fwd: 93% of copy bandwidth (target >= 90%): met``. A missing value is not met."""
    ok = value is not None and (value >= target if at_least else value <= target)
    shown = "n/a" if value is None else fmt.format(value)
    return (f"{what.format(value=shown)} (target {'>=' if at_least else '<='} "
            f"{fmt.format(target)}): {'met' if ok else 'NOT met'}")
