"""pool_pack against the per-frame reference: forward, out/dest, backward, gradcheck.

On CPU the Triton kernels run under TRITON_INTERPRET=1 (tests/conftest.py sets it); sizes stay
small because every interpreted program instance costs milliseconds.
"""
import random

import pytest
import torch

from vr_kernels import pool_pack, pool_pack_reference, pooled_counts
from vr_kernels.pool_pack import CPU_TRITON, _pick_backend

# (atol, rtol) per dtype, Liger-style. Both sides accumulate in fp32 and round once, so the
# differences are summation order (fp32) or one rounding step of the output dtype.
TOL = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-2, 8e-3),
}
DTYPES = list(TOL)
# These tests use CPU tensors: Triton runs on them under a capable interpreter (CI); on a GPU
# machine the `gpu`-marked tests cover the compiled kernels.
BACKENDS = ["triton", "torch"] if CPU_TRITON else ["torch"]

# (T, grid, D, scales): odd D, odd grids, every window kind, windows larger than the grid.
CASES = [
    ((16, 16), 1, [1, 2, 4, 8]),
    ((7, 5), 30, [0, 3, (2, 4), 9, (1, 1)]),
    ((16, 28), 130, [(8, 8), 0, (3, 5)]),
    ((4, 4), 17, [(4, 1), (1, 4), 0, 0, (5, 2), 16]),
    ((3, 7), 64, [0, 0, 0]),
    ((1, 1), 3, [1, (2, 3), 0]),
]


def _make(T_grid_D_scales, dtype, seed=0, requires_grad=False):
    grid, D, scales = T_grid_D_scales
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(scales), grid[0] * grid[1], D, generator=g).to(dtype)
    x.requires_grad_(requires_grad)
    return x, scales, grid


def _close(a, b, dtype):
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(a.float(), b.float(), atol=atol, rtol=rtol)


def _random_case(seed):
    rng = random.Random(seed)
    grid = (rng.randint(1, 9), rng.randint(1, 9))
    T = rng.randint(1, 5)
    D = rng.choice([1, 30, 33, 130])
    scales = []
    for _ in range(T):
        k = rng.random()
        if k < 0.2:
            scales.append(0)
        elif k < 0.6:
            scales.append(rng.randint(1, 10))
        else:
            scales.append((rng.randint(1, 10), rng.randint(1, 10)))
    return grid, D, scales


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_forward_matches_reference(case, dtype, backend):
    x, scales, grid = _make(CASES[case], dtype, seed=case)
    y = pool_pack(x, scales, grid, backend=backend)
    ref = pool_pack_reference(x, scales, grid)
    assert y.dtype == dtype and y.shape == (sum(pooled_counts(scales, grid)), x.shape[2])
    _close(y, ref, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(4))
def test_forward_random_shapes(seed, backend):
    x, scales, grid = _make(_random_case(seed), torch.float32, seed=seed)
    _close(pool_pack(x, scales, grid, backend=backend), pool_pack_reference(x, scales, grid), torch.float32)


