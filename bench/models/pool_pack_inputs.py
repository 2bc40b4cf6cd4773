"""What the pool_pack benchmarks build: frames and a schedule at a shape, the prompt's
embedding buffer with its placeholder rows, the explicit byte counts, and the methods the
kernel is compared with (the per-frame LLaVA-style loop, the reference, a same-bytes copy).
bench/scripts/bench_pool_pack.py and bench/test_pool_pack_benchmark.py time them."""
from __future__ import annotations

from typing import List

import torch

from vr_kernels import pool_pack_reference, pooled_counts
from vr_kernels.reference import pool_frame
from vr_kernels.windows import normalize_window

GRID = (16, 16)
PAPER = dict(T=64, D=3584, mix="paper")
MIXES = {
    # The paper's mix: fine (1x1) relevant frames, 2x2 global, 4x4 / 8x8 context, dropped frames.
    "paper": [1, 2, 4, 8, 0],
    "all1x1": [1],
    "one_kept": None,  # all dropped but one (built in scales_for)
    "all8x8": [8],
}


def scales_for(mix: str, T: int, shift: int = 0) -> List:
    if mix == "one_kept":
        s = [0] * T
        s[(T // 2 + shift) % T] = 1
        return s
    cyc = MIXES[mix]
    return [cyc[(i + shift) % len(cyc)] for i in range(T)]


class Case:
    """Frames, a schedule and the embedding buffer with its placeholder rows."""

    def __init__(self, T: int, D: int, mix: str, dtype, device, text_per_frame: int = 4, seed: int = 0):
        # Drawn on the device in the benchmark dtype: the sweep's largest case (T=1024, D=5120) is
        # 1.3e9 values, seconds of host time and a 5 GB fp32 host copy if drawn on the CPU.
        g = torch.Generator(device=device).manual_seed(seed)
        self.T, self.D, self.mix, self.dtype, self.device = T, D, mix, dtype, device
        self.N = GRID[0] * GRID[1]
        self.frames = torch.randn(T, self.N, D, generator=g, device=device, dtype=dtype)
        self.set_schedule(scales_for(mix, T), text_per_frame)

    def set_schedule(self, scales, text_per_frame: int = 4):
        self.scales = scales
        self.counts = pooled_counts(scales, GRID)
        self.total = sum(self.counts)
        # Prompt layout: 16 text rows, then per kept frame a few text rows ("FrameN: <img>") and
        # its placeholders, then 32 text rows.
        dest, pos = [], 16
        for c in self.counts:
            if c:
                pos += text_per_frame
                dest.append(pos)
                pos += c
            else:
                dest.append(0)
        self.L = pos + 32
        self.dest = dest
        m = torch.zeros(self.L, dtype=torch.bool)
        for d, c in zip(dest, self.counts):
            if c:
                m[d: d + c] = True
        self.mask = m.to(self.device)
        self.embeds = torch.randn(1, self.L, self.D).to(device=self.device, dtype=self.dtype)

    def rotation(self, n: int):
        """``n`` input sets ``(frames, embeds [1, L, D])``: set 0 is this case's; the others are
        fresh draws of the same shape, so consecutive timed calls read different memory."""
        g = torch.Generator(device=self.device).manual_seed(1234)
        sets = [(self.frames, self.embeds)]
        for _ in range(n - 1):
            sets.append((torch.randn(self.frames.shape, generator=g, device=self.device, dtype=self.dtype),
                         torch.randn(self.embeds.shape, generator=g, device=self.device, dtype=self.dtype)))
        return sets

    @property
    def kept(self) -> int:
        return sum(1 for c in self.counts if c)

    def fwd_bytes(self) -> int:
        es = self.frames.element_size()
        return (self.kept * self.N * self.D + self.total * self.D) * es

    def bwd_bytes(self) -> int:
        es = self.frames.element_size()
        return (self.total * self.D + self.T * self.N * self.D) * es


def llava_forward(frames, scales, embeds, mask):
    """(a) per-frame eager loop + masked_scatter (a new embeds tensor, as HF models do)."""
    pieces = [pool_frame(frames[t], normalize_window(s), GRID) for t, s in enumerate(scales) if s != 0]
    packed = torch.cat(pieces, 0)
    return embeds.masked_scatter(mask.view(1, -1, 1), packed.view(1, -1, packed.shape[-1]))


def llava_packed(frames, scales):
    return torch.cat([pool_frame(frames[t], normalize_window(s), GRID) for t, s in enumerate(scales) if s != 0], 0)


def reference_into(frames, scales, out, dest):
    return pool_pack_reference(frames, scales, GRID, out=out, dest=dest)


def reference_packed(frames, scales):
    return pool_pack_reference(frames, scales, GRID)


def copy_fn(nbytes: int, device):
    n = max(1, nbytes // 2)
    # Random bytes, never zeros or uninitialised memory (zeros can run faster than data).
    src = torch.randint(0, 256, (n,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def copy_fns(nbytes: int, device, n_sets: int):
    return [copy_fn(nbytes, device) for _ in range(n_sets)]
