"""Vectorised PyTorch path of ``pool_pack`` (CPU callers without the Triton interpreter).

Frames are grouped by window: one gather, one ``avg_pool2d`` and one reshape per distinct
window (a plan has a handful), then a single ``index_copy`` puts every pooled row at its
destination. Everything is built from differentiable ops, so autograd (and ``gradcheck`` in
float64) comes for free; with ``out`` the copy is in place (``index_copy_``), and autograd
gives the overwritten rows of ``out`` zero gradient.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Optional

import torch
import torch.nn.functional as F

from .checks import Plan


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    # fp32 accumulation for the half types (SPEC); fp32 and fp64 pool in their own precision.
    return torch.float64 if dtype == torch.float64 else torch.float32


def pool_pack_torch(frames: torch.Tensor, plan: Plan, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    H, W = plan.grid
    D = plan.D
    groups: "OrderedDict[tuple, list]" = OrderedDict()
    for t, w in enumerate(plan.windows):
        if w is not None:
            groups.setdefault(w, []).append(t)

    pieces, rows = [], []
    acc = _acc_dtype(frames.dtype)
    for (sh, sw), ts in groups.items():
        # A window larger than the grid pools the whole grid along that side; clipping it keeps
        # avg_pool2d's output size right without relying on its kernel > input behaviour.
        k = (min(sh, H), min(sw, W))
        idx = torch.tensor(ts, device=frames.device)
        x = frames.index_select(0, idx).to(acc)                      # [n, N, D]
        x = x.view(len(ts), H, W, D).permute(0, 3, 1, 2)             # [n, D, H, W]
        p = F.avg_pool2d(x, k, stride=k, ceil_mode=True)             # [n, D, OH, OW]
        pieces.append(p.permute(0, 2, 3, 1).reshape(-1, D))          # rows in frame-major order
        c = plan.counts[ts[0]]
        rows.append((torch.tensor([plan.dest[t] for t in ts]).view(-1, 1) + torch.arange(c)).view(-1))

    if out is None:
        result = frames.new_zeros(plan.rows, D)
        if not pieces:
            return result
        return result.index_copy(0, torch.cat(rows).to(frames.device), torch.cat(pieces).to(frames.dtype))
    if pieces:
        out.index_copy_(0, torch.cat(rows).to(frames.device), torch.cat(pieces).to(frames.dtype))
    return out
