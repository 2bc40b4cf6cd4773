"""The Image Router's per-frame pass ``[Z_t; Emb(q)] -> shadow stack -> head`` at fixed shapes,
compiled (``router_compile``; the modes are :mod:`vr_runtime.backbones.compiled`'s).

Two sizes vary between calls in the eager path: the frames in the last chunk and the question's
length. Both are made fixed so that one compiled graph (and one CUDA graph) serves every call:

* frames: ``chunk`` frames a call, the last chunk padded by repeating a frame (each frame's
  sequence goes through the stack on its own, so the others' outputs do not change);
* the question: padded with zero rows to a multiple of ``question_bucket`` tokens. The shadow
  stack is causal, so rows after the question change nothing before them; the Image Router's
  head, which attends over every row, is given a mask that hides the padding. A new question
  length compiles only when it crosses into a new bucket.

Scores agree with the eager path to floating-point reordering (tests: relative error under 1e-5
on the logits in fp32). The question-independent visual cache (``cache_visual``) keeps its eager
path: its per-question work is the question's rows alone.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..backbones.compiled import FixedChunks, check_chunk, resolve_compile

# Question rows are padded to a multiple of this: most questions (10-40 tokens) fall in the
# first one or two buckets, each compiled once.
QUESTION_BUCKET = 32
# Rows a call, counted as frames x (frame tokens + one bucket of question): 8K rows, as the
# eager path's MAX_ROUTER_TOKENS, fill a GPU while keeping the 8B MLP intermediates near 1 GB.
ROWS_PER_CALL = 8192
# ... and at most this many frames a call: every call runs a whole chunk, so a short video's
# padding costs at most 32 frames' work (pool 2 would otherwise take 85 frames a call).
MAX_CHUNK_FRAMES = 32


class RouterRunner:
    """Fixed-shape frame logits of ``routers`` for frames of ``tokens`` rows each (the grid
    after ``router_pool``): ``chunk`` frames a call (None: as many as fit :data:`ROWS_PER_CALL`,
    at most :data:`MAX_CHUNK_FRAMES`),
    compiled with ``compile`` (``auto``: the device's default)."""

    def __init__(self, routers, tokens: int, chunk: Optional[int] = None, compile: str = "auto",
                 question_bucket: int = QUESTION_BUCKET):
        p = next(routers.parameters())
        self.routers = routers
        self.mode = resolve_compile(compile, p.device, "router_compile")
        check_chunk(question_bucket, "question_bucket")
        self.tokens = int(tokens)
        self.bucket = question_bucket
        self.chunk = check_chunk(chunk, "router_chunk") or \
            max(1, min(MAX_CHUNK_FRAMES, ROWS_PER_CALL // (self.tokens + question_bucket)))
        self._run = FixedChunks(self._frames, self.chunk, self.mode)

    def _frames(self, z: torch.Tensor, q: torch.Tensor, pos: Optional[torch.Tensor],
                mask: torch.Tensor) -> torch.Tensor:
        r = self.routers
        x = torch.cat([z, q.unsqueeze(0).expand(z.shape[0], -1, -1)], 1)
        return r.image(r.shadow(x, position_ids=pos), mask)

    def logits(self, Z: torch.Tensor, q: torch.Tensor, tokens_grid: Sequence[int]) -> torch.Tensor:
        """Z [T, N, D] (pooled already) and q [Lq, D] (widened to D) -> frame logits [T]."""
        T, N, D = Z.shape
        if N != self.tokens:
            raise ValueError(f"router runner: built for frames of {self.tokens} tokens, got {N} "
                             f"(router_pool differs from the runner's)")
        return self._run(Z, *self._args(Z, q, tokens_grid))

    def warm_up(self, tokens_grid: Sequence[int], width: int,
                question_tokens: Sequence[int] = (1,)) -> dict:
        """Compile now for each question bucket of ``question_tokens`` on random frames of
        ``width`` (Z's: the hidden size, times the DeepStack streams where there are some)."""
        p = next(self.routers.parameters())
        g = torch.Generator().manual_seed(0)
        seconds = 0.0
        for lq in question_tokens:
            Z = torch.randn(self.chunk, self.tokens, width, generator=g).to(p.device, p.dtype)
            q = torch.randn(int(lq), width, generator=g).to(p.device, p.dtype)
            with torch.inference_mode():
                seconds += self._run.warm_up(Z, *self._args(Z, q, tokens_grid))["seconds"]
        return {"mode": self.mode, "chunk": self.chunk, "question_bucket": self.bucket,
                "seconds": round(seconds, 3)}

    def _args(self, Z, q, tokens_grid):
        """The question padded to its bucket, the stack's positions and the head's mask."""
        N, D = Z.shape[1], Z.shape[2]
        Lq = int(q.shape[0])
        Lb = -(-Lq // self.bucket) * self.bucket
        qp = torch.cat([q, q.new_zeros(Lb - Lq, D)]) if Lb > Lq else q
        mask = torch.ones(self.chunk, N + Lb, dtype=torch.long, device=Z.device)
        mask[:, N + Lq:] = 0
        pos = self.routers._positions(tuple(tokens_grid), Lb, self.chunk, Z.device)
        return qp, pos, mask


__all__ = ["MAX_CHUNK_FRAMES", "QUESTION_BUCKET", "ROWS_PER_CALL", "RouterRunner"]
