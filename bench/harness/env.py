"""What every results file names: the device, the date, the library versions and the command."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
from typing import Dict, Optional

import torch


def has_cuda() -> bool:
    return torch.cuda.is_available()


def device_name(device: Optional[torch.device] = None) -> str:
    """Human-readable name of the device a benchmark runs on (GPU model, or the CPU)."""
    if device is None:
        device = torch.device("cuda" if has_cuda() else "cpu")
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:  # Linux: the model name is more useful than the architecture
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"CPU: {cpu} ({os.cpu_count()} logical cores, {torch.get_num_threads()} torch threads)"


def _version(mod: str) -> Optional[str]:
    try:
        m = __import__(mod)
        return getattr(m, "__version__", "?")
    except Exception:
        return None


def command_line() -> str:
    """The command as it was typed: ``python -m bench.scripts.X ...`` for a module run with -m
    (sys.argv[0] is then the file's absolute path, which says less), else ``python FILE ...``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name and not spec.name.startswith("pytest"):
        return " ".join(["python", "-m", spec.name.removesuffix(".__main__")] + sys.argv[1:])
    return " ".join(["python"] + sys.argv)


def environment(device: Optional[torch.device] = None) -> Dict[str, object]:
    """Everything a results file must name: device, date, versions, command."""
    env = {
        "device": device_name(device),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command_line(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "transformers": _version("transformers"),
        "cuda": torch.version.cuda,
        "platform": platform.platform(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0"),
    }
    try:  # CPU figures on a shared machine mean little without the load they ran under
        env["load_avg_1m"] = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        pass
    if has_cuda():
        props = torch.cuda.get_device_properties(0)
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        env["gpu_sm_count"] = props.multi_processor_count
    return env


def environment_line(env: Dict[str, object], versions: tuple = ("torch",), load: bool = True) -> str:
    """The line under a results file's title: device, versions, date, command and (for CPU
    figures on a shared machine) the load they ran under."""
    parts = [str(env["device"])] + [f"{v} {env.get(v)}" for v in versions]
    parts += [str(env["date_utc"]), f"command: `{env['command']}`"]
    if load:
        parts.append(f"1-min load average {env.get('load_avg_1m')}")
    return "; ".join(parts)
