"""How many threads decode: the cores this process may use (CPU affinity, capped by a cgroup
CPU quota), and the check of a ``decode_workers=`` value."""
from __future__ import annotations

import math
import os
from typing import Optional

import numpy as np

from ..errors import VideoError

__all__ = ["default_workers", "resolve_workers"]


# cgroup v2's "QUOTA PERIOD" file, then v1's quota and period files
_CGROUP_CPU_FILES = (("/sys/fs/cgroup/cpu.max", None),
                     ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us"))


def _cgroup_cpus() -> Optional[float]:
    """The CPUs a cgroup quota allows (v2 cpu.max, v1 cfs quota/period); None if unlimited."""
    for quota_f, period_f in _CGROUP_CPU_FILES:
        try:
            with open(quota_f) as f:
                parts = f.read().split()
            if period_f is not None:
                with open(period_f) as f:
                    parts = parts[:1] + f.read().split()[:1]
            if not parts or parts[0] in ("max", "-1"):
                return None
            quota, period = float(parts[0]), float(parts[1]) if len(parts) > 1 else 100000.0
            if quota > 0 and period > 0:
                return quota / period
        except (OSError, ValueError, IndexError):
            continue
    return None


def default_workers() -> int:
    """Cores this process may use: its CPU affinity (taskset, container cpusets), capped by a
    cgroup CPU quota (docker --cpus, Kubernetes limits), at least 1."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _cgroup_cpus()
    if quota is not None:
        n = min(n, max(1, int(math.ceil(quota))))
    return max(1, n)


def resolve_workers(workers) -> int:
    """Check a ``decode_workers=`` value: None -> :func:`default_workers`, else an int >= 1."""
    if workers is None:
        return default_workers()
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise VideoError(f"decode_workers: expected an integer >= 1 (or None: the cores "
                         f"available), got {workers!r}")
    return int(workers)
