"""Fixed-shape, compiled runs of a stage whose rows are independent (the vision tower and its
projector here, one frame a row; the routers' shadow stack in ``vr_runtime.routing.compiled``).

A compiled function is specialised on its input shapes, and a CUDA graph replays one shape only.
A video has any number of frames, so the stage is run on chunks of exactly ``size`` rows: the
last chunk is padded by repeating its last row, and the padded rows' outputs are dropped. Each
row's output depends on that row alone, so padding changes nothing but the time of the last call;
every call then has one shape, one compiled graph and (``cudagraphs``) one captured graph.

Compile modes (``--vision-compile``, ``--router-compile``):

``off``           eager PyTorch (the path every release before this one ran)
``inductor``      ``torch.compile``: fused elementwise kernels around the library GEMMs
``max-autotune``  ``torch.compile(mode="max-autotune-no-cudagraphs")``: GEMM and attention
                  configurations benchmarked at compile time (minutes on a GPU at the 8B shape)
``cudagraphs``    ``torch.compile(mode="reduce-overhead")``: inductor's kernels recorded into a
                  CUDA graph over the fixed chunk, one launch a call (CUDA only)
``auto``          what :data:`AUTO` says for the device (``off`` until a GPU run picks)

The first call of each shape compiles (seconds to minutes); the runtime makes that call at load
(:meth:`FixedChunks.warm_up`), so no request pays it. Compiled and eager outputs agree to
floating-point reordering (tests: relative error under 1e-5 in fp32).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch

COMPILE_MODES: Dict[str, Optional[dict]] = {
    "off": None,
    "inductor": {},
    "max-autotune": {"mode": "max-autotune-no-cudagraphs"},
    "cudagraphs": {"mode": "reduce-overhead"},
}
COMPILE_CHOICES = ("auto",) + tuple(COMPILE_MODES)
# ``auto`` per device type. Eager everywhere until a GPU run of bench/gpu_run.sh measures the
# modes against each other at the real shape (docs/gpu-run.md); its results set these.
AUTO: Dict[str, str] = {"cpu": "off", "cuda": "off"}


@dataclass(frozen=True)
class CompileOptions:
    """How the runtime runs its two per-frame stages (``VideoRouter(compile=...)``): each a
    :data:`COMPILE_CHOICES` mode and a fixed chunk (None: the stage's default); and the cache
    size a compiled decode step is made for at load."""
    vision: str = "auto"
    vision_chunk: Optional[int] = None     # units a tower call
    router: str = "auto"
    router_chunk: Optional[int] = None     # frames a shadow-stack call
    # Static KV-cache slots the decode step is compiled for at load (decoding "compiled" or
    # "graph"; None: vr_runtime.generate.DEFAULT_WARM_SLOTS). Requests that fit reuse it.
    decode_slots: Optional[int] = None
    # torch.compile's caches, when anything compiles (None: vr_runtime.generate's default)
    cache_dir: Optional[str] = None


def resolve_compile(mode: str, device, what: str) -> str:
    """``mode`` checked (one of :data:`COMPILE_CHOICES`) and ``auto`` resolved for ``device``;
    ``what`` names the option in the message."""
    if mode not in COMPILE_CHOICES:
        raise ValueError(f"{what}: expected one of {', '.join(COMPILE_CHOICES)}, got {mode!r}")
    kind = torch.device(device).type
    if mode == "auto":
        return AUTO.get(kind, "off")
    if mode == "cudagraphs" and kind != "cuda":
        raise ValueError(f"{what} 'cudagraphs': CUDA graphs need a CUDA device; use 'inductor' "
                         f"or 'off' on {kind}")
    return mode


def check_chunk(size, what: str) -> Optional[int]:
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
        raise ValueError(f"{what}: expected an int >= 1 or None, got {size!r}")
    return size


class FixedChunks:
    """``fn`` (rows [n, ...] -> outputs [n, ...], each row on its own) run on ``size`` rows a
    call, compiled with ``mode`` (a resolved :data:`COMPILE_MODES` name). ``size`` None: every
    call takes the rows it is given (no padding; a compiled ``fn`` then compiles per shape)."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], size: Optional[int],
                 mode: str = "off"):
        if mode not in COMPILE_MODES:
            raise ValueError(f"mode: expected one of {', '.join(COMPILE_MODES)}, got {mode!r}")
        self.size = check_chunk(size, "size")
        self.mode = mode
        kw = COMPILE_MODES[mode]
        # dynamic=False: one graph per shape, the fixed chunk's (a symbolic shape would give up
        # the static sizes the fused kernels and a CUDA graph are made for)
        self.fn = fn if kw is None else torch.compile(fn, dynamic=False, **kw)

    def __call__(self, x: torch.Tensor, *args) -> torch.Tensor:
        """Outputs of every row of ``x`` [n, ...], in order (n may exceed ``size``); ``args``
        go to every call unchanged (their shapes must not depend on n)."""
        n = int(x.shape[0])
        if self.size is None or n == 0:
            return self._run(x, *args)
        outs = []
        for i in range(0, n, self.size):
            part = x[i:i + self.size]
            b = int(part.shape[0])
            if b < self.size:   # the last chunk: repeat its last row up to the fixed size
                part = torch.cat([part, part[-1:].expand(self.size - b, *part.shape[1:])])
            outs.append(self._run(part, *args)[:b])
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _run(self, x: torch.Tensor, *args) -> torch.Tensor:
        if self.mode != "cudagraphs":
            return self.fn(x, *args)
        # a graph's outputs live in its pool and are overwritten by its next replay: copy out
        torch.compiler.cudagraph_mark_step_begin()
        return self.fn(x, *args).clone()

    def warm_up(self, example: torch.Tensor, *args) -> dict:
        """Compile (and capture) now on ``example`` rows: the seconds it took. A compiled mode
        runs the example twice (the second call records the CUDA graph)."""
        t0 = time.perf_counter()
        runs = 1 if self.mode == "off" else 2
        for _ in range(runs):
            self(example, *args)
        if example.device.type == "cuda":
            torch.cuda.synchronize(example.device)
        return {"mode": self.mode, "chunk": self.size, "seconds": round(time.perf_counter() - t0, 3)}


__all__ = ["AUTO", "CompileOptions", "COMPILE_CHOICES", "COMPILE_MODES", "FixedChunks",
           "check_chunk", "resolve_compile"]
