"""Plain PyTorch reference of the pool-and-pack contract (SPEC section 1).

Written for clarity, not speed: one ``F.avg_pool2d`` per frame, then ``torch.cat``.
Tests compare every fast path against it; benchmarks use it as the eager baseline.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from .windows import _check_grid, normalize_window


def pool_frame(x: torch.Tensor, window: Tuple[int, int], grid: Tuple[int, int]) -> torch.Tensor:
    """[H*W, D] -> [ceil(H/sh) * ceil(W/sw), D], mean over each window, fp32 accumulation."""
    H, W = grid
    D = x.shape[-1]
    img = x.float().t().reshape(1, D, H, W)
    pooled = F.avg_pool2d(img, window, stride=window, ceil_mode=True)
    return pooled.reshape(D, -1).t().to(x.dtype)


def pool_pack_reference(frames: torch.Tensor, scales: Sequence, grid: Tuple[int, int] = (16, 16),
                        out: Optional[torch.Tensor] = None,
                        dest: Optional[Sequence[int]] = None) -> torch.Tensor:
    H, W = _check_grid(grid)
    T, N, D = frames.shape
    blocks = []
    for t in range(T):
        w = normalize_window(scales[t], f"scales[{t}]")
        if w is not None:
            blocks.append((t, pool_frame(frames[t], w, (H, W))))
    if out is None:
        if not blocks:
            return frames.new_zeros(0, D)
        return torch.cat([b for _, b in blocks], 0)
    # Out-of-place on `out` so autograd sees overwritten rows as replaced (zero grad).
    out = out.clone()
    for t, b in blocks:
        out[int(dest[t]): int(dest[t]) + b.shape[0]] = b
    return out