def test_edge_windows_average_only_inside_tokens():
    # Independent of avg_pool2d: a 3x3 window on a 4x5 grid, means computed by hand.
    x = torch.arange(20 * 2, dtype=torch.float32).view(1, 20, 2)
    for backend in BACKENDS + ["reference"]:
        y = pool_pack(x, [3], (4, 5), backend=backend)
        grid = x[0].view(4, 5, 2)
        want = torch.stack([grid[0:3, 0:3].mean((0, 1)), grid[0:3, 3:5].mean((0, 1)),
                            grid[3:4, 0:3].mean((0, 1)), grid[3:4, 3:5].mean((0, 1))])
        torch.testing.assert_close(y, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_frames(backend):
    base = torch.randn(16, 3, 20)  # [N, T, D] -> a [T, N, D] view with a non-unit frame stride
    x = base.transpose(0, 1)
    scales = [2, 0, (1, 4)]
    _close(pool_pack(x, scales, (4, 4), backend=backend), pool_pack_reference(x, scales, (4, 4)), torch.float32)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the gpu tests run the kernels")
def test_cpu_run_exercises_the_triton_kernels():
    # Guards CI: without this, a missing TRITON_INTERPRET or a too-old interpreter would quietly
    # drop every Triton case above and leave only the PyTorch path tested.
    assert CPU_TRITON, ("the Triton kernels cannot run on this CPU: set TRITON_INTERPRET=1 before "
                        "importing triton and install triton>=3.7")


def test_auto_backend_dispatch():
    assert _pick_backend("auto", torch.device("cpu")) == ("triton" if CPU_TRITON else "torch")
    assert _pick_backend("torch", torch.device("cpu")) == "torch"


def test_empty_inputs():
    for backend in BACKENDS:
        y = pool_pack(torch.randn(0, 16, 8), [], (4, 4), backend=backend)
        assert y.shape == (0, 8)


# ---------------------------------------------------------------- out / dest

POISON = -1234.5


@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_out_dest_poisoned_buffer(dtype, backend):
    x, scales, grid = _make(((7, 5), 30, [2, 0, (1, 3), 9, 1]), dtype, seed=3)
    counts = pooled_counts(scales, grid)  # [12, 0, 10, 1, 35]
    # Blocks out of temporal order, with gaps; the dropped frame's dest is ignored.
    dest = [40, 999, 5, 0, 55]
    L = 100
    out = torch.full((L, 30), POISON, dtype=dtype)
    out[1:3] = torch.randn(2, 30).to(dtype)  # arbitrary content that must survive bit-exactly
    before = out.clone()
    res = pool_pack(x, scales, grid, out=out, dest=dest, backend=backend)
    assert res is out
    covered = torch.zeros(L, dtype=torch.bool)
    ref = pool_pack_reference(x, scales, grid)
    r = 0
    for t, c in enumerate(counts):
        if c:
            _close(out[dest[t]: dest[t] + c], ref[r: r + c], dtype)
            covered[dest[t]: dest[t] + c] = True
            r += c
    assert torch.equal(out[~covered].view(torch.int16 if dtype != torch.float32 else torch.int32),
                       before[~covered].view(torch.int16 if dtype != torch.float32 else torch.int32))


# ---------------------------------------------------------------- backward

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_matches_reference_autograd(dtype, backend):
    x, scales, grid = _make(((16, 28), 33, [(8, 8), 0, (3, 5), 1]), dtype, seed=7, requires_grad=True)
    y = pool_pack(x, scales, grid, backend=backend)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    (gx,) = torch.autograd.grad(y, x, g)
    xr = x.detach().clone().requires_grad_(True)
    (gr,) = torch.autograd.grad(pool_pack_reference(xr, scales, grid), xr, g)
    assert gx.dtype == dtype
    assert torch.count_nonzero(gx[1]) == 0  # dropped frame: zeros, written explicitly
    _close(gx, gr, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_random_shapes(backend):
    for seed in range(3):
        x, scales, grid = _make(_random_case(100 + seed), torch.float32, seed=seed, requires_grad=True)
        y = pool_pack(x, scales, grid, backend=backend)
        g = torch.randn_like(y)
        (gx,) = torch.autograd.grad(y, x, g) if y.numel() else (torch.zeros_like(x),)
        xr = x.detach().clone().requires_grad_(True)
        yr = pool_pack_reference(xr, scales, grid)
        (gr,) = torch.autograd.grad(yr, xr, g) if yr.numel() else (torch.zeros_like(x),)
        _close(gx, gr, torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_into_embedding_view(backend):
    """``out`` = a view of a non-leaf (embedding lookup) that requires grad: in-place write,
    mark_dirty, CopySlices; the embedding gets zero gradient on overwritten rows."""
    torch.manual_seed(0)
    D, grid, scales = 24, (4, 6), [2, 0, (1, 3), 1]
    dest = [40, 0, 2, 12]  # counts [6, 0, 8, 24]: blocks [40,46) [2,10) [12,36)
    emb = torch.nn.Embedding(50, D)
    ids = torch.randint(0, 50, (2, 32))
    x = torch.randn(4, 24, D, requires_grad=True)
    g = torch.randn(2, 32, D)

    def run(fn):
        emb.zero_grad()
        xx = x.detach().clone().requires_grad_(True)
        e = emb(ids)
        res = fn(xx, e.view(-1, D))
        assert res.data_ptr() == e.data_ptr()
        (e * g).sum().backward()
        return xx.grad, emb.weight.grad.clone(), e.detach()

    gx, gw, e1 = run(lambda xx, o: pool_pack(xx, scales, grid, out=o, dest=dest, backend=backend))
    rx, rw, e2 = run(lambda xx, o: pool_pack_reference(xx, scales, grid, out=o, dest=dest))
    _close(e1, e2, torch.float32)
    _close(gx, rx, torch.float32)
    _close(gw, rw, torch.float32)
    # Cross-check: the embedding's gradient only flows through rows the frames did not overwrite.
    covered = torch.zeros(64, dtype=torch.bool)
    for d, c in zip(dest, pooled_counts(scales, grid)):
        covered[d: d + c] = True
    want = torch.zeros_like(gw).index_add_(0, ids.view(-1)[~covered], g.view(-1, D)[~covered])
    _close(gw, want, torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_wrt_out_only(backend):
    # frames without grad, out a non-leaf with grad: only the out path of the backward runs.
    D, grid, scales, dest = 8, (4, 4), [2, 0, 4], [0, 0, 9]
    base = torch.randn(12, D, requires_grad=True)
    out = base * 1.0
    pool_pack(torch.randn(3, 16, D), scales, grid, out=out, dest=dest, backend=backend)
    g = torch.randn(12, D)
    (gb,) = torch.autograd.grad(out, base, g)
    want = g.clone()
    want[0:4] = 0
    want[9:10] = 0
    torch.testing.assert_close(gb, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_after_inference_mode_call(backend):
    # The tile table of a schedule is cached: one first built under inference_mode (the runtime)
    # must still serve a later call with autograd on (training) of the same schedule.
    grid, scales = (4, 4), [1, (2, 3), 0]
    x = torch.randn(3, 16, 6)
    with torch.inference_mode():
        pool_pack(x, scales, grid, backend=backend)
    xr = x.clone().requires_grad_(True)
    g = torch.randn(sum(pooled_counts(scales, grid)), 6)
    (gx,) = torch.autograd.grad(pool_pack(xr, scales, grid, backend=backend), xr, g)
    xq = x.clone().requires_grad_(True)
    (gr,) = torch.autograd.grad(pool_pack_reference(xq, scales, grid), xq, g)
    _close(gx, gr, torch.float32)


def test_gradcheck_torch_path_fp64():
    x = torch.randn(3, 12, 5, dtype=torch.float64, requires_grad=True)
    scales, grid = [(2, 3), 0, 5], (3, 4)
    assert torch.autograd.gradcheck(lambda a: pool_pack(a, scales, grid, backend="torch"), (x,))
    out0 = torch.randn(20, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, o: pool_pack(a, scales, grid, out=o.clone(), dest=[10, 0, 2], backend="torch"), (x, out0))


def test_gradcheck_reference_fp64():
    x = torch.randn(2, 9, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: pool_pack_reference(a, [2, (1, 3)], (3, 3)), (x,))


# ---------------------------------------------------------------- GPU, real sizes

MIX = [1, 2, 4, 8, 0]


@pytest.mark.gpu
@pytest.mark.parametrize("T", [64, 256, 1024])
def test_gpu_real_sizes(T):
    torch.manual_seed(T)
    D = 3584
    scales = [MIX[i % len(MIX)] for i in range(T)]
    x = torch.randn(T, 256, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = pool_pack(x, scales)
    xr = x.detach().clone().requires_grad_(True)
    yr = pool_pack(xr, scales, backend="torch")
    _close(y, yr, torch.bfloat16)
    g = torch.randn_like(y)
    (gx,) = torch.autograd.grad(y, x, g)
    (gr,) = torch.autograd.grad(yr, xr, g)
    _close(gx, gr, torch.bfloat16)


@pytest.mark.gpu
def test_gpu_past_2_31_elements():
    # T*N*D = 2400*256*3584 ~ 2.2e9 > 2**31 (4.4 GB bf16); out rows past 2**31 elements as well.
    T, N, D = 2400, 256, 3584
    assert T * N * D > 2**31
    scales = [MIX[i % len(MIX)] for i in range(T)]
    x = torch.randn(T, N, D, device="cuda", dtype=torch.bfloat16)
    counts = pooled_counts(scales)
    L = 2**31 // D + 2 * sum(counts)
    out = torch.zeros(L, D, device="cuda", dtype=torch.bfloat16)
    dest, acc = [], L - sum(counts)  # every block sits past 2**31 elements of out
    for c in counts:
        dest.append(acc)
        acc += c
    assert dest[0] * D > 2**31
    pool_pack(x, scales, out=out, dest=dest)
    tail = 12  # frames whose inputs start past 2**31 elements
    assert (T - tail) * N * D > 2**31
    ref = pool_pack_reference(x[-tail:], scales[-tail:])
    got = out[dest[T - tail]: dest[T - tail] + ref.shape[0]]
    _close(got, ref, torch.bfloat16)
    # Backward past 2**31 too: gradients of the last frames.
    xg = x.requires_grad_(True)
    y = pool_pack(xg, scales)
    (gx,) = torch.autograd.grad(y, xg, torch.ones_like(y))
    for t in range(T - tail, T):
        c = pooled_counts([scales[t]])[0]
        want = 0.0 if c == 0 else 1.0 / (256 // c)
        assert torch.all(gx[t].float() == want)


@pytest.mark.skipif(not CPU_TRITON, reason="CPU tensors: needs the Triton interpreter (>= 3.7)")
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_backward_writes_every_token(dtype):
    """Launcher level, into a NaN-poisoned dx: every token (dropped frames included) is written,
    so autograd's uninitialised torch.empty never leaks. Covers both kernel paths and zero tiles."""
    from vr_kernels.checks import check_args
    from vr_kernels.pool_pack import TOKENS_PER_TILE, pool_pack_bwd
    from vr_kernels.tiles import build_dest, build_tiles
    x, scales, grid = _make(((16, 28), 20, [0, (3, 5), (8, 8), 1, 0]), dtype, seed=11)
    plan = check_args(x, scales, grid)
    tiles, n_fwd = build_tiles(plan, TOKENS_PER_TILE, x.device)
    dy = torch.randn(plan.rows, 20).to(dtype)
    dx = torch.full_like(x, float("nan"))
    dout = torch.full_like(dy, 7.0)
    pool_pack_bwd(dy, plan, tiles, n_fwd, build_dest(plan, x.device), dx, dout)
    xr = x.clone().requires_grad_(True)
    (gr,) = torch.autograd.grad(pool_pack_reference(xr, scales, grid), xr, dy)
    assert not torch.isnan(dx).any()
    _close(dx, gr, dtype)
    assert torch.count_nonzero(dout) == 0  # no out given: every packed row was "overwritten"
