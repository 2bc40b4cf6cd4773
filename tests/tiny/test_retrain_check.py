"""scripts/tiny/retrain_check.py compares weights by content: the same tensors and metadata are
the same whatever order the writer put the metadata in, and one flipped bit is not."""
import importlib.util
import pathlib

import torch
from safetensors.torch import save_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("retrain_check",
                                              ROOT / "scripts" / "tiny" / "retrain_check.py")
retrain_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(retrain_check)


def test_content_hash_sees_tensors_and_metadata_not_their_order(tmp_path):
    t = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.tensor(1.5)}
    meta = {"format": "x", "trained": "true", "backbone": "internvl3"}
    paths = []
    for i, order in enumerate((meta, dict(reversed(list(meta.items()))))):
        paths.append(tmp_path / f"w{i}.safetensors")
        save_file(t, str(paths[-1]), metadata=order)
    same = {retrain_check.content_sha256(str(p)) for p in paths}
    assert len(same) == 1
    flipped = dict(t, a=t["a"].clone())
    flipped["a"].view(torch.int32)[0, 0] ^= 1                   # one bit of one weight
    save_file(flipped, str(tmp_path / "f.safetensors"), metadata=meta)
    save_file(t, str(tmp_path / "m.safetensors"), metadata={**meta, "trained": "false"})
    for other in ("f", "m"):
        assert retrain_check.content_sha256(str(tmp_path / f"{other}.safetensors")) not in same
