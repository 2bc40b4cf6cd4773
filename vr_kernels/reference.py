"""Plain PyTorch reference of the pool-and-pack contract (docs/CONTRACT.md section 1).

Written for clarity, not speed: one ``F.avg_pool2d`` per frame, then ``torch.cat`` (or a slice
assignment into ``out``). Tests compare every fast path against it; benchmarks use it as the
eager baseline. Arguments are validated by the same host checks as ``pool_pack``.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from .checks import TORCH_DTYPES, check_args


def pool_frame(x: torch.Tensor, window: Tuple[int, int], grid: Tuple[int, int]) -> torch.Tensor:
    """[H*W, D] -> [ceil(H/sh) * ceil(W/sw), D]: the mean over each window, accumulated in fp32
    (fp64 for fp64 input) and rounded once to ``x.dtype``."""
    H, W = grid
    D = x.shape[-1]
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    img = x.to(acc).t().reshape(1, D, H, W)
    # A side longer than the grid averages the whole side: clip it (same result, and it does not
    # depend on how avg_pool2d treats a kernel larger than its input).
    k = (min(window[0], H), min(window[1], W))
    # No padding + ceil_mode: a window running past the edge divides by the tokens inside it.
    pooled = F.avg_pool2d(img, k, stride=k, ceil_mode=True)
    return pooled.reshape(D, -1).t().to(x.dtype)


def pool_pack_reference(frames: torch.Tensor, windows: Sequence,
                        grid: Tuple[int, int] = (16, 16), out: Optional[torch.Tensor] = None,
                        dest: Optional[Sequence[int]] = None) -> torch.Tensor:
    """``pool_pack``'s contract, one ``avg_pool2d`` per frame."""
    plan = check_args(frames, windows, grid, out, dest, dtypes=TORCH_DTYPES)
    blocks = [(t, pool_frame(frames[t], w, plan.grid))
              for t, w in enumerate(plan.windows) if w is not None]
    if out is None:
        if not blocks:
            return frames.new_zeros(0, plan.D)
        return torch.cat([b for _, b in blocks], 0)
    # In place, like pool_pack: autograd's CopySlices gives the overwritten rows zero gradient.
    for t, b in blocks:
        out[plan.dest[t]: plan.dest[t] + b.shape[0]] = b
    return out
