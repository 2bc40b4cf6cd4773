"""A short identity of a model's weights, cheap even for a 16 GB checkpoint.

``videorouter eval`` resumes a run from the predictions already in its ``--out``. The model's
*name* does not say whether its weights are the ones those predictions were made with: the
``tiny`` preset's shipped weights change when ``scripts/tiny/train_tiny.sh --install`` retrains
them, and a local directory can be overwritten in place. The fingerprint does: it hashes, for
each weight file, its name, its size and its first, middle and last 4 MiB (the whole file when
it is smaller than 12 MiB). Retraining changes every tensor, so it changes the fingerprint;
reading 12 MiB a shard keeps it to milliseconds a checkpoint. It is an identity for a resume
check, not a checksum against corruption.

:func:`environment` is the other half of a results file's identity: where it ran (device,
date, Python, torch and transformers versions), as eval tables, routing-eval and the label
tools write it. The benchmarks' fuller record (command, triton, load, GPU memory) is
bench.harness.env's."""
from __future__ import annotations

import datetime
import hashlib
import pathlib
import platform
from typing import List, Optional, Union

CHUNK = 4 << 20
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def _weight_files(path: pathlib.Path) -> List[pathlib.Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    return []


def _preset_dir(name: str) -> Optional[pathlib.Path]:
    """The directory a preset's shipped weights live in (``vr_runtime/assets/<name>``), if any;
    a preset without one is its deterministic fill, which its name identifies."""
    d = pathlib.Path(__file__).resolve().parent / "assets" / name
    return d if d.is_dir() else None


def weights_fingerprint(target: Union[str, pathlib.Path, None]) -> Optional[str]:
    """``target``: a preset name, a checkpoint directory, a weights file or a cached Hub id
    (resolved as ``resolve_model`` does). Returns 16 hex digits (``None`` for ``None``): the name
    and the weight files, so a preset without shipped weights (its deterministic fill) or a
    name that resolves to nothing is told apart by its name alone."""
    if target is None:
        return None
    name = str(target)
    from .backbones import PRESETS, resolve_model
    from .errors import ModelFilesError
    if name in PRESETS:
        path = _preset_dir(name)
    else:
        path = pathlib.Path(name).expanduser()
        if not path.exists():
            try:
                path = pathlib.Path(resolve_model(name))
            except ModelFilesError:   # not found: the run fails on it later, with its own message
                path = None
    h = hashlib.sha256(name.encode())
    for f in _weight_files(path) if path is not None else []:
        size = f.stat().st_size
        h.update(f"{f.name}\0{size}\0".encode())
        with open(f, "rb") as fh:
            if size <= 3 * CHUNK:
                h.update(fh.read())
                continue
            for offset in (0, (size - CHUNK) // 2, size - CHUNK):
                fh.seek(offset)
                h.update(fh.read(CHUNK))
    return h.hexdigest()[:16]


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
