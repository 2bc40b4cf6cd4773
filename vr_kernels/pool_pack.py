"""Fused variable-window mean pooling + ragged packing (SPEC section 1): Triton kernels,
their launchers, the autograd Function and the public ``pool_pack``.

One pass over memory: the forward reads every token of every kept frame exactly once (windows
tile the grid, they never overlap) and writes every output row once, straight into its final
place (``out[dest[t] + r]``), so no intermediate per-frame tensors and no ``masked_scatter``.
The backward writes every input-token gradient exactly once (``grad_out[row] / area``), zeros
for dropped frames, so it needs no atomics either.

Work is spread by input tokens, not output rows: see ``tiles.py``.
"""
from __future__ import annotations

import os
import re
from typing import Optional, Sequence, Tuple

import torch

from .checks import KERNEL_DTYPES, TORCH_DTYPES, Plan, PoolPackArgError, check_args
from .tiles import build_tiles

try:
    import triton
    import triton.language as tl
    HAS_TRITON = True
except Exception:  # pragma: no cover - triton is a dependency, but keep CPU use possible
    triton = None
    tl = None
    HAS_TRITON = False

# Triton decides interpreter vs compiler when a kernel is decorated, i.e. when this module is
# imported; TRITON_INTERPRET=1 must be set before that (tests/conftest.py does).
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

def _interpreter_runs_kernels() -> bool:
    # Triton < 3.7's interpreter cannot loop over a bound loaded from memory (`range(nr)` on a
    # loaded scalar raises), which these kernels do; compiled kernels are not affected.
    if not (INTERPRET and HAS_TRITON):
        return False
    major_minor = tuple(int(v) for v in re.findall(r"\d+", triton.__version__)[:2])
    return major_minor >= (3, 7)


# Triton on CPU tensors: the interpreter is on and can run these kernels.
CPU_TRITON = _interpreter_runs_kernels()

# Tokens per tile (see tiles.py). Compiled: 64 balances a 1/2/4/8 mix exactly on 16x16 grids.
# Interpreted: every program instance costs milliseconds of Python, so take whole frames.
TOKENS_PER_TILE = 1024 if INTERPRET else 64

BACKENDS = ("auto", "triton", "torch", "reference")


