"""Two ways of doing one thing, timed against each other on a shared machine.

Other jobs' load comes and goes: timed one after the other, two methods would meet different
loads. Alternating single calls is no better on a CPU (each method then pays the page faults of
re-mapping the memory the other just freed), so the two alternate in blocks of a few calls
(A x5, B x5, A x5, ...): load hits both alike, and the ratio of their medians holds where the
absolute times do not.
"""
from __future__ import annotations

import time
from typing import Callable, Tuple

from bench.harness.timing import Timing

BLOCK = 5


def first_call_s(fn: Callable[[], object]) -> float:
    """Wall time of a call made once, e.g. the first call of a compiled function (its compile)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def alternate(a: Callable[[], object], b: Callable[[], object], *, rep: int,
              block: int = BLOCK, warm: int = 3) -> Tuple[Timing, Timing]:
    """(``a``'s, ``b``'s) Timing from ``rep`` calls each (rounded down to whole blocks, at
    least one), taken in alternating blocks of ``block`` after ``warm`` untimed calls of both."""
    for _ in range(warm):
        a(), b()
    times = ([], [])
    for _ in range(max(1, rep // block)):
        for fn, ts in zip((a, b), times):
            for _ in range(block):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
    return Timing.of(times[0]), Timing.of(times[1])
