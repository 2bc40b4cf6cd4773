"""The vision stage over a frame stream: the tower encodes ``chunk`` routing units a call while
the next chunk is decoded and resized on worker threads (:mod:`vr_runtime.video.frames`); each
chunk's pixels are dropped once encoded, so only Z accumulates. The chunks are the ones
``Backbone.encode_frames`` makes of the same units at once, so Z is the same, bit for bit."""
from __future__ import annotations

import time
from typing import Optional, Sequence

import torch


def encode_stream(lm, frames, units: Optional[Sequence[int]], chunk: int, timer,
                  retain: bool = False) -> Optional[torch.Tensor]:
    """Z [len(units), H*W, D] of ``frames``' ``units`` (all when None) on backbone ``lm``.
    Time spent waiting for frames goes to ``timer``'s "frames_wait", the tower's own to
    "vision". ``retain``: keep every unit's pixels on ``frames`` too (a scorer that reads
    them; only when every unit is encoded)."""
    units = list(range(frames.T)) if units is None else list(units)
    if not units:
        return None
    Z, row, kept = None, 0, [] if retain else None
    chunks = frames.unit_chunks(units, chunk, lm.device)
    try:
        while True:
            t0 = time.perf_counter()
            pv = next(chunks, None)
            timer.add("frames_wait", time.perf_counter() - t0)
            if pv is None:
                break
            with timer.stage("vision"):
                z = lm.encode_frames(pv, chunk)
                if Z is None:
                    Z = z.new_empty(len(units), *z.shape[1:])
                Z[row:row + z.shape[0]].copy_(z)
            row += z.shape[0]
            if kept is not None:
                kept.append(pv.cpu())
            del pv, z
    finally:
        chunks.close()       # stops and joins the decoding workers, also on an error
    frames.finished()
    if kept is not None and len(units) == frames.T:
        frames.pixel_values = torch.cat(kept)
    return Z


__all__ = ["encode_stream"]
