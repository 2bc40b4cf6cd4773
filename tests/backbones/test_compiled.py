"""The vision stage at fixed shapes, compiled (backbones.compiled, backbones.encode.VisionEncoder):
Z equals the eager tower's on fresh random frames, whatever the padding of the last chunk, for
each family whose tower differs (InternViT, Qwen2.5-VL's windowed tower, Qwen3-VL's temporal
patches with DeepStack streams). Compiled on CPU with inductor, in fp32."""
import pytest
import torch

from vr_runtime.backbones import load_backbone
from vr_runtime.backbones.compiled import (AUTO, COMPILE_CHOICES, FixedChunks, resolve_compile)
from vr_runtime.backbones.encode import COMPILED_CHUNK, VisionEncoder


def rel_err(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.fixture(scope="module", params=["tiny", "tiny-qwen2.5-vl", "tiny-qwen3-vl"])
def lm(request):
    return load_backbone(request.param)


def units(lm, n, seed):
    k = lm.frames_per_unit
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3 * k, *lm.frame_spec.size, generator=g)


def test_compiled_tower_equals_eager(lm):
    enc = VisionEncoder(lm, chunk=2, compile="inductor")
    assert enc.warm_up()["seconds"] > 0
    for seed, n in ((1, 3), (2, 2), (3, 1)):   # a padded last chunk, an exact one, one unit
        pv = units(lm, n, seed)
        with torch.inference_mode():
            ref = lm.encode_frames(pv, n)
            z = enc(pv)
        assert z.shape == ref.shape
        assert torch.isfinite(z).all()
        assert rel_err(z, ref) < 1e-5, (lm.name, n)


def test_fixed_chunks_eager_pads_and_drops(lm):
    """Eager, chunk 2 over 5 units: each unit's Z is its own (the padding rows are dropped)."""
    enc = VisionEncoder(lm, chunk=2, compile="off")
    assert not enc.eager and enc.mode == "off"
    pv = units(lm, 5, 4)
    with torch.inference_mode():
        z = enc(pv)
        alone = torch.cat([lm.encode_frames(pv[i:i + 1], 1) for i in range(5)])
    assert z.shape[0] == 5
    assert rel_err(z, alone) < 1e-5


def test_fixed_chunks_repeat_the_last_row_and_pass_args():
    calls = []

    def fn(x, scale):
        calls.append(tuple(x.shape))
        return x * scale

    run = FixedChunks(fn, 4, "off")
    x = torch.arange(10.0).view(10, 1)
    out = run(x, torch.tensor(2.0))
    assert calls == [(4, 1)] * 3                     # every call one shape
    assert torch.equal(out, x * 2)
    assert FixedChunks(fn, None, "off")(x[:3], torch.tensor(1.0)).shape == (3, 1)


def test_modes_are_checked():
    assert resolve_compile("auto", "cpu", "vision_compile") == AUTO["cpu"]
    with pytest.raises(ValueError, match="vision_compile: expected one of auto, off"):
        resolve_compile("fast", "cpu", "vision_compile")
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        resolve_compile("cudagraphs", "cpu", "router_compile")
    with pytest.raises(ValueError, match="vision_chunk: expected an int >= 1"):
        VisionEncoder(load_backbone("tiny"), chunk=0)
    assert set(COMPILE_CHOICES) == {"auto", "off", "inductor", "max-autotune", "cudagraphs"}


def test_default_chunk_when_compiled():
    lm = load_backbone("tiny")
    assert VisionEncoder(lm, compile="off").eager
    assert VisionEncoder(lm, compile="inductor").chunk == COMPILED_CHUNK


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tiny", "tiny-qwen2.5-vl", "tiny-qwen3-vl"])
@pytest.mark.parametrize("mode", ["inductor", "cudagraphs"])
def test_compiled_tower_equals_eager_cuda(name, mode):
    """On CUDA in fp32 (no TF32): the compiled tower, CUDA graphs included, gives eager's Z,
    and a graph replayed on new pixels gives theirs (its outputs are copied out)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    lm = load_backbone(name, device="cuda", dtype=torch.float32)
    enc = VisionEncoder(lm, chunk=2, compile=mode)
    enc.warm_up()
    for seed, n in ((1, 3), (2, 2)):
        pv = units(lm, n, seed).cuda()
        with torch.inference_mode():
            ref = lm.encode_frames(pv, n)
            z = enc(pv)
        assert rel_err(z, ref) < 1e-4, (name, mode, n)
