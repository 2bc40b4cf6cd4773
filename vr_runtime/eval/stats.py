"""Uncertainty of accuracy figures: the interval on one table cell, and the paired test that
says whether two runs answering the same questions differ.

With 144 questions a row, one question is 0.7 points: rows read to the decimal need the
interval beside them. Wilson's score interval (not the normal "p +- 1.96 SE", which collapses to
zero width at 0% and 100% and overshoots [0, 100] near them) and McNemar's exact test (the
binomial test on the discordant pairs, exact for the small counts a table row has) are what
papers comparing classifiers on one test set report.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

Z95 = 1.959963984540054   # the standard normal's 97.5% quantile


def wilson(correct: int, n: int, z: float = Z95) -> Optional[Tuple[float, float]]:
    """The 95% Wilson score interval of ``correct`` out of ``n``, in percent; None for n = 0."""
    if n <= 0:
        return None
    if not 0 <= correct <= n:
        raise ValueError(f"correct: expected 0..{n}, got {correct}")
    p = correct / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # exact at the ends (rounding would otherwise leave 1e-17 below 0 or above 100)
    lo = 0.0 if correct == 0 else max(0.0, centre - half)
    hi = 1.0 if correct == n else min(1.0, centre + half)
    return 100.0 * lo, 100.0 * hi


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for ``b`` questions right in run A only and ``c`` right in
    run B only: under "no difference" each discordant pair goes either way with probability
    1/2, so min(b, c) is Binomial(b + c, 1/2); the p-value doubles the smaller tail (capped at
    1). No discordant pairs: p = 1."""
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got {b}, {c}")
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    # integer arithmetic: exact for any n a table can have
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return min(1.0, 2 * tail / 2 ** n)


__all__ = ["wilson", "mcnemar_exact", "Z95"]
