"""Host-side checks (every bad argument -> ValueError naming it) and the tile tables
(work balance, coverage, int32 entries that stay valid past 2**31 elements)."""
import pytest
import torch

from vr_kernels import PoolPackArgError, pool_pack, pool_pack_reference, pooled_counts
from vr_kernels.checks import LaunchPlan, check_args
from vr_kernels.pool_pack import CPU_TRITON
from vr_kernels.tiles import build_dest, build_tiles, tile_table

X = torch.randn(3, 16, 8)
OUT = torch.zeros(40, 8)

BAD = [
    (dict(frames=torch.randn(16, 8)), "frames"),                       # wrong rank
    (dict(frames=[[0.0]]), "frames"),                                  # not a tensor
    (dict(frames=torch.randint(0, 5, (3, 16, 8))), "frames"),          # unsupported dtype
    (dict(grid=(4, 5)), "grid"),                                       # H*W != N
    (dict(grid=(4,)), "grid"),                                         # bad grid
    (dict(grid=(0, 16)), "grid"),
    (dict(windows=[1, 2]), "windows"),                                 # wrong length
    (dict(windows=2), "windows"),                                      # not a sequence
    (dict(windows=[1, -1, 2]), r"windows\[1\]"),                       # window < 1
    (dict(windows=[1, (0, 2), 2]), r"windows\[1\]"),
    (dict(windows=[1, 1.5, 2]), r"windows\[1\]"),
    (dict(windows=[1, (1, 2, 3), 2]), r"windows\[1\]"),
    (dict(windows=[True, 1, 1]), r"windows\[0\]"),
    (dict(out=OUT), "dest"),                                           # dest missing
    (dict(dest=[0, 4, 8]), "dest"),                                    # dest without out
    (dict(out=OUT, dest=[0, 4]), "dest"),                              # wrong length
    (dict(out=OUT, dest=[0, 2, 20]), "dest"),                          # overlapping blocks
    (dict(out=OUT, dest=[0, 16, 40]), r"dest\[2\]"),                   # out of range
    (dict(out=OUT, dest=[-1, 16, 20]), r"dest\[0\]"),
    (dict(out=OUT, dest=[0, 4.0, 8]), r"dest\[1\]"),
    (dict(out=torch.zeros(40, 8, 1), dest=[0, 4, 8]), "out"),          # out not 2-D
    (dict(out=torch.zeros(40, 7), dest=[0, 4, 8]), "out"),             # D mismatch
    (dict(out=torch.zeros(40, 8, dtype=torch.float16), dest=[0, 4, 8]), "out"),  # dtype
    (dict(out=torch.zeros(40, 8, device="meta"), dest=[0, 4, 8]), "out"),         # device
    (dict(backend="cuda"), "backend"),
]


@pytest.mark.parametrize("backend", (["triton"] if CPU_TRITON else []) + ["torch", "reference"])
@pytest.mark.parametrize("i", range(len(BAD)))
def test_bad_arguments_raise_value_error(i, backend):
    kw, name = BAD[i]
    args = dict(frames=X, windows=[1, 2, 4], grid=(4, 4), backend=backend)
    args.update(kw)
    with pytest.raises(ValueError, match=name):
        pool_pack(**args)


def test_reference_validates_too():
    with pytest.raises(PoolPackArgError, match="windows"):
        pool_pack_reference(X, [1, 2], (4, 4))


@pytest.mark.parametrize("fn", [lambda **kw: pool_pack(X, grid=(4, 4), backend="torch", **kw),
                                lambda **kw: pool_pack_reference(X, grid=(4, 4), **kw),
                                lambda **kw: pooled_counts(grid=(4, 4), **kw)])
def test_windows_is_the_one_name(fn):
    """``windows=`` is the per-frame argument; its pre-1.0 name ``scales=`` is gone."""
    fn(windows=[1, 2, 4])
    with pytest.raises(TypeError, match="scales"):
        fn(scales=[1, 2, 4])
    with pytest.raises(TypeError, match="windows"):
        fn()


def test_launch_plan_has_one_name():
    import vr_kernels.checks as checks
    assert not hasattr(checks, "Plan")


def test_fp64_only_on_torch_paths():
    x = X.double()
    with pytest.raises(ValueError, match="frames" if CPU_TRITON else "backend"):
        pool_pack(x, [1, 2, 4], (4, 4), backend="triton")
    assert pool_pack(x, [1, 2, 4], (4, 4), backend="torch").dtype == torch.float64


def test_dropped_frame_dest_is_ignored():
    check_args(X, [1, 0, 4], (4, 4), out=OUT, dest=[0, -5, 16])


def test_tensor_scales_and_dest():
    plan = check_args(X, torch.tensor([1, 0, 2]), (4, 4), out=OUT, dest=torch.tensor([0, 0, 20]))
    assert plan.windows == ((1, 1), None, (2, 2)) and plan.dest == (0, 0, 20)


# ---------------------------------------------------------------- tiles

