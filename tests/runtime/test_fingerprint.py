"""vr_runtime/fingerprint.py: the weights identity eval's resume compares."""
import shutil

import pytest

from vr_runtime import fingerprint as fp
from vr_runtime.backbones.tiny import ASSETS


def test_small_files_any_byte_counts(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(ASSETS, d)
    first = fp.weights_fingerprint(d)
    assert len(first) == 16 and first == fp.weights_fingerprint(str(d))
    (d / "config.json").write_text("{}")          # not a weight file
    assert fp.weights_fingerprint(d) == first
    f = d / "model.safetensors"
    for i in (0, f.stat().st_size // 3, f.stat().st_size - 1):
        data = bytearray(f.read_bytes())
        data[i] ^= 1
        f.write_bytes(bytes(data))
        assert fp.weights_fingerprint(d) != first, i
        data[i] ^= 1
        f.write_bytes(bytes(data))
        assert fp.weights_fingerprint(d) == first
    (d / "routers.safetensors").rename(d / "routers2.safetensors")
    assert fp.weights_fingerprint(d) != first


def test_large_files_head_middle_and_tail_count(tmp_path, monkeypatch):
    monkeypatch.setattr(fp, "CHUNK", 1000)
    f = tmp_path / "w.safetensors"
    f.write_bytes(bytes(range(256)) * 40)           # 10,240 bytes: chunks at 0, 4620, 9240
    first = fp.weights_fingerprint(f)
    for i, counts in ((10, True), (2000, False), (5000, True), (8000, False), (10_000, True)):
        data = bytearray(f.read_bytes())
        data[i] ^= 1
        f.write_bytes(bytes(data))
        assert (fp.weights_fingerprint(f) != first) is counts, i
        data[i] ^= 1
        f.write_bytes(bytes(data))
    f.write_bytes(f.read_bytes() + b"\0")           # the size counts
    assert fp.weights_fingerprint(f) != first


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen2.5-vl"])
def test_presets_and_missing_paths(name):
    assert fp.weights_fingerprint(None) is None
    a = fp.weights_fingerprint(name)
    assert a == fp.weights_fingerprint(name) and a != fp.weights_fingerprint("/nonexistent/m")
    assert fp.weights_fingerprint("tiny") != fp.weights_fingerprint("tiny-qwen2.5-vl")
