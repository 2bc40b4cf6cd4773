"""Memory of a request: the weights a runtime holds, and peaks that CPU runs can report too.

* :func:`weight_bytes` -- parameter and buffer bytes of the language model, its vision tower and
  projector, the routers' shadow stack (a copy of the first ``k`` decoder layers: ~1.7 GiB in
  bf16 at InternVL3-8B's shape with k = 4) and the router heads. The report subtracts them from
  the peak: what is left is the request's own (activation) memory.
* :class:`ResidentPeak` -- the process's resident high-water mark over one request (CPU's
  ``peak_memory_bytes``): Linux's ``VmHWM``, reset at the request's start by writing ``5`` to
  ``/proc/self/clear_refs`` where that is permitted; otherwise ``ru_maxrss``, the high-water mark
  since the process started (labelled so). It counts everything resident -- weights, libraries,
  the allocator's retained heap -- so the activation figure derived from it is the rise over
  the resident set at the request's start.
* :class:`TorchAllocationPeak` -- the peak of live bytes that PyTorch's CPU allocator handed out
  inside a block, above what was live when it started, from the profiler's memory events
  (every allocation and free the allocator reports, in order). Exact for tensors, blind to
  memory outside PyTorch; costs the profiler's overhead, so benchmarks and tests use it, the
  runtime does not.
"""
from __future__ import annotations

import sys
from typing import Dict, Optional, Tuple

import torch

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"

CUDA_PEAK_SOURCE = "CUDA: torch.cuda.max_memory_allocated over the request (tensors)"
CPU_HWM_SOURCE = ("CPU: the process's resident high-water mark over the request (VmHWM, reset "
                  "at the request's start via /proc/self/clear_refs)")
CPU_MAXRSS_SOURCE = ("CPU: the process's resident high-water mark since it started (ru_maxrss; "
                     "resetting VmHWM is not permitted here)")


def _module_bytes(m: Optional[torch.nn.Module], seen: set) -> int:
    if m is None:
        return 0
    n = 0
    for t in list(m.parameters()) + list(m.buffers()):
        key = (t.device, t.data_ptr()) if t.numel() else None
        if key is not None and key in seen:   # tied weights count once
            continue
        if key is not None:
            seen.add(key)
        n += t.numel() * t.element_size()
    return n


def weight_bytes(vr) -> Dict[str, int]:
    """Bytes of what a :class:`~vr_runtime.runtime.VideoRouter` keeps loaded, by part
    (:func:`backbone_weight_bytes` of its backbone and routers)."""
    return backbone_weight_bytes(vr.lm, vr.routers)


def backbone_weight_bytes(lm, routers) -> Dict[str, int]:
    """Bytes of a backbone ``lm`` and its ``routers``, by part: ``language_model`` (decoder,
    embeddings, LM head), ``vision`` (tower + projector), ``shadow_stack`` (the routers' decoder
    layers), ``router_heads`` (Semantic + Image Router), ``total``; each tensor counted once."""
    seen: set = set()
    vision = _module_bytes(lm.vision_tower(), seen) + _module_bytes(lm.projector(), seen)
    shadow = _module_bytes(getattr(routers, "shadow", None), seen)
    heads = (_module_bytes(getattr(routers, "semantic", None), seen)
             + _module_bytes(getattr(routers, "image", None), seen))
    language = _module_bytes(lm.model, seen)   # the rest of the model: decoder, embeddings, head
    return {"language_model": language, "vision": vision, "shadow_stack": shadow,
            "router_heads": heads, "total": language + vision + shadow + heads}


def device_weight_bytes(vr, device) -> int:
    """Bytes of the runtime's weights that live on ``device`` (what a CUDA peak includes)."""
    return backbone_device_weight_bytes(vr.lm, vr.routers, device)


def backbone_device_weight_bytes(lm, routers, device) -> int:
    """Bytes of ``lm``'s and ``routers``' weights that live on ``device``."""
    device = torch.device(device)
    seen: set = set()
    n = 0
    for m in (lm.model, routers):
        for t in list(m.parameters()) + list(m.buffers()):
            if t.device.type != device.type or not t.numel():
                continue
            key = (t.device, t.data_ptr())
            if key not in seen:
                seen.add(key)
                n += t.numel() * t.element_size()
    return n


def _status_kib(field: str) -> Optional[int]:
    try:
        with open(_STATUS) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class ResidentPeak:
    """The process's resident high-water mark from now on (CPU).

    ``start()`` resets ``VmHWM`` (``/proc/self/clear_refs``) when permitted and reads the
    resident set; ``peak()`` -> (bytes, label); ``rise()`` -> bytes above the resident set at
    ``start`` (None when the reset was not possible: ``ru_maxrss`` covers the whole process
    life, so a rise from it would mean nothing)."""

    def __init__(self):
        self.reset_ok = False
        self.start_rss: Optional[int] = None

    def start(self) -> "ResidentPeak":
        try:
            with open(_CLEAR_REFS, "w") as f:
                f.write("5")
            self.reset_ok = True
        except OSError:
            self.reset_ok = False
        self.start_rss = _status_kib("VmRSS")
        return self

    def peak(self) -> Tuple[Optional[int], str]:
        if self.reset_ok:
            hwm = _status_kib("VmHWM")
            if hwm is not None:
                return hwm, CPU_HWM_SOURCE
        try:
            import resource
        except ImportError:   # no getrusage (Windows): no CPU figure
            return None, None
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss   # KiB on Linux, bytes on macOS
        return rss * (1 if sys.platform == "darwin" else 1024), CPU_MAXRSS_SOURCE

    def rise(self) -> Optional[int]:
        if not self.reset_ok or self.start_rss is None:
            return None
        hwm = _status_kib("VmHWM")
        return None if hwm is None else max(hwm - self.start_rss, 0)


class TorchAllocationPeak:
    """``with TorchAllocationPeak() as p: ...`` then ``p.peak``: the most bytes PyTorch's CPU
    allocator had handed out at once inside the block, above what was live at its start (the
    profiler's memory events, summed in order). ``p.allocated``: bytes still live at the end."""

    label = "CPU: PyTorch CPU allocator, peak live bytes above the block's start (profiler memory events)"

    def __init__(self):
        self.peak: Optional[int] = None
        self.allocated: Optional[int] = None
        self._prof = None

    def __enter__(self) -> "TorchAllocationPeak":
        from torch.profiler import ProfilerActivity, profile
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._prof.__exit__(*exc)
        events = [(e.start_ns(), e.nbytes()) for e in self._prof.profiler.kineto_results.events()
                  if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")]
        events.sort(key=lambda x: x[0])
        live = peak = 0
        for _, n in events:
            live += n
            peak = max(peak, live)
        self.peak, self.allocated = peak, live
        self._prof = None


__all__ = ["weight_bytes", "device_weight_bytes", "backbone_weight_bytes",
           "backbone_device_weight_bytes", "ResidentPeak", "TorchAllocationPeak",
           "CUDA_PEAK_SOURCE", "CPU_HWM_SOURCE", "CPU_MAXRSS_SOURCE"]