def _plan(windows, grid=(16, 16), T=None, D=3584):
    H, W = grid
    nw = [None if w == 0 else ((w, w) if isinstance(w, int) else w) for w in windows]
    counts = [0 if w is None else -(-H // w[0]) * -(-W // w[1]) for w in nw]
    dest, acc = [], 0
    for c in counts:
        dest.append(acc)
        acc += c
    return LaunchPlan(len(nw), H * W, D, grid, tuple(nw), tuple(counts), tuple(dest), acc)


def tile_rows(plan, tokens_per_tile):
    table, n_fwd = tile_table(plan.sched(), plan.N, tokens_per_tile)
    return table.tolist(), n_fwd


def _tile_tokens(row, grid):
    """Input tokens a tile reads (fwd) or writes (zero tile), counting edge windows exactly."""
    H, W = grid
    t, r0, nr, sh, sw, ow, _, _ = row
    if sh == 0:
        return nr
    tot = 0
    for r in range(r0, r0 + nr):
        h0, w0 = (r // ow) * sh, (r % ow) * sw
        tot += (min(h0 + sh, H) - h0) * (min(w0 + sw, W) - w0)
    return tot


@pytest.mark.parametrize("mix", [[1, 2, 4, 8, 0], [1] * 7, [0] * 9 + [2], [8] * 5, [8, 1, 0, 0, 1, 8, 4, 2, 2]])
@pytest.mark.parametrize("tpt", [64, 256])
def test_tiles_balance_input_tokens(mix, tpt):
    grid = (16, 16)
    plan = _plan(mix * 3, grid)
    rows, n_fwd = tile_rows(plan, tpt)
    toks = [_tile_tokens(r, grid) for r in rows]
    assert min(toks) > 0 and max(toks) / min(toks) <= 2, toks
    # Forward tiles first, zero tiles (sh == 0) after.
    assert all(r[3] > 0 for r in rows[:n_fwd]) and all(r[3] == 0 for r in rows[n_fwd:])


@pytest.mark.parametrize("grid,windows", [((16, 16), [1, 2, 4, 8, 0, 3, (2, 5), 16, 40]),
                                          ((7, 5), [1, 0, (3, 2), 9, (1, 5)]),
                                          ((16, 28), [(8, 8), 0, (3, 5), 2])])
def test_tiles_cover_each_row_and_token_once(grid, windows):
    plan = _plan(windows, grid)
    rows, n_fwd = tile_rows(plan, 64)
    seen_rows = []
    zero_tokens = {}
    for t, r0, nr, sh, sw, ow, _, _ in rows:
        if sh == 0:
            zero_tokens.setdefault(t, []).extend(range(r0, r0 + nr))
        else:
            assert (sh, sw) == plan.windows[t] and ow == -(-grid[1] // sw)
            y0 = plan.dest[t] + r0
            seen_rows.extend(range(y0, y0 + nr))
    assert sorted(seen_rows) == list(range(plan.total))
    for t, w in enumerate(plan.windows):
        if w is None:
            assert sorted(zero_tokens[t]) == list(range(plan.N))


def test_tiles_int32_past_2_31_elements():
    # The shape of the GPU test (T*N*D ~ 2.2e9 elements) without allocating it: the table holds
    # row/token indices, which fit int32; the element offsets (index * stride) do not, which is
    # why the kernels cast to int64 before multiplying.
    plan = _plan([1, 2, 4, 8, 0] * 480, (16, 16), D=3584)
    assert plan.T * plan.N * plan.D > 2**31
    table, n_fwd = build_tiles(plan, 64, "cpu")
    assert table.dtype == torch.int32 and table.shape[1] == 8
    last = table[n_fwd - 1].tolist()
    dest = build_dest(plan, "cpu")
    assert dest.dtype == torch.int32
    assert int(dest[last[0]]) + last[1] + last[2] == plan.total   # exact, no wrap-around
    assert int(table[:, 0].max()) == plan.T - 1
    assert (last[0] * plan.N * plan.D) > 2**31          # the frame offset needs int64
    big = LaunchPlan(1, 256, 8, (16, 16), ((1, 1),), (256,), (2**31,), 2**31 + 256)
    with pytest.raises(ValueError, match="2\\*\\*31"):
        build_tiles(big, 64, "cpu")


def test_kernels_cast_to_int64_before_strides():
    # Guard against a refactor dropping the casts (the GPU test is what proves them).
    import importlib
    import inspect
    src = inspect.getsource(importlib.import_module("vr_kernels.pool_pack"))
    # int64 at the bases (frame, block of output rows); int32 offsets inside them, which the
    # launchers bound (_frame_offsets_fit, _rows_fit).
    for expr in ["x + t.to(tl.int64) * stride_xt", "dx + t.to(tl.int64) * stride_xt",
                 "y + (tl.load(dest + t) + r0).to(tl.int64) * stride_yr",
                 "y0 = (tl.load(dest + t) + r0).to(tl.int64)", "frames = _frame_rows(frames)",
                 '_rows_fit(y, "out", TOKENS_PER_TILE)']:
        assert expr in src
