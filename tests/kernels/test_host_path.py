"""The host path's caches (issue 12): validated schedules and dests are reused only for exactly
the same arguments, tile tables do not depend on dest, and bad arguments still fail after a hit."""
import pytest
import torch

from vr_kernels import pool_pack, pool_pack_reference, warmup
from vr_kernels.checks import check_args
from vr_kernels.pool_pack import TOKENS_PER_TILE
from vr_kernels.tiles import build_dest, build_tiles

X = torch.randn(3, 16, 8)
OUT = torch.zeros(40, 8)


def test_cached_schedule_does_not_accept_bools_or_floats():
    check_args(X, [1, 1, 2], (4, 4))             # cached
    for bad in ([True, 1, 2], [1.0, 1, 2], [1, (1.0, 1), 2]):
        with pytest.raises(ValueError, match="windows"):
            check_args(X, bad, (4, 4))
    with pytest.raises(ValueError, match=r"windows\[1\]"):
        check_args(X, [1, -2, 2], (4, 4))


def test_cached_dest_does_not_accept_floats_and_is_checked_per_size():
    check_args(X, [1, 1, 2], (4, 4), out=OUT, dest=[0, 16, 32])
    with pytest.raises(ValueError, match=r"dest\[1\]"):
        check_args(X, [1, 1, 2], (4, 4), out=OUT, dest=[0, 16.0, 32])
    with pytest.raises(ValueError, match=r"dest\[2\]"):   # same dest, smaller out
        check_args(X, [1, 1, 2], (4, 4), out=torch.zeros(35, 8), dest=[0, 16, 32])
    with pytest.raises(ValueError, match="overlap"):
        check_args(X, [1, 1, 2], (4, 4), out=OUT, dest=[0, 10, 32])


def test_same_schedule_same_table_any_dest():
    p1 = check_args(X, [2, 0, 1], (4, 4), out=OUT, dest=[0, 0, 10])
    p2 = check_args(X, [2, 0, 1], (4, 4), out=OUT, dest=[30, 0, 4])
    assert p1.schedule is p2.schedule
    t1, _ = build_tiles(p1, TOKENS_PER_TILE, "cpu")
    t2, _ = build_tiles(p2, TOKENS_PER_TILE, "cpu")
    assert t1 is t2                               # one table, whatever the dest
    assert build_dest(p1, "cpu").tolist() == [0, 0, 10] and build_dest(p2, "cpu").tolist() == [30, 0, 4]
    assert build_dest(p2, "cpu") is build_dest(check_args(X, [2, 0, 1], (4, 4), out=OUT, dest=[30, 0, 4]), "cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_path_with_out_after_cache_hits(dtype):
    x = torch.randn(4, 35, 6).to(dtype)
    scales, grid = [(2, 3), 0, 1, 4], (7, 5)
    for dest in ([40, 0, 0, 36], [3, 99, 60, 50], [40, 0, 0, 36]):
        out = torch.zeros(100, 6, dtype=dtype)
        want = pool_pack_reference(x, scales, grid, out=torch.zeros(100, 6, dtype=dtype), dest=dest)
        got = pool_pack(x, scales, grid, out=out, dest=dest, backend="torch")
        torch.testing.assert_close(got.float(), want.float(), atol=1e-2, rtol=8e-3)


def test_warmup_is_a_no_op_on_cpu():
    assert "skipped" in warmup(896, torch.bfloat16, "cpu")
