"""What a results file written by the runtime's own commands (eval tables, routing-eval, the
label tools) names about where it ran: device, date, Python, torch and transformers versions.
The benchmarks' fuller record (command, triton, load, GPU memory) is bench/common.py's."""
from __future__ import annotations

import datetime
import platform


def environment() -> dict:
    import torch
    import transformers
    dev = "cpu"
    if torch.cuda.is_available():
        dev = torch.cuda.get_device_name(0)
    return {"device": dev, "cpu": platform.processor() or platform.machine(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__}
