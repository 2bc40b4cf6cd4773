"""Per-stage wall-clock timers and peak memory.

CUDA work is asynchronous, so each stage synchronises the device before reading the clock at its
start and end; otherwise a stage would be charged for the kernels queued by the one before it.
Peak memory comes from two places: ``torch.cuda.max_memory_allocated`` (tensors of this process)
and NVML's used memory of the device (includes the CUDA context, the caching allocator's
reserve and other processes), sampled at the end of each stage. Both are guarded, so CPU runs
report ``None`` for them; on CPU a timer made with ``resident=True`` (one per request) instead
resets the process's resident high-water mark and reports it (``vr_runtime.telemetry.memory``).
"""
from __future__ import annotations

import contextlib
import time
from typing import Dict, Optional

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _NVML:
    def __init__(self, device: torch.device):
        self.handle = None
        if device.type != "cuda":
            return
        try:
            import pynvml
            pynvml.nvmlInit()
            from .nvml import nvml_handle
            idx = device.index if device.index is not None else torch.cuda.current_device()
            # NVML numbers devices physically: matched by UUID, so CUDA_VISIBLE_DEVICES given
            # as indices, UUIDs or MIG instances reads the GPU torch uses (vr_runtime/telemetry/nvml.py)
            self.handle = nvml_handle(pynvml, idx)
            self._pynvml = pynvml
        except Exception:  # no driver library, MIG without permission, no match: report None
            self.handle = None

    def used(self) -> Optional[int]:
        if self.handle is None:
            return None
        try:
            return int(self._pynvml.nvmlDeviceGetMemoryInfo(self.handle).used)
        except Exception:
            return None


# Callables ``fn(stage, started)`` told when any timer's stage starts and ends: how a terminal
# shows which stage is running (vr_runtime.telemetry.progress). Empty unless something listens.
_listeners: list = []


@contextlib.contextmanager
def stage_listener(fn):
    """Within it, ``fn(stage_name, started: bool)`` is called at each stage's start and end."""
    _listeners.append(fn)
    try:
        yield
    finally:
        _listeners.remove(fn)


class StageTimer:
    """``with timer.stage("vision"): ...`` accumulates seconds per stage name."""

    def __init__(self, device="cpu", resident: bool = False):
        """``resident``: on CPU, reset and then report the process's resident high-water mark
        (one timer per request does; a batch's own timer does not, or it would wipe the
        requests' peaks)."""
        self.device = torch.device(device)
        self.times: Dict[str, float] = {}
        # perf_counter() when each stage last ended: the wall time to the first token is the
        # end of "prefill" (the first token is its output) from the request's start
        self.ended: Dict[str, float] = {}
        self.started = time.perf_counter()
        self._nvml = _NVML(self.device)
        self.nvml_peak: Optional[int] = self._nvml.used()
        self.resident = None
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        elif resident:
            from .memory import ResidentPeak
            self.resident = ResidentPeak().start()

    @contextlib.contextmanager
    def stage(self, name: str):
        _sync(self.device)
        t0 = time.perf_counter()
        for fn in list(_listeners):
            fn(name, True)
        try:
            yield
        finally:
            _sync(self.device)
            self.ended[name] = time.perf_counter()
            self.times[name] = self.times.get(name, 0.0) + self.ended[name] - t0
            for fn in list(_listeners):
                fn(name, False)
            used = self._nvml.used()
            if used is not None:
                self.nvml_peak = max(self.nvml_peak or 0, used)

    def add(self, name: str, seconds: float) -> None:
        self.times[name] = self.times.get(name, 0.0) + float(seconds)

    def get(self, name: str) -> float:
        return self.times.get(name, 0.0)

    def torch_peak(self) -> Optional[int]:
        if self.device.type != "cuda":
            return None
        return int(torch.cuda.max_memory_allocated(self.device))

    def peak(self, weights_on_device: int = 0):
        """-> (peak bytes, what it measures, activation bytes): CUDA, the allocator's peak and
        that peak minus ``weights_on_device``; CPU with ``resident``, the process's resident
        high-water mark and its rise over the request's start; else (None, None, None)."""
        from .memory import CUDA_PEAK_SOURCE
        if self.device.type == "cuda":
            p = self.torch_peak()
            return p, CUDA_PEAK_SOURCE, max(p - int(weights_on_device), 0)
        if self.resident is not None:
            p, source = self.resident.peak()
            return p, source, self.resident.rise()
        return None, None, None


__all__ = ["StageTimer", "stage_listener"]
