"""Peak memory seen from outside PyTorch's allocator, sampled in a background thread.

``torch.cuda.max_memory_allocated`` (reported by the runtime) counts live tensors only. What a
user sizes a GPU by is what the driver hands the process: the CUDA context, cuBLAS/cuDNN
workspaces and the caching allocator's reserve. NVML reports that, but only as a current value,
so a thread polls it every couple of milliseconds while a call runs and keeps the maximum
(short spikes between two polls can be missed: the figure is a lower bound of the true peak).

On CPU the same sampler reads the process's resident set size from /proc (weights included),
which is the CPU analogue; it is labelled as such in the results.
"""
from __future__ import annotations

import contextlib

import os
import threading
from typing import Callable, Optional

Reader = Callable[[], int]


class PeakSampler:
    """``with PeakSampler(read) as s: ...`` then ``s.peak`` (bytes, or None without a reader)."""

    def __init__(self, read: Optional[Reader], interval_s: float = 0.002):
        self.read, self.interval_s = read, interval_s
        self.peak: Optional[int] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _poll(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(self.interval_s):
                return

    def _sample(self) -> None:
        v = self.read()
        if self.peak is None or v > self.peak:
            self.peak = v

    def __enter__(self) -> "PeakSampler":
        if self.read is not None:
            self._sample()
            self._thread = threading.Thread(target=self._poll, name="peak-memory", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._sample()


def rss_reader() -> Optional[Reader]:
    """Resident set size of this process in bytes (Linux /proc), or None where unavailable."""
    path = "/proc/self/statm"
    if not os.path.exists(path):
        return None
    page = os.sysconf("SC_PAGE_SIZE")

    def read() -> int:
        with open(path) as f:
            return int(f.read().split()[1]) * page
    return read


def nvml_reader(device_index: int = 0):
    """(reader, scope) for the GPU torch uses as ``device_index``; (None, reason) without NVML.

    scope is "process" when NVML lists this process (its own memory on that GPU, the figure
    that matches a single-process benchmark) and "device" when it does not (containers often
    hide PIDs): then the reading is the whole GPU's used memory, other processes included."""
    try:
        import pynvml
        import torch
        pynvml.nvmlInit()
        handle = _nvml_handle(pynvml, torch, device_index)
    except Exception as e:  # no driver, no pynvml, or an unsupported GPU: say why, don't fail
        return None, f"unavailable ({type(e).__name__}: {e})"
    pid = os.getpid()

    def process_bytes() -> Optional[int]:
        try:
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except pynvml.NVMLError:
            return None
        for p in procs:
            if p.pid == pid and p.usedGpuMemory is not None:
                return int(p.usedGpuMemory)
        return None

    if process_bytes() is not None:
        return (lambda: process_bytes() or 0), "process"
    return (lambda: int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)), "device"


def _nvml_handle(pynvml, torch, device_index: int):
    # NVML numbers GPUs physically, torch in CUDA_VISIBLE_DEVICES order (indices, UUIDs or MIG
    # instances): matched on the device's UUID (vr_runtime/telemetry/nvml.py)
    from vr_runtime.telemetry.nvml import nvml_handle
    return nvml_handle(pynvml, device_index)


def nvml_driver_version() -> Optional[str]:
    try:
        import pynvml
        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:
        return None


@contextlib.contextmanager
def routers_offloaded(vr, enabled: bool = True):
    """Baseline rows (Dense, Budget, Uniform) are plain InternVL3: no router in memory. On a GPU
    the VideoRouter object keeps its shadow stack resident (4 decoder layers: ~1.9 GB at the 8B
    shape), which would inflate the baselines' peak memory; so while a baseline row runs the
    routers wait on the CPU (the baselines never call them) and come back afterwards. The moves
    happen outside the timed calls."""
    routers = vr.routers
    try:
        home = next(routers.parameters()).device
    except StopIteration:
        home = None
    if not enabled or home is None or home.type == "cpu":
        yield
        return
    routers.to("cpu")
    try:
        yield
    finally:
        routers.to(home)
