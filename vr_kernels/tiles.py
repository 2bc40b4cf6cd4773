"""Host-built work tables for the pool-and-pack kernels.

Work balance
------------
A program's cost is the number of input tokens it reads (fwd) or writes (bwd), not the number
of output rows it produces: a 1x1 output row reads 1 token, an 8x8 one reads 64. So a *tile*
is a run of consecutive output rows of one frame whose windows hold about ``tokens_per_tile``
input tokens: ``rows_per_tile = max(1, tokens_per_tile // window_area)``. With the default 64
and a 16x16 grid, every tile of a 1/2/4/8 mix reads exactly 64 tokens (64 rows of 1x1, 16 of
2x2, 4 of 4x4, 1 of 8x8). A frame's rows are split into equal-as-possible tiles so the last
tile of a frame is not a sliver. Windows larger than ``tokens_per_tile`` give a tile of one
row (a window is never split across programs, which would need atomics); the imbalance is
then ``area / tokens_per_tile`` (at most 4 for a whole 16x16 frame in one window).

Dropped frames cost the forward nothing. The backward must write zeros to their gradient, so
``build_tiles`` appends *zero tiles* (``sh == 0``) after the forward tiles, each covering
``tokens_per_tile`` tokens of a dropped frame: the forward launches over the first
``n_fwd`` tiles, the backward over all of them.

Each program then handles one tile times one ``BLOCK_D`` slice of the hidden size; the launch
grid is ``n_tiles * cdiv(D, BLOCK_D)``.

Table layout: int32 ``[n_tiles, 8]``, one row per tile:

====  =========================================================================
col   meaning
====  =========================================================================
0     frame t
1     first output row of the tile within the frame (zero tiles: first token)
2     number of output rows (zero tiles: number of tokens)
3     window height sh (0 marks a zero tile)
4     window width sw
5     output columns of the frame, ceil(W / sw)
6     destination row in ``out`` of the tile's first output row
7     padding (keeps rows 32-byte aligned)
====  =========================================================================

Every entry is a row or token *index* (< 2**31 for any real shape); the kernels cast to int64
before multiplying by a stride, which is where 2**31 would be crossed.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Tuple

import torch

from .checks import Plan

TILE_COLS = 8
INT32_MAX = 2**31 - 1


def tile_rows(plan: Plan, tokens_per_tile: int):
    """The tile table as a Python list of 8-int rows plus the number of forward tiles."""
    H, W = plan.grid
    fwd, zero = [], []
    for t, (w, cnt, d0) in enumerate(zip(plan.windows, plan.counts, plan.dest)):
        if w is None:
            for n0 in range(0, plan.N, tokens_per_tile):
                zero.append((t, n0, min(tokens_per_tile, plan.N - n0), 0, 0, 0, 0, 0))
            continue
        sh, sw = w
        ow = -(-W // sw)
        area = min(sh, H) * min(sw, W)  # a window larger than the grid reads the whole grid
        per = max(1, tokens_per_tile // area)
        n = -(-cnt // per)
        base, extra = divmod(cnt, n)  # n tiles of base or base+1 rows
        r0 = 0
        for i in range(n):
            r = base + (1 if i < extra else 0)
            fwd.append((t, r0, r, sh, sw, ow, d0 + r0, 0))
            r0 += r
    return fwd + zero, len(fwd)


_CACHE: "OrderedDict[tuple, Tuple[torch.Tensor, int]]" = OrderedDict()
_CACHE_SIZE = 64


def build_tiles(plan: Plan, tokens_per_tile: int, device) -> Tuple[torch.Tensor, int]:
    """``(table, n_fwd)``: the int32 table on ``device`` and how many tiles the forward runs.

    Tables are cached by schedule (windows, dest, grid), so a fixed schedule pays for the
    host loop and the host-to-device copy once."""
    key = (plan.windows, plan.dest, plan.grid, plan.N, tokens_per_tile, str(device))
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit
    rows, n_fwd = tile_rows(plan, tokens_per_tile)
    # Indices must fit int32 (checked once here, so the kernel's loads of the table are exact).
    if plan.rows > INT32_MAX or plan.T * plan.N > INT32_MAX:
        raise ValueError(f"frames/out: {plan.T * plan.N} tokens or {plan.rows} rows exceed 2**31-1; "
                         f"split the call")
    # The table is cached across calls, so it must not be an inference tensor: one built under
    # torch.inference_mode (the runtime's answer()) and reused by a call with autograd on
    # (training) would fail in save_for_backward.
    with torch.inference_mode(False):
        table = torch.tensor(rows if rows else [[0] * TILE_COLS], dtype=torch.int32)
        if torch.device(device).type != "cpu":
            table = table.pin_memory().to(device, non_blocking=True)
    hit = (table, n_fwd)
    _CACHE[key] = hit
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return hit
