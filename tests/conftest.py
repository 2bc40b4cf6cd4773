import os

import pytest
import torch

# The Triton kernels run on CPU under the interpreter; it must be set before triton is imported.
try:
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
def cli_here(monkeypatch, capsys):
    """``cli_here(*args)``: ``videorouter ARGS`` as ``cli.main(ARGS)`` in this process -> a
    CompletedProcess of its exit status, stdout and stderr. A subprocess pays about 7 s of torch
    and transformers imports on 2 cores; here they are paid once for the suite. The environment
    main() quiets, and the warning filters, are restored afterwards."""
    import subprocess
    import warnings
    from vr_runtime import cli
    for k, v in {"TRANSFORMERS_VERBOSITY": "error", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
                 "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
        monkeypatch.setenv(k, os.environ.get(k, v))
    monkeypatch.delenv("VIDEOROUTER_DEBUG", raising=False)

    def run(*args):
        argv = [str(a) for a in args]
        capsys.readouterr()
        with warnings.catch_warnings():
            try:
                code = cli.main(argv)
            except SystemExit as e:
                code = e.code
        out = capsys.readouterr()
        return subprocess.CompletedProcess(argv, code, out.out, out.err)
    return run


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


# Session-scoped fixtures of the tiny InternVL3 preset, shared by every test folder
# (``tiny_lm`` / ``tiny_vr``; tests/training overrides tiny_lm). Built once per session; tests
# must not mutate them (copy first).
@pytest.fixture(scope="session")
def tiny_lm():
    from vr_runtime.backbones import load_backbone
    torch.manual_seed(0)
    return load_backbone("tiny", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="session")
def tiny_vr(tiny_lm):
    """VideoRouter on the tiny model with fresh, *untrained* routers (independent of any
    routers.safetensors shipped in the assets, so results do not depend on training)."""
    from vr_runtime.routing.routers import Routers
    from vr_runtime.runtime import VideoRouter
    return VideoRouter(tiny_lm, Routers.from_backbone(tiny_lm))


@pytest.fixture
def frames():
    """A few random 448x448 'frames' (fresh per test; the seed varies with the test)."""
    def make(T=3, seed=0):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(T, 3, 448, 448, generator=g)
    return make


@pytest.fixture
def small_config():
    """Factory of a shape preset (HF config.json layout) smaller than tiny, for backbone_from_config tests."""
    import json
    from vr_runtime.backbones.tiny import ASSETS

    def make(hidden=96, layers=4, vocab=2048):
        cfg = json.loads((ASSETS / "config.json").read_text())
        cfg["text_config"].update(hidden_size=hidden, num_hidden_layers=layers, vocab_size=vocab,
                                  intermediate_size=2 * hidden, num_attention_heads=4,
                                  num_key_value_heads=2)
        cfg["vision_config"].update(hidden_size=32, num_attention_heads=2, intermediate_size=64,
                                    num_hidden_layers=1)
        cfg["image_token_id"] = 0  # rewritten by backbone_from_config to the tiny tokenizer's id
        return cfg
    return make
