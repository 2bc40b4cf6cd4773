"""PyTorch path of ``pool_pack`` (CPU callers without the Triton interpreter).

Every output row is the mean of a *bag* of input tokens (its window, clipped at the grid's
edge), so the whole call is one ``F.embedding_bag`` (a sum weighted by ``1 / bag size``, see
:func:`_bag_weights`) over ``frames`` viewed as a
``[T*H*W, D]`` table: one pass over the kept tokens, accumulated in fp32 for the half types
(fp64 for fp64) and rounded once, already in packed (frame, row) order. Its backward is the
exact adjoint (each token gets its bag's gradient divided by the bag size; tokens in no bag,
i.e. dropped frames, get zeros). With ``out`` the rows are put in place by one ``index_copy_``;
autograd gives the overwritten rows of ``out`` zero gradient.

This replaced a per-window-group gather + ``avg_pool2d`` + ``index_copy`` (four passes over the
data): on one CPU thread the bag form is as fast as ``torch.compile`` of the reference without
its minute of compiling (``bench/scripts/bench_pool_pack.py --cpu-vs-compile``).

The bag indices depend on the windows only and are cached on the validated schedule; the row
indices for ``out`` are cached with the validated ``dest``.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from .checks import LaunchPlan, Schedule
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


def _out_rows(plan: LaunchPlan, device) -> torch.Tensor:
    """Row of ``out`` for every packed row (frame blocks at ``dest``), cached with the dest."""
    def build():
        sched = plan.sched()
        shift = np.repeat(np.asarray(plan.dest, np.int64) - np.asarray(sched.starts, np.int64), sched.cnt)
        return _to_device(np.arange(sched.total, dtype=np.int64) + shift, device)
    if plan.dest_entry is None:
        return build()
    return plan.dest_entry.derived(("rows", str(device)), build)


def _bag_weights(idx: torch.Tensor, offsets: torch.Tensor, dtype: torch.dtype):
    """``1 / bag size`` per index, for the weighted-sum form of the mean, or False where that
    would round differently: in fp16/bf16 only power-of-two sizes have exact reciprocals.

    Why not ``mode="mean"``: the weighted sum takes PyTorch's fused (FBGEMM) CPU kernel, the
    mean does not for half types; measured on one thread at T=64, D=896, the mean is 1.6x
    (fp32) to 5x (bf16) slower. Both accumulate in fp32 and round once."""
    sizes = torch.diff(offsets, append=offsets.new_tensor([idx.numel()]))
    if dtype in (torch.float16, torch.bfloat16) and bool(((sizes & (sizes - 1)) != 0).any()):
        return False
    with torch.inference_mode(False):
        return (1.0 / sizes.double()).repeat_interleave(sizes).to(dtype)


def pool_pack_torch(frames: torch.Tensor, plan: LaunchPlan, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    sched = plan.sched()
    D = plan.D
    if sched.total == 0:
        return frames.new_zeros(plan.rows, D) if out is None else out
    dev = frames.device
    idx, offsets = sched.derived(("bags", plan.N, str(dev)), lambda: tuple(
        _to_device(a, dev) for a in bag_indices(sched, plan.N)))
    w = sched.derived(("bag_weights", plan.N, str(dev), frames.dtype),
                      lambda: _bag_weights(idx, offsets, frames.dtype))
    table = frames.reshape(plan.T * plan.N, D)
    if w is False:
        pooled = F.embedding_bag(idx, table, offsets, mode="mean")
    else:
        pooled = F.embedding_bag(idx, table, offsets, mode="sum", per_sample_weights=w)
    if out is None:
        return pooled
    return out.index_copy_(0, _out_rows(plan, frames.device), pooled)
