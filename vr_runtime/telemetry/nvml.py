"""Which NVML device is torch's ``cuda:i``.

torch numbers the GPUs it sees after ``CUDA_VISIBLE_DEVICES`` (which may list indices, GPU
UUIDs or MIG instances, in any order), NVML numbers every GPU of the machine physically. So a
handle taken by index reads another GPU as soon as that variable reorders, filters or names
devices by UUID. Both sides know each device's UUID: torch as
``get_device_properties(i).uuid`` (a MIG instance's own UUID under MIG), NVML through
``nvmlDeviceGetHandleByUUID("GPU-..." | "MIG-...")``, which is the match used first.

Older torch builds without ``uuid``: the PCI bus id (not under MIG, where every instance shares
its parent's bus and the reading would be the whole GPU's), then a plain list of indices in
``CUDA_VISIBLE_DEVICES``. When none applies the lookup raises rather than reading a GPU that may
be the wrong one; callers report the memory as unavailable.
"""
from __future__ import annotations

import os
from typing import List, Optional


def _visible() -> Optional[List[str]]:
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    return None if vis is None else [v.strip() for v in vis.split(",") if v.strip()]


def uuid_names(uuid) -> List[str]:
    """NVML's spellings of a torch device UUID: torch prints the bare 8-4-4-4-12 hex form,
    NVML prefixes it with ``GPU-`` for a whole GPU and ``MIG-`` for a MIG instance."""
    u = str(uuid).strip()
    if u.upper().startswith(("GPU-", "MIG-")):
        return [u]
    return [f"GPU-{u}", f"MIG-{u}"]


def nvml_handle(pynvml, index: int):
    """The NVML handle of torch's ``cuda:index`` (``pynvml`` initialised by the caller)."""
    import torch
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    tried = []
    if uuid is not None:
        for name in uuid_names(uuid):
            try:
                return pynvml.nvmlDeviceGetHandleByUUID(name)
            except pynvml.NVMLError as e:
                tried.append(f"{name}: {e}")
    visible = _visible()
    mig = any(v.upper().startswith("MIG") for v in visible or ())
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None and not mig:
        dom = getattr(props, "pci_domain_id", 0)
        dev = getattr(props, "pci_device_id", 0)
        try:
            return pynvml.nvmlDeviceGetHandleByPciBusId(f"{dom:08x}:{bus:02x}:{dev:02x}.0")
        except pynvml.NVMLError as e:
            tried.append(f"PCI bus {bus:02x}: {e}")
    if visible is None:
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    if index < len(visible) and visible[index].isdigit():
        return pynvml.nvmlDeviceGetHandleByIndex(int(visible[index]))
    raise LookupError(f"cuda:{index}: no NVML device matches it (CUDA_VISIBLE_DEVICES="
                      f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}; tried "
                      f"{'; '.join(tried) or 'no UUID from torch'})")


__all__ = ["nvml_handle", "uuid_names"]