def _configs():
    if INTERPRET:  # several configs would make the interpreter benchmark them (and it is slow)
        return [triton.Config({"BLOCK_T": 16, "BLOCK_D": 256}, num_warps=4)]
    # 8..64 fp32 accumulator elements per thread; BLOCK_T x BLOCK_D elements in flight per load.
    return [triton.Config({"BLOCK_T": bt, "BLOCK_D": bd}, num_warps=nw)
            for bt in (8, 16) for bd in (128, 256, 512) for nw in (2, 4, 8)
            if 8 <= bt * bd // (32 * nw) <= 64]


if HAS_TRITON:

    # The interpreter's fp32 -> bf16 cast truncates (the GPU's cvt rounds to nearest even), so
    # under TRITON_INTERPRET the rounding is done on the bits; compiled kernels use the hardware.
    _SOFT_BF16 = tl.constexpr(INTERPRET)

    @triton.jit
    def _round(v, dtype: tl.constexpr):
        # fp32 -> output dtype, rounded once to nearest even (SPEC).
        if dtype == tl.bfloat16:
            if _SOFT_BF16:
                b = v.to(tl.uint32, bitcast=True)
                b = b + 0x7FFF + ((b >> 16) & 1)
                return (b >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
            else:
                return v.to(dtype)
        else:
            return v.to(dtype)

    # Both kernels pick one of two vectorisations per tile (a uniform branch per program), so
    # every load/store moves a [BLOCK_T, BLOCK_D] block whatever the window:
    # * ROWS path (the tile has >= BLOCK_T output rows, i.e. small windows such as 1x1, 2x2):
    #   lanes = BLOCK_T output rows; loop over the sh x sw window offsets (masked at the edges).
    # * WINDOW path (fewer rows, i.e. large windows such as 4x4, 8x8): one output row at a time;
    #   lanes = BLOCK_T tokens of its (edge-clipped) window, looping over chunks of the window,
    #   then a sum over the lanes.

    @triton.autotune(configs=_configs(), key=["D"])
    @triton.jit
    def _pool_pack_fwd_kernel(
        x, y, tiles,
        H, W, D,
        stride_xt, stride_xn, stride_xd,
        stride_yr, stride_yd,
        BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        pid = tl.program_id(0)
        n_d_blocks = tl.cdiv(D, BLOCK_D)
        i_d = pid % n_d_blocks
        i_tile = pid // n_d_blocks
        row = tiles + i_tile.to(tl.int64) * 8
        t = tl.load(row + 0)
        r0 = tl.load(row + 1)
        nr = tl.load(row + 2)
        sh = tl.load(row + 3)
        sw = tl.load(row + 4)
        ow_n = tl.load(row + 5)
        y0 = tl.load(row + 6)

        o_t = tl.arange(0, BLOCK_T)
        o_d = i_d * BLOCK_D + tl.arange(0, BLOCK_D)
        m_d = o_d < D
        # int64 before any stride product: T*N*D and L*D may pass 2**31.
        x_frame = x + t.to(tl.int64) * stride_xt
        x_cols = o_d.to(tl.int64) * stride_xd
        y_cols = o_d.to(tl.int64) * stride_yd
        if nr >= BLOCK_T:
            for rb in range(0, nr, BLOCK_T):
                m_r = rb + o_t < nr
                rr = r0 + rb + o_t
                h0 = (rr // ow_n) * sh
                w0 = (rr % ow_n) * sw
                hh = tl.minimum(h0 + sh, H) - h0  # edge windows average only the tokens inside
                ww = tl.minimum(w0 + sw, W) - w0
                acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
                for i in range(tl.minimum(sh, H)):
                    for j in range(tl.minimum(sw, W)):
                        m = m_r & (hh > i) & (ww > j)
                        n = (h0 + i) * W + (w0 + j)
                        v = tl.load(x_frame + n.to(tl.int64)[:, None] * stride_xn + x_cols[None, :],
                                    mask=m[:, None] & m_d[None, :], other=0.0)
                        acc += v.to(tl.float32)
                area = tl.maximum(hh * ww, 1).to(tl.float32)  # masked lanes: no 0/0
                tl.store(y + (y0 + rb + o_t).to(tl.int64)[:, None] * stride_yr + y_cols[None, :],
                         _round(acc / area[:, None], y.dtype.element_ty), mask=m_r[:, None] & m_d[None, :])
        else:
            for r in range(nr):
                rr = r0 + r
                h0 = (rr // ow_n) * sh
                w0 = (rr % ow_n) * sw
                hh = tl.minimum(h0 + sh, H) - h0
                ww = tl.minimum(w0 + sw, W) - w0
                area = hh * ww
                acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
                for k0 in range(0, area, BLOCK_T):
                    k = k0 + o_t
                    i = k // ww
                    n = (h0 + i) * W + (w0 + k - i * ww)
                    v = tl.load(x_frame + n.to(tl.int64)[:, None] * stride_xn + x_cols[None, :],
                                mask=(k < area)[:, None] & m_d[None, :], other=0.0)
                    acc += v.to(tl.float32)
                mean = tl.sum(acc, axis=0) / area.to(tl.float32)
                tl.store(y + (y0 + r).to(tl.int64) * stride_yr + y_cols, _round(mean, y.dtype.element_ty),
                         mask=m_d)

    @triton.autotune(configs=_configs(), key=["D"])
    @triton.jit
    def _pool_pack_bwd_kernel(
        dy, dx, dy_kept, tiles,
        H, W, D,
        stride_dyr, stride_dyd,
        stride_xt, stride_xn, stride_xd,
        stride_kr, stride_kd,
        WRITE_DX: tl.constexpr, ZERO_DY: tl.constexpr,
        BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        # dx[t, token] = dy[row(token)] / area(window): the exact adjoint of the forward; every
        # token written once, no atomics. ZERO_DY: dy_kept (a copy of dy, the gradient w.r.t.
        # the original `out`) gets zeros in the rows the forward overwrote. Reads come from dy,
        # never from dy_kept, so the kernel is idempotent (autotuning may run it several times).
        pid = tl.program_id(0)
        n_d_blocks = tl.cdiv(D, BLOCK_D)
        i_d = pid % n_d_blocks
        i_tile = pid // n_d_blocks
        row = tiles + i_tile.to(tl.int64) * 8
        t = tl.load(row + 0)
        r0 = tl.load(row + 1)
        nr = tl.load(row + 2)
        sh = tl.load(row + 3)
        sw = tl.load(row + 4)
        ow_n = tl.load(row + 5)
        y0 = tl.load(row + 6)

        o_t = tl.arange(0, BLOCK_T)
        o_d = i_d * BLOCK_D + tl.arange(0, BLOCK_D)
        m_d = o_d < D
        dx_frame = dx + t.to(tl.int64) * stride_xt
        x_cols = o_d.to(tl.int64) * stride_xd
        dy_cols = o_d.to(tl.int64) * stride_dyd
        k_cols = o_d.to(tl.int64) * stride_kd
        if sh == 0:
            # Zero tile: tokens [r0, r0 + nr) of a dropped frame.
            if WRITE_DX:
                zero = tl.zeros([BLOCK_T, BLOCK_D], dtype=dx.dtype.element_ty)
                for k0 in range(0, nr, BLOCK_T):
                    k = k0 + o_t
                    tl.store(dx_frame + (r0 + k).to(tl.int64)[:, None] * stride_xn + x_cols[None, :], zero,
                             mask=(k < nr)[:, None] & m_d[None, :])
        elif nr >= BLOCK_T:
            for rb in range(0, nr, BLOCK_T):
                m_r = rb + o_t < nr
                m_rd = m_r[:, None] & m_d[None, :]
                yr = (y0 + rb + o_t).to(tl.int64)[:, None]
                if ZERO_DY:
                    tl.store(dy_kept + yr * stride_kr + k_cols[None, :],
                             tl.zeros([BLOCK_T, BLOCK_D], dtype=dy_kept.dtype.element_ty), mask=m_rd)
                if WRITE_DX:
                    rr = r0 + rb + o_t
                    h0 = (rr // ow_n) * sh
                    w0 = (rr % ow_n) * sw
                    hh = tl.minimum(h0 + sh, H) - h0
                    ww = tl.minimum(w0 + sw, W) - w0
                    g = tl.load(dy + yr * stride_dyr + dy_cols[None, :], mask=m_rd, other=0.0).to(tl.float32)
                    g = _round(g / tl.maximum(hh * ww, 1).to(tl.float32)[:, None], dx.dtype.element_ty)
                    for i in range(tl.minimum(sh, H)):
                        for j in range(tl.minimum(sw, W)):
                            m = m_r & (hh > i) & (ww > j)
                            n = (h0 + i) * W + (w0 + j)
                            tl.store(dx_frame + n.to(tl.int64)[:, None] * stride_xn + x_cols[None, :], g,
                                     mask=m[:, None] & m_d[None, :])
        else:
            for r in range(nr):
                if ZERO_DY:
                    tl.store(dy_kept + (y0 + r).to(tl.int64) * stride_kr + k_cols,
                             tl.zeros([BLOCK_D], dtype=dy_kept.dtype.element_ty), mask=m_d)
                if WRITE_DX:
                    rr = r0 + r
                    h0 = (rr // ow_n) * sh
                    w0 = (rr % ow_n) * sw
                    hh = tl.minimum(h0 + sh, H) - h0
                    ww = tl.minimum(w0 + sw, W) - w0
                    area = hh * ww
                    g = tl.load(dy + (y0 + r).to(tl.int64) * stride_dyr + dy_cols, mask=m_d, other=0.0)
                    g = _round(g.to(tl.float32) / area.to(tl.float32), dx.dtype.element_ty)
                    g2 = tl.broadcast_to(g[None, :], (BLOCK_T, BLOCK_D))
                    for k0 in range(0, area, BLOCK_T):
                        k = k0 + o_t
                        i = k // ww
                        n = (h0 + i) * W + (w0 + k - i * ww)
                        tl.store(dx_frame + n.to(tl.int64)[:, None] * stride_xn + x_cols[None, :], g2,
                                 mask=(k < area)[:, None] & m_d[None, :])


def _grid(n_tiles: int, D: int):
    # D-blocks vary fastest, so neighbouring programs read neighbouring bytes of the same rows.
    return lambda meta: (n_tiles * triton.cdiv(D, meta["BLOCK_D"]),)


def pool_pack_fwd(frames: torch.Tensor, plan: Plan, tiles: torch.Tensor, n_fwd: int,
                  y: torch.Tensor) -> torch.Tensor:
    """Launch the forward kernel: pool ``frames`` per ``plan`` into the rows of ``y``."""
    if n_fwd > 0:
        H, W = plan.grid
        _pool_pack_fwd_kernel[_grid(n_fwd, plan.D)](
            frames, y, tiles, H, W, plan.D,
            frames.stride(0), frames.stride(1), frames.stride(2),
            y.stride(0), y.stride(1),
        )
    return y


def pool_pack_bwd(dy: torch.Tensor, plan: Plan, tiles: torch.Tensor, n_fwd: int,
                  dx: Optional[torch.Tensor] = None, dout: Optional[torch.Tensor] = None) -> None:
    """Launch the backward kernel; it fills the buffers it is given.

    ``dx`` ([T, N, D], any content): every token gets its window's gradient, dropped frames zeros.
    ``dout`` (a copy of ``dy``): the rows the forward overwrote are zeroed, which makes it the
    gradient w.r.t. ``out`` as it was before the forward."""
    H, W = plan.grid
    need_dx, need_dout = dx is not None, dout is not None
    n = tiles.shape[0] if need_dx else n_fwd  # zero tiles (dropped frames) only matter for dx
    if plan.T * plan.N == 0 or n == 0 or not (need_dx or need_dout):
        return
    xs = dx if need_dx else dy  # placeholders when a side is not written
    ks = dout if need_dout else dy
    _pool_pack_bwd_kernel[_grid(n, plan.D)](
        dy, xs, ks, tiles, H, W, plan.D,
        dy.stride(0), dy.stride(1),
        *(dx.stride() if need_dx else (0, 0, 0)),
        ks.stride(0), ks.stride(1),
        WRITE_DX=need_dx, ZERO_DY=need_dout,
    )


class PoolPackFunction(torch.autograd.Function):
    """Autograd for the Triton path. With ``out`` the result IS ``out`` (modified in place,
    marked dirty), so autograd rebases ``out`` -- and the tensor it is a view of -- onto this node.

    ``out`` is the FIRST input on purpose: when ``out`` is a view (``embeds.view(-1, D)``),
    autograd wraps this node in CopySlices, which routes the gradient of input 0 into the base's
    gradient; any other order hands it the frames' gradient and fails on the shapes.
    """

    @staticmethod
    def forward(ctx, out, frames, plan, tiles, n_fwd):
        if out is None:
            y = frames.new_empty(plan.rows, plan.D)
        else:
            y = out
            ctx.mark_dirty(out)
        pool_pack_fwd(frames, plan, tiles, n_fwd, y)
        ctx.plan, ctx.n_fwd = plan, n_fwd
        ctx.frames_meta = (frames.shape, frames.dtype)
        ctx.has_out = out is not None
        ctx.save_for_backward(tiles)
        return y

    @staticmethod
    def backward(ctx, dy):
        (tiles,) = ctx.saved_tensors
        need_dout = ctx.has_out and ctx.needs_input_grad[0]
        need_dx = ctx.needs_input_grad[1]
        shape, dtype = ctx.frames_meta
        dx = torch.empty(shape, dtype=dtype, device=dy.device) if need_dx else None
        dout = dy.clone() if need_dout else None
        pool_pack_bwd(dy, ctx.plan, tiles, ctx.n_fwd, dx, dout)
        return dout, dx, None, None, None


def _pick_backend(backend: str, device: torch.device) -> str:
    if backend not in BACKENDS:
        raise PoolPackArgError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        if device.type == "cuda" and HAS_TRITON:
            return "triton"
        if device.type == "cpu" and CPU_TRITON:
            return "triton"
        return "torch"
    if backend == "triton":
        if not HAS_TRITON:
            raise PoolPackArgError("backend: 'triton' asked for but triton is not installed")
        if device.type == "cpu" and not INTERPRET:
            raise PoolPackArgError("backend: 'triton' on CPU tensors needs TRITON_INTERPRET=1 set before "
                                   "vr_kernels is imported; use backend='torch' instead")
        if device.type == "cpu" and not CPU_TRITON:
            raise PoolPackArgError(f"backend: the interpreter of triton {triton.__version__} cannot "
                                   f"run these kernels on CPU; install triton>=3.7 or use "
                                   f"backend='torch'")
        if device.type not in ("cpu", "cuda"):
            raise PoolPackArgError(f"backend: 'triton' does not run on {device.type} tensors")
    return backend


def pool_pack(frames: torch.Tensor, scales: Sequence, grid: Tuple[int, int] = (16, 16),
              out: Optional[torch.Tensor] = None, dest: Optional[Sequence[int]] = None,
              backend: str = "auto") -> torch.Tensor:
    """Mean-pool each frame's H x W token grid with its own window and pack the results.

    Args:
        frames: ``[T, H*W, D]`` fp32 / fp16 / bf16 (fp64 on the PyTorch backends), CUDA or CPU.
        scales: one window per frame: ``0`` (drop), ``s`` (s x s) or ``(sh, sw)``.
        grid: ``(H, W)`` of each frame's token grid, row-major.
        out, dest: write frame t's rows to ``out[dest[t] : dest[t] + counts[t]]`` in place and
            return ``out``; other rows are untouched.
        backend: ``"auto"`` (Triton on CUDA, and on CPU under ``TRITON_INTERPRET=1``; the
            vectorised PyTorch path otherwise), or force ``"triton"``, ``"torch"``, ``"reference"``.

    Returns ``[sum(counts), D]`` (or ``out``). Raises ``PoolPackArgError`` (a ``ValueError``)
    naming the argument for bad input, before anything runs.
    """
    if not isinstance(backend, str):
        raise PoolPackArgError(f"backend: expected a string, got {backend!r}")
    device = frames.device if isinstance(frames, torch.Tensor) else torch.device("cpu")
    which = _pick_backend(backend, device)
    dtypes = KERNEL_DTYPES if which == "triton" else TORCH_DTYPES
    plan = check_args(frames, scales, grid, out, dest, dtypes=dtypes)
    if which == "reference":
        from .reference import pool_pack_reference
        return pool_pack_reference(frames, scales, grid, out=out, dest=dest)
    if which == "torch":
        from .torch_pool import pool_pack_torch
        return pool_pack_torch(frames, plan, out)
    tiles, n_fwd = build_tiles(plan, TOKENS_PER_TILE, frames.device)
    return PoolPackFunction.apply(out, frames, plan, tiles, n_fwd)
