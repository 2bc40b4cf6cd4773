"""Issue 21 item 7: the load-time warm-up covers every kernel variant a request can launch.

A variant is the autotuning key (D, grid, dtype, size class of the launch); the window is a
run-time branch inside one variant. The plan of launches is host arithmetic, checked here
against every request size; the launches themselves need CUDA (-m gpu)."""
import importlib
import random

import pytest
import torch

from vr_kernels import pool_pack, warmup

P = importlib.import_module("vr_kernels.pool_pack")


@pytest.mark.parametrize("grid", [(16, 16), (32, 32)])
@pytest.mark.parametrize("max_frames", [1, 64, 65, 256, 300])
def test_every_size_class_a_request_can_reach_is_warmed(max_frames, grid):
    launches = P.warmup_launches(max_frames, grid)
    warmed = {w["size_class"] for w in launches}
    assert len(warmed) == len(launches)  # one launch per class, none twice
    rng = random.Random(max_frames)
    reachable = set()
    for T in range(1, max_frames + 1, max(1, max_frames // 40)):
        for scales in ([1] * T, [rng.choice([0, 1, 2, 4, 8]) for _ in range(T)], [8] * T):
            if any(scales):
                reachable.add(P.size_class(P._forward_tiles(scales, grid)))
    reachable.add(P.size_class(P._forward_tiles([1] * max_frames, grid)))
    assert reachable <= warmed
    for w in launches:  # what is launched is what is reported, and never more than max_frames
        assert w["frames"] == len(w["windows"]) <= max_frames
        assert P.size_class(P._forward_tiles(w["windows"], grid)) == w["size_class"]


def test_launches_cycle_through_the_planners_windows_at_each_class_top():
    launches = P.warmup_launches(256)
    assert [(w["frames"], w["size_class"]) for w in launches] == [(64, 0), (256, 1)]
    for w in launches:
        assert set(w["windows"]) == set(P.PLANNER_WINDOWS)
    with pytest.raises(ValueError, match="max_frames"):
        P.warmup_launches(0)


def test_cpu_warmup_is_skipped_with_a_reason():
    assert "cpu" in warmup(64, torch.float32, "cpu")["skipped"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_after_warmup_no_request_compiles_or_tunes():
    D = 96  # a hidden size no other test uses, so the kernel caches start empty for it
    info = warmup(D, torch.bfloat16, "cuda", max_frames=80)
    assert info["size_classes"] == [0, 1] and not info["backward"]
    assert {(w["form"], w["size_class"]) for w in info["launches"]} == \
        {(f, c) for f in ("packed", "out+dest") for c in (0, 1)}
    before = dict(P._pool_pack_fwd_kernel.cache)
    for T, scales in ((3, [2, 0, 4]), (80, [1] * 80), (70, [4] * 70)):
        z = torch.randn(T, 256, D, device="cuda", dtype=torch.bfloat16)
        pool_pack(z, scales, (16, 16))
    torch.cuda.synchronize()
    assert dict(P._pool_pack_fwd_kernel.cache) == before
