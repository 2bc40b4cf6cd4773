"""Window arithmetic shared by the kernels, the reference and the planner.

A *window* is how one frame's H x W token grid is pooled:

* ``0``          the frame is dropped (no output rows),
* ``s`` (int)    an s x s window,
* ``(sh, sw)``   an sh x sw window.

Windows tile the grid from the top-left with stride equal to the window; a window
that runs past the edge averages only the tokens inside it (``avg_pool2d`` with
``ceil_mode=True`` and no padding), so a frame yields ``ceil(H/sh) * ceil(W/sw)`` rows.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

Window = Union[int, Tuple[int, int]]

def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def normalize_window(w, name: str = "scales") -> Optional[Tuple[int, int]]:
    """``0`` -> ``None`` (dropped); ``s`` -> ``(s, s)``; ``(sh, sw)`` -> ``(sh, sw)``.

    Raises ``ValueError`` naming ``name`` for anything else (negative, zero in a pair,
    floats, bools, wrong length)."""
    if isinstance(w, bool):
        raise ValueError(f"{name}: a window must be 0, an int >= 1 or a pair (sh, sw), got {w!r}")
    if hasattr(w, "item") and getattr(w, "ndim", 1) == 0:  # numpy / torch scalars
        w = w.item()
    if isinstance(w, int):
        if w == 0:
            return None
        if w < 1:
            raise ValueError(f"{name}: window {w} is < 1; use 0 to drop a frame or an int >= 1")
        return (w, w)
    if isinstance(w, (tuple, list)) and len(w) == 2:
        sh, sw = w
        if hasattr(sh, "item"):
            sh = sh.item()
        if hasattr(sw, "item"):
            sw = sw.item()
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (sh, sw)):
            raise ValueError(f"{name}: window {w!r} must hold two ints")
        if sh < 1 or sw < 1:
            raise ValueError(f"{name}: window {w!r} has a side < 1; every side must be >= 1")
        return (sh, sw)
    raise ValueError(f"{name}: a window must be 0, an int >= 1 or a pair (sh, sw), got {w!r}")


def window_tokens(w, grid: Tuple[int, int] = (16, 16)) -> int:
    """Rows one frame pooled with window ``w`` produces on an ``grid`` = (H, W) grid."""
    nw = normalize_window(w)
    if nw is None:
        return 0
    H, W = grid
    return _cdiv(H, nw[0]) * _cdiv(W, nw[1])


def pooled_counts(windows: Sequence[Window], grid: Tuple[int, int] = (16, 16)) -> list:
    """Rows each frame produces (0 for a dropped frame), one int per frame of ``windows`` (one
    window per frame)."""
    H, W = _check_grid(grid)
    counts = []
    for i, w in enumerate(windows):
        nw = normalize_window(w, f"windows[{i}]")
        counts.append(0 if nw is None else _cdiv(H, nw[0]) * _cdiv(W, nw[1]))
    return counts


def _check_grid(grid) -> Tuple[int, int]:
    if (not isinstance(grid, (tuple, list)) or len(grid) != 2
            or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 1 for g in grid)):
        raise ValueError(f"grid: expected a pair of ints (H, W) >= 1, got {grid!r}")
    return int(grid[0]), int(grid[1])
