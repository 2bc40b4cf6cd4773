import os

import pytest

# The Triton kernels run on CPU under the interpreter; it must be set before triton is imported.
try:
    import torch
    _cuda = torch.cuda.is_available()
except Exception:  # pragma: no cover
    _cuda = False
if not _cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if _cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def run_train_tiny():
    """``run(folder, *args)``: scripts/tiny/train_tiny.sh with a fake ``python`` first on PATH that
    records its arguments instead of training -> (CompletedProcess, [argv of each python
    call]). ``folder`` holds the fake and its log."""
    import json
    import pathlib
    import subprocess
    import sys

    script = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "tiny" / "train_tiny.sh"

    def run(folder, *args):
        bindir = folder / "bin"
        bindir.mkdir(parents=True)
        log = folder / "calls.jsonl"
        py = bindir / "python"
        py.write_text("#!/bin/sh\n"
                      f"{json.dumps(sys.executable)} -c "
                      "'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\" >> "
                      f"{json.dumps(str(log))}\n")
        py.chmod(0o755)
        env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
        p = subprocess.run(["bash", str(script), *args], env=env, capture_output=True,
                           text=True, timeout=60, cwd=str(folder))
        calls = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        return p, calls
    return run
