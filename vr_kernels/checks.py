"""Host-side validation of ``pool_pack`` arguments (SPEC section 1), done before any launch.

Every backend (Triton, vectorised torch, reference) goes through :func:`check_args`, so a bad
argument gives the same ``PoolPackArgError`` (a ``ValueError``) naming the argument whatever
runs afterwards. The result, :class:`Plan`, is plain Python ints: the backends build their own
index tables from it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch

from .windows import _cdiv, _check_grid, normalize_window

#: dtypes the Triton kernels handle (fp32 accumulation, one rounding to the output dtype).
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: the PyTorch paths also take float64, which ``gradcheck`` needs.
TORCH_DTYPES = KERNEL_DTYPES + (torch.float64,)


class PoolPackArgError(ValueError):
    """A bad argument to ``pool_pack``; the message names the argument and what to do."""


@dataclass(frozen=True)
class Plan:
    """Normalised arguments: one entry per frame (``None`` window = dropped)."""
    T: int
    N: int
    D: int
    grid: Tuple[int, int]
    windows: Tuple[Optional[Tuple[int, int]], ...]
    counts: Tuple[int, ...]      # output rows per frame (0 when dropped)
    dest: Tuple[int, ...]        # first output row per frame (dropped frames: 0, unused)
    rows: int                    # rows of the result (sum(counts), or out.shape[0])

    @property
    def total(self) -> int:
        return sum(self.counts)


def _as_list(x, name: str) -> list:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().tolist()
    if hasattr(x, "tolist") and not isinstance(x, (list, tuple)):  # numpy arrays
        return x.tolist()
    if isinstance(x, (list, tuple)):
        return list(x)
    raise PoolPackArgError(f"{name}: expected a sequence (list, tuple, 1-D tensor), got {type(x).__name__}")


def _as_int(v, name: str) -> int:
    if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, int):
        raise PoolPackArgError(f"{name}: expected an int, got {v!r}")
    return v


def check_args(frames, scales, grid=(16, 16), out=None, dest=None,
               dtypes: Sequence[torch.dtype] = KERNEL_DTYPES) -> Plan:
    """Validate ``pool_pack``'s arguments and normalise them into a :class:`Plan`.

    Raises :class:`PoolPackArgError` (a ``ValueError``) naming the offending argument."""
    if not isinstance(frames, torch.Tensor):
        raise PoolPackArgError(f"frames: expected a torch.Tensor [T, H*W, D], got {type(frames).__name__}")
    if frames.dim() != 3:
        raise PoolPackArgError(f"frames: expected rank 3 [T, H*W, D], got shape {tuple(frames.shape)}")
    if frames.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise PoolPackArgError(f"frames: dtype {str(frames.dtype).replace('torch.', '')} is not supported "
                               f"here; use one of {names}")
    try:
        H, W = _check_grid(grid)
    except ValueError as e:
        raise PoolPackArgError(str(e)) from None
    T, N, D = frames.shape
    if H * W != N:
        raise PoolPackArgError(f"grid: {H}x{W} = {H * W} tokens but frames has {N} tokens per frame "
                               f"(frames.shape[1]); pass the grid the frames were encoded on")
    if D < 1:
        raise PoolPackArgError("frames: the hidden size (frames.shape[2]) must be >= 1")

    if isinstance(scales, int) and not isinstance(scales, bool):
        # A bare int is a common slip for "[s] * T"; say so instead of failing on len().
        raise PoolPackArgError(f"scales: expected one window per frame (a sequence of length {T}), "
                               f"got the single value {scales!r}; use [{scales}] * {T}")
    scales = _as_list(scales, "scales")
    if len(scales) != T:
        raise PoolPackArgError(f"scales: expected {T} windows (one per frame, frames.shape[0]), got {len(scales)}")
    windows = []
    counts = []
    for t, s in enumerate(scales):
        try:
            w = normalize_window(s, f"scales[{t}]")
        except ValueError as e:
            raise PoolPackArgError(str(e)) from None
        windows.append(w)
        counts.append(0 if w is None else _cdiv(H, w[0]) * _cdiv(W, w[1]))

    if out is None:
        if dest is not None:
            raise PoolPackArgError("dest: given without out; pass out=<2-D buffer> too, or drop dest")
        starts, acc = [], 0
        for c in counts:
            starts.append(acc)
            acc += c
        return Plan(T, N, D, (H, W), tuple(windows), tuple(counts), tuple(starts), acc)

    if not isinstance(out, torch.Tensor):
        raise PoolPackArgError(f"out: expected a torch.Tensor [L, D], got {type(out).__name__}")
    if out.dim() != 2:
        raise PoolPackArgError(f"out: expected a 2-D [L, D] tensor (e.g. inputs_embeds.view(-1, D)), "
                               f"got shape {tuple(out.shape)}")
    if out.shape[1] != D:
        raise PoolPackArgError(f"out: has {out.shape[1]} columns but frames has D = {D}")
    if out.dtype != frames.dtype:
        raise PoolPackArgError(f"out: dtype {out.dtype} differs from frames' {frames.dtype}; cast one of them")
    if out.device != frames.device:
        raise PoolPackArgError(f"out: on {out.device} but frames on {frames.device}; move one of them")
    if dest is None:
        raise PoolPackArgError("dest: required with out (dest[t] = first row of frame t's block)")
    dest = _as_list(dest, "dest")
    if len(dest) != T:
        raise PoolPackArgError(f"dest: expected {T} row offsets (one per frame), got {len(dest)}")
    L = out.shape[0]
    starts = []
    blocks = []
    for t, (d, c) in enumerate(zip(dest, counts)):
        if c == 0:  # a dropped frame writes nothing; its dest is ignored
            starts.append(0)
            continue
        d = _as_int(d, f"dest[{t}]")
        if d < 0 or d + c > L:
            raise PoolPackArgError(f"dest[{t}]: block [{d}, {d + c}) of frame {t} is outside out's {L} rows")
        starts.append(d)
        blocks.append((d, d + c, t))
    blocks.sort()
    for (a0, a1, ta), (b0, b1, tb) in zip(blocks, blocks[1:]):
        if b0 < a1:
            raise PoolPackArgError(f"dest: blocks of frames {ta} [{a0}, {a1}) and {tb} [{b0}, {b1}) overlap")
    return Plan(T, N, D, (H, W), tuple(windows), tuple(counts), tuple(starts), L)
