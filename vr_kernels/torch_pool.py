"""PyTorch path of ``pool_pack`` (CPU callers without the Triton interpreter).

Every output row is the mean of a *bag* of input tokens (its window, clipped at the grid's
edge), so the whole call is one ``F.embedding_bag(mode="mean")`` over ``frames`` viewed as a
``[T*H*W, D]`` table: one pass over the kept tokens, accumulated in fp32 for the half types
(fp64 for fp64) and rounded once, already in packed (frame, row) order. Its backward is the
exact adjoint (each token gets its bag's gradient divided by the bag size; tokens in no bag,
i.e. dropped frames, get zeros). With ``out`` the rows are put in place by one ``index_copy_``;
autograd gives the overwritten rows of ``out`` zero gradient.

This replaced a per-window-group gather + ``avg_pool2d`` + ``index_copy`` (four passes over the
data): on one CPU thread the bag form is as fast as ``torch.compile`` of the reference without
its minute of compiling (``bench/bench_pool_pack.py --cpu-compare``).

The bag indices depend on the windows only and are cached on the validated schedule; the row
indices for ``out`` are cached with the validated ``dest``.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from .checks import Plan, Schedule
from .tiles import _to_device


def bag_indices(sched: Schedule, N: int) -> tuple:
    """``(indices, offsets)`` as int64 numpy arrays: the tokens of every output row's window, in
    packed order, as rows of the ``[T*N, D]`` table; ``offsets[r]`` = first index of row r."""
    H, W = sched.grid
    idx_parts, size_parts = [], []
    per_window = {}
    for t, w in enumerate(sched.windows):
        if w is None:
            continue
        tmpl = per_window.get(w)
        if tmpl is None:
            sh, sw = min(w[0], H), min(w[1], W)
            oh, ow = -(-H // sh), -(-W // sw)
            # Token (h, w) belongs to output row (h // sh) * ow + (w // sw); a stable sort by
            # row lists every window's tokens together, in row order.
            hh, ww = np.divmod(np.arange(H * W), W)
            row = (hh // sh) * ow + ww // sw
            order = np.argsort(row, kind="stable")
            tmpl = per_window[w] = (order, np.bincount(row, minlength=oh * ow))
        order, sizes = tmpl
        idx_parts.append(order + t * N)
        size_parts.append(sizes)
    if not idx_parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    idx = np.concatenate(idx_parts).astype(np.int64)
    sizes = np.concatenate(size_parts)
    offsets = np.zeros(sizes.size, np.int64)
    np.cumsum(sizes[:-1], out=offsets[1:])
    return idx, offsets


def _out_rows(plan: Plan, device) -> torch.Tensor:
    """Row of ``out`` for every packed row (frame blocks at ``dest``), cached with the dest."""
    def build():
        sched = plan.sched()
        shift = np.repeat(np.asarray(plan.dest, np.int64) - np.asarray(sched.starts, np.int64), sched.cnt)
        return _to_device(np.arange(sched.total, dtype=np.int64) + shift, device)
    if plan.dest_entry is None:
        return build()
    return plan.dest_entry.derived(("rows", str(device)), build)


def pool_pack_torch(frames: torch.Tensor, plan: Plan, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    sched = plan.sched()
    D = plan.D
    if sched.total == 0:
        return frames.new_zeros(plan.rows, D) if out is None else out
    idx, offsets = sched.derived(("bags", plan.N, str(frames.device)), lambda: tuple(
        _to_device(a, frames.device) for a in bag_indices(sched, plan.N)))
    pooled = F.embedding_bag(idx, frames.reshape(plan.T * plan.N, D), offsets, mode="mean")
    if out is None:
        return pooled
    return out.index_copy_(0, _out_rows(plan, frames.device), pooled)
