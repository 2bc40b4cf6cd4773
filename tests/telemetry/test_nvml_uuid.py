"""torch's cuda:i is matched to its NVML device by UUID (vr_runtime/telemetry/nvml.py), with a fake NVML
and fake device properties: no GPU needed. Two physical GPUs (NVML index 0 and 1) and one MIG
instance on GPU 1; CUDA_VISIBLE_DEVICES reorders or names them, so index 0 in torch is not
NVML's index 0."""
import sys
import types

import pytest
import torch

U0 = "11111111-aaaa-bbbb-cccc-000000000000"
U1 = "22222222-aaaa-bbbb-cccc-000000000001"
UMIG = "33333333-aaaa-bbbb-cccc-000000000002"
MEMORY = {0: 1000, 1: 2000, "mig": 300}     # used bytes per NVML device


class NVMLError(Exception):
    pass


def fake_pynvml(calls):
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    by_uuid = {f"GPU-{U0}": 0, f"GPU-{U1}": 1, f"MIG-{UMIG}": "mig"}
    by_bus = {"00000000:17:00.0": 0, "00000000:65:00.0": 1}

    def lookup(table, key, how):
        calls.append((how, key))
        if key not in table:
            raise NVMLError("Not Found")
        return ("handle", table[key])
    m.nvmlInit = lambda: None
    m.nvmlDeviceGetHandleByUUID = lambda u: lookup(by_uuid, u, "uuid")
    m.nvmlDeviceGetHandleByPciBusId = lambda b: lookup(by_bus, b, "bus")
    m.nvmlDeviceGetHandleByIndex = lambda i: lookup({0: 0, 1: 1}, i, "index")
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=MEMORY[h[1]])
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: []
    return m


@pytest.fixture
def gpus(monkeypatch):
    """``set(visible, [props of cuda:0, cuda:1, ...])`` -> the list of NVML lookups made."""
    calls = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(calls))

    def set_(visible, props):
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
        return calls
    return set_


def _props(uuid=None, bus=None):
    p = types.SimpleNamespace(pci_bus_id=bus, pci_domain_id=0, pci_device_id=0)
    if uuid is not None:
        p.uuid = uuid
    return p


def _used(index):
    from vr_runtime.telemetry.timing import _NVML
    return _NVML(torch.device(f"cuda:{index}")).used()


def test_uuids_in_visible_devices_read_the_right_gpu(gpus):
    # torch's cuda:0 is physical GPU 1: by index NVML would read GPU 0's 1000 bytes
    calls = gpus(f"GPU-{U1},GPU-{U0}", [_props(U1, 0x65), _props(U0, 0x17)])
    assert _used(0) == MEMORY[1] and _used(1) == MEMORY[0]
    assert calls[0] == ("uuid", f"GPU-{U1}")
    assert not [c for c in calls if c[0] == "index"]


def test_mig_instance_reads_the_instance_not_its_gpu(gpus):
    # a MIG instance has its own UUID; its bus id is its parent's (GPU 1)
    calls = gpus(f"MIG-{UMIG}", [_props(UMIG, 0x65)])
    assert _used(0) == MEMORY["mig"]
    assert calls[-1] == ("uuid", f"MIG-{UMIG}")


def test_mig_without_a_uuid_match_reports_nothing_rather_than_the_whole_gpu(gpus):
    calls = gpus("MIG-44444444-0000-0000-0000-000000000000", [_props(None, 0x65)])
    assert _used(0) is None
    assert not [c for c in calls if c[0] in ("bus", "index")]
    from vr_runtime.telemetry.nvml import nvml_handle
    with pytest.raises(LookupError, match="cuda:0: no NVML device matches"):
        nvml_handle(sys.modules["pynvml"], 0)


def test_older_torch_without_uuid_falls_back_to_bus_then_index_list(gpus):
    gpus("1,0", [_props(None, 0x65), _props(None, 0x17)])
    assert (_used(0), _used(1)) == (MEMORY[1], MEMORY[0])
    gpus("1,0", [_props(None, None), _props(None, None)])    # no bus id either
    assert (_used(0), _used(1)) == (MEMORY[1], MEMORY[0])
    gpus(None, [_props(None, None)])
    assert _used(0) == MEMORY[0]


def test_bench_nvml_reader_uses_the_same_match(gpus):
    from bench.models import e2e_memory
    gpus(f"GPU-{U1},GPU-{U0}", [_props(U1, 0x65), _props(U0, 0x17)])
    read, scope = e2e_memory.nvml_reader(0)
    assert scope == "device" and read() == MEMORY[1]
    gpus("MIG-44444444-0000-0000-0000-000000000000", [_props(None, 0x65)])
    read, scope = e2e_memory.nvml_reader(0)
    assert read is None and "no NVML device matches" in scope
