"""Host-built work tables for the pool-and-pack kernels.

Work balance
------------
A program's cost is the number of input tokens it reads (fwd) or writes (bwd), not the number
of output rows it produces: a 1x1 output row reads 1 token, an 8x8 one reads 64. So a *tile*
is a run of consecutive output rows of one frame whose windows hold about ``tokens_per_tile``
input tokens: ``rows_per_tile = max(1, tokens_per_tile // window_area)``. With the default 256
and a 16x16 grid every tile of a 1/2/4/8 mix is one whole frame and reads exactly 256 tokens
(256 rows of 1x1, 64 of 2x2, 16 of 4x4, 4 of 8x8), so the large windows also give the kernel
enough output rows to fill its lanes (the kernels reduce a window inside a thread, with lanes
over output rows, see ``pool_pack.py``). A frame's rows are split into equal-as-possible tiles
so the last tile of a frame is not a sliver. Windows larger than ``tokens_per_tile`` give a
tile of one row (a window is never split across programs, which would need atomics).

Dropped frames cost the forward nothing. The backward must write zeros to their gradient, so
``tile_table`` appends *zero tiles* (``sh == 0``) after the forward tiles, each covering
``tokens_per_tile`` tokens of a dropped frame: the forward launches over the first ``n_fwd``
tiles, the backward over all of them.

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
6, 7  padding (keeps rows 32-byte aligned)
====  =========================================================================

The table depends on the windows only, never on where the rows go: the destination of frame t
is ``dest[t]``, a separate int32 vector the kernels read per tile. So a schedule's table is
built once and reused whatever ``out``/``dest`` a call brings (a new prompt length, another
batch slot), and a new ``dest`` costs one small vector, not a table.

Tables are built with numpy (no Python tuple per tile) and cached on the validated
:class:`~vr_kernels.checks.Schedule`, per device and ``tokens_per_tile``.

Every entry is a row or token *index* (< 2**31 for any real shape); the kernels cast to int64
only for the frame's and the block's base address, which is where 2**31 can be crossed.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np
import torch

from .checks import LaunchPlan, Schedule

TILE_COLS = 8
INT32_MAX = 2**31 - 1


def tile_table(sched: Schedule, N: int, tokens_per_tile: int) -> Tuple[np.ndarray, int]:
    """The tile table as an int32 numpy array ``[n_tiles, 8]`` plus the number of forward tiles."""
    H, W = sched.grid
    sh, sw, cnt = sched.sh, sched.sw, sched.cnt
    kept_mask = cnt > 0
    kept = np.flatnonzero(kept_mask)
    ksh, ksw, kcnt = sh[kept], sw[kept], cnt[kept]
    area = np.minimum(ksh, H) * np.minimum(ksw, W)  # a window larger than the grid reads it all
    per = np.maximum(1, tokens_per_tile // area)
    dropped = np.flatnonzero(~kept_mask)
    nz = -(-N // tokens_per_tile) if N else 0
    if (kcnt <= per).all() and nz <= 1:
        # Every frame is one tile (a 16x16 grid with the default 256 tokens a tile): no split.
        table = np.zeros((kept.size + dropped.size * nz, TILE_COLS), np.int32)
        f = table[:kept.size]
        f[:, 0], f[:, 2], f[:, 3], f[:, 4], f[:, 5] = kept, kcnt, ksh, ksw, -(-W // ksw)
        if nz:
            z = table[kept.size:]
            z[:, 0], z[:, 2] = dropped, N
        return table, kept.size
    n = -(-kcnt // per)                              # tiles per kept frame
    base, extra = np.divmod(kcnt, n)                 # n tiles of base or base + 1 rows
    n_fwd = int(n.sum())
    first = np.repeat(np.cumsum(n) - n, n)
    i = np.arange(n_fwd) - first                     # tile index within its frame
    rb, xb = np.repeat(base, n), np.repeat(extra, n)
    fwd = np.zeros((n_fwd, TILE_COLS), np.int64)
    fwd[:, 0] = np.repeat(kept, n)
    fwd[:, 1] = i * rb + np.minimum(i, xb)
    fwd[:, 2] = rb + (i < xb)
    fwd[:, 3] = np.repeat(ksh, n)
    fwd[:, 4] = np.repeat(ksw, n)
    fwd[:, 5] = np.repeat(-(-W // ksw), n)

    zero = np.zeros((dropped.size * nz, TILE_COLS), np.int64)
    if zero.size:
        j = (np.arange(dropped.size * nz) % nz) * tokens_per_tile
        zero[:, 0] = np.repeat(dropped, nz)
        zero[:, 1] = j
        zero[:, 2] = np.minimum(tokens_per_tile, N - j)
    return np.concatenate([fwd, zero]).astype(np.int32), n_fwd


def _check_int32(plan: LaunchPlan):
    # Indices must fit int32 (checked once here, so the kernel's loads of the tables are exact).
    if plan.rows > INT32_MAX or plan.T * plan.N > INT32_MAX:
        raise ValueError(f"frames/out: {plan.T * plan.N} tokens or {plan.rows} rows exceed 2**31-1; "
                         f"split the call")


def _to_device(a: np.ndarray, device) -> torch.Tensor:
    # Cached tables must not be inference tensors: one built under torch.inference_mode (the
    # runtime's answer()) and reused by a call with autograd on (training) would fail in
    # save_for_backward.
    if torch.is_inference_mode_enabled():
        with torch.inference_mode(False):
            return _to_device(a, device)
    t = torch.from_numpy(a)
    if torch.device(device).type != "cpu":
        t = t.pin_memory().to(device, non_blocking=True)
    return t


def build_tiles(plan: LaunchPlan, tokens_per_tile: int, device) -> Tuple[torch.Tensor, int]:
    """``(table, n_fwd)``: the int32 table on ``device`` and how many tiles the forward runs,
    cached on the plan's schedule."""
    _check_int32(plan)
    sched = plan.sched()

    def build():
        table, n_fwd = tile_table(sched, plan.N, tokens_per_tile)
        if table.shape[0] == 0:
            table = np.zeros((1, TILE_COLS), np.int32)
        return _to_device(table, device), n_fwd

    return sched.derived(("tiles", plan.N, tokens_per_tile, str(device)), build)


def build_dest(plan: LaunchPlan, device) -> torch.Tensor:
    """int32 ``[max(T, 1)]`` on ``device``: the first output row of each frame (0 if dropped),
    cached with the validated dest (or, packed, with the schedule)."""
    owner = plan.dest_entry if plan.dest_entry is not None else plan.sched()
    return owner.derived(("dest", str(device)), lambda: _to_device(np.asarray(plan.dest or (0,), np.int32), device))
