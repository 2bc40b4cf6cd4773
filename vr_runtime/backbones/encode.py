"""The vision stage over a frame stream: the tower encodes ``chunk`` routing units a call while
the next chunk is decoded and resized on worker threads (:mod:`vr_runtime.video.frames`); each
chunk's pixels are dropped once encoded, so only Z accumulates. The chunks are the ones
``Backbone.encode_frames`` makes of the same units at once, so Z is the same, bit for bit.

:class:`VisionEncoder` is how the runtime calls the tower: eagerly on the request's chunks (the
default), or on chunks of one fixed size, compiled (``vision_compile``; :mod:`.compiled`)."""
from __future__ import annotations

import time
from typing import Optional, Sequence

import torch

from .compiled import FixedChunks, check_chunk, resolve_compile

# Units a call when the tower is compiled and no chunk is given: the request's default chunk
# (one shape for every call, so one compiled graph).
COMPILED_CHUNK = 16


class VisionEncoder:
    """The tower and projector of ``lm`` as the vision stage calls them: ``compile`` one of
    ``backbones.compiled.COMPILE_CHOICES`` (``auto``: the device's default); ``chunk`` units a
    call, the last chunk padded (None: eager runs take the request's chunks as they come, a
    compiled tower :data:`COMPILED_CHUNK`)."""

    def __init__(self, lm, chunk: Optional[int] = None, compile: str = "auto"):
        self.lm = lm
        self.mode = resolve_compile(compile, lm.device, "vision_compile")
        chunk = check_chunk(chunk, "vision_chunk")
        if chunk is None and self.mode != "off":
            chunk = COMPILED_CHUNK
        self.chunk = chunk
        self._run = FixedChunks(self._encode, chunk, self.mode)

    def _encode(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.lm.encode_chunk(pixel_values)

    @property
    def eager(self) -> bool:
        """The path before this class: the request's chunks, each encoded as it comes."""
        return self.mode == "off" and self.chunk is None

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Units [n, 3k, H, W] -> Z [n, H*W, D] on the model's device, no grad."""
        if self.eager:
            return self.lm.encode_frames(pixel_values, max(1, int(pixel_values.shape[0])))
        p = next(self.lm.projector().parameters())
        return self._run(pixel_values.to(device=p.device, non_blocking=True))

    def warm_up(self) -> dict:
        """Compile the tower now on one chunk of random pixels (eager: nothing to do)."""
        if self.eager:
            return {"mode": self.mode, "chunk": None, "seconds": 0.0}
        spec, k = self.lm.frame_spec, self.lm.frames_per_unit
        x = torch.randn(self.chunk, 3 * k, *spec.size, generator=torch.Generator().manual_seed(0))
        with torch.inference_mode():
            return self._run.warm_up(x.to(self.lm.device))


def encode_stream(lm, frames, units: Optional[Sequence[int]], chunk: int, timer,
                  retain: bool = False,
                  encoder: Optional[VisionEncoder] = None) -> Optional[torch.Tensor]:
    """Z [len(units), H*W, D] of ``frames``' ``units`` (all when None) on backbone ``lm``.
    Time spent waiting for frames goes to ``timer``'s "frames_wait", the tower's own to
    "vision". ``retain``: keep every unit's pixels on ``frames`` too (a scorer that reads
    them; only when every unit is encoded). ``encoder``: how the tower runs (default: eagerly,
    ``chunk`` units a call); a fixed-chunk encoder streams its own chunk size."""
    if encoder is not None and encoder.chunk is not None:
        chunk = encoder.chunk
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
                z = lm.encode_frames(pv, chunk) if encoder is None else encoder(pv)
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


__all__ = ["COMPILED_CHUNK", "VisionEncoder", "encode_stream"]
