"""Fused variable-window mean pooling + ragged packing (docs/CONTRACT.md section 1): Triton kernels,
their launchers, the autograd Function and the public ``pool_pack``.

One pass over memory: the forward reads every token of every kept frame exactly once (windows
tile the grid, they never overlap) and writes every output row once, straight into its final
place (``out[dest[t] + r]``), so no intermediate per-frame tensors and no ``masked_scatter``.
The backward writes every input-token gradient exactly once (``grad_out[row] / area``), zeros
for dropped frames, so it needs no atomics either.

Work is spread by input tokens, not output rows: see ``tiles.py``. Each window is summed inside
one thread (lanes = output rows x hidden columns), with constexpr specialisations of the common
windows; the kernel comments below say how, and ``vr_kernels.sass`` reads the SASS
(``bench/scripts/bench_kernels_static.py`` records it).

Compilation and autotuning happen at the first launch of each (D, grid, dtype, size class)
key; :func:`warmup` does them at model load so that no request pays for them.
"""
from __future__ import annotations

import os
import re
import time
from typing import Optional, Sequence, Tuple

import torch

from .checks import KERNEL_DTYPES, TORCH_DTYPES, LaunchPlan, PoolPackArgError, check_args
from .reference import pool_pack_reference
from .tiles import INT32_MAX, build_dest, build_tiles, tile_table
from .torch_pool import pool_pack_torch
from .windows import pooled_counts

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

# Tokens per tile (see tiles.py). Compiled: 256 makes every tile of a 1/2/4/8 mix on a 16x16 grid
# one whole frame (equal work, and enough output rows for the large windows' lanes).
# Interpreted: every program instance costs milliseconds of Python, so take whole frames too.
TOKENS_PER_TILE = 1024 if INTERPRET else 256

BACKENDS = ("auto", "triton", "torch", "reference")

# Autotuning
# ----------
# At most four configurations per element size, each kept on static evidence (sm_90 SASS, see
# vr_kernels/sass.py and tests/kernels/test_kernels_static.py): no spill,
# >= 50% occupancy, 128-bit loads and stores. (BLOCK_R, BLOCK_D, num_warps): BLOCK_R output rows x BLOCK_D
# columns per step; every thread holds whole 16-byte vectors, also in the 8x8 specialisation's
# 4-row steps (4 * BLOCK_D / threads >= one vector). BLOCK_R <= 16 (the 4x4 specialisation uses
# BLOCK_R lanes of a frame's 16 output rows). MAX_REGISTERS caps ptxas at 64 registers, which is
# 50% occupancy for any warp count; the static test checks nothing spills under the cap.
CONFIGS = {
    2: [(8, 256, 4), (8, 128, 2), (8, 512, 8), (4, 512, 4)],     # bf16 / fp16: 16 elements a thread
    4: [(4, 256, 4), (4, 128, 2), (4, 512, 8), (4, 128, 4)],     # fp32: 8 (4) elements a thread
}
MAX_REGISTERS = 64
_ELEM_OF_CONFIG = {}


def _configs():
    if INTERPRET:  # several configs would make the interpreter benchmark them (and it is slow)
        return [triton.Config({"BLOCK_R": 16, "BLOCK_D": 256}, num_warps=4)]
    out = []
    for es, cfgs in CONFIGS.items():
        for br, bd, nw in cfgs:
            # maxnreg: ptxas keeps the unrolled window loops within 64 registers (>= 50% occupancy).
            c = triton.Config({"BLOCK_R": br, "BLOCK_D": bd}, num_warps=nw, maxnreg=MAX_REGISTERS)
            _ELEM_OF_CONFIG[id(c)] = es
            out.append(c)
    return out


def _prune_by_dtype(configs, named_args, **kwargs):
    # The configurations of the launch's element size (the first tensor argument's).
    es = next(v.element_size() for v in named_args.values() if isinstance(v, torch.Tensor))
    return [c for c in configs if _ELEM_OF_CONFIG.get(id(c), es) == es] or configs[:1]


def size_class(n_tiles: int) -> int:
    """Autotuning key part: the launch's parallelism, in four classes (tiles <= 64, <= 256,
    <= 1024, more). A 16x16 frame is one tile, so these are roughly frames per call. Few classes
    so that :func:`warmup` can tune every one a request can hit."""
    return 0 if n_tiles <= 64 else 1 if n_tiles <= 256 else 2 if n_tiles <= 1024 else 3


SIZE_CLASS_TILES = (64, 256, 1024, 1025)  # a tile count in each class (what warmup launches)


def _bench(fn, quantiles):
    import triton.testing
    # Short benchmarks: the kernels run in microseconds, and warmup() tunes at model load.
    return triton.testing.do_bench(fn, warmup=5, rep=20, quantiles=quantiles)


if HAS_TRITON:

    # The interpreter's fp32 -> bf16 cast truncates (the GPU's cvt rounds to nearest even), so
    # under TRITON_INTERPRET the rounding is done on the bits; compiled kernels use the hardware.
    _SOFT_BF16 = tl.constexpr(INTERPRET)

    @triton.jit
    def _round(v, dtype: tl.constexpr):
        # fp32 -> output dtype, rounded once to nearest even (docs/CONTRACT.md section 1).
        if dtype == tl.bfloat16:
            if _SOFT_BF16:
                b = v.to(tl.uint32, bitcast=True)
                b = b + 0x7FFF + ((b >> 16) & 1)
                return (b >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
            else:
                return v.to(dtype)
        else:
            return v.to(dtype)

    # Layout of the work: lanes = [R output rows, BLOCK_D columns]; every lane sums its own
    # window serially, so the reduction never leaves the thread (no cross-warp sum, no barrier).
    # The common windows (1x1, 2x2, 4x4, 8x8) are constexpr specialisations on a constexpr grid:
    # the row -> window arithmetic divides by constants, the window loop is unrolled with
    # constant token offsets, edge masks exist only where the window does not divide the grid,
    # and the mean is a multiply by a constant 1/area. Any other window takes the generic body
    # (runtime loops, one integer division and one reciprocal per output row, never per element).
    # Offsets inside a frame (or a block of output rows) are int32; the frame's and the block's
    # base addresses are int64 (T*N*D and L*D may pass 2**31). The launcher guarantees the
    # in-frame span fits int32.

    @triton.jit
    def _unpack_tile(tiles, D: tl.constexpr, BLOCK_D: tl.constexpr):
        # The opening both kernels share: program -> (tile, block of columns), and the tile's
        # row of the table (layout in tiles.py): frame t, first row r0, row count nr, window
        # sh x sw (sh == 0: a dropped frame's zero tile). Returns the row pointer too: the
        # generic bodies read its output width (row + 5).
        pid = tl.program_id(0)
        n_d_blocks = tl.cdiv(D, BLOCK_D)
        i_d = pid % n_d_blocks
        row = tiles + (pid // n_d_blocks) * 8
        t = tl.load(row + 0)
        r0 = tl.load(row + 1)
        nr = tl.load(row + 2)
        sh = tl.load(row + 3)
        sw = tl.load(row + 4)
        o_d = i_d * BLOCK_D + tl.arange(0, BLOCK_D)
        if D % BLOCK_D == 0:  # no column mask: every block is full
            m_d = tl.full([BLOCK_D], 1, tl.int1)
        else:
            m_d = o_d < D
        return row, t, r0, nr, sh, sw, o_d, m_d

    @triton.jit
    def _fwd_window(x_frame, y_tile, r0, nr, xd, yd, m_d, stride_yr,
                    H: tl.constexpr, W: tl.constexpr, D: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
                    R: tl.constexpr, BLOCK_D: tl.constexpr):
        o_r = tl.arange(0, R)
        for rb in range(0, nr, R):
            k = rb + o_r
            rr = r0 + k
            oh = rr // ((W + SW - 1) // SW)        # constant divisor
            h0 = oh * SH
            w0 = (rr - oh * ((W + SW - 1) // SW)) * SW
            xo = ((h0 * W + w0) * D)[:, None] + xd[None, :]
            m = (k < nr)[:, None] & m_d[None, :]
            if SH * SW == 1:
                res = tl.load(x_frame + xo, mask=m).to(y_tile.dtype.element_ty)
            else:
                acc = tl.zeros([R, BLOCK_D], dtype=tl.float32)
                for i in tl.static_range(SH):
                    for j in tl.static_range(SW):
                        if (H % SH != 0) or (W % SW != 0):
                            mm = m & ((h0 + i < H) & (w0 + j < W))[:, None]
                        else:
                            mm = m
                        v = tl.load(x_frame + xo + (i * W + j) * D, mask=mm, other=0.0)
                        acc += v.to(tl.float32)
                if (H % SH != 0) or (W % SW != 0):
                    area = (tl.minimum(h0 + SH, H) - h0) * (tl.minimum(w0 + SW, W) - w0)
                    res = _round(acc * (1.0 / tl.maximum(area, 1).to(tl.float32))[:, None],
                                 y_tile.dtype.element_ty)
                else:
                    res = _round(acc * (1.0 / (SH * SW)), y_tile.dtype.element_ty)
            tl.store(y_tile + (k * stride_yr)[:, None] + yd[None, :], res, mask=m)

    @triton.jit
    def _fwd_generic(x_frame, y_tile, r0, nr, sh, sw, ow_n, xd, yd, m_d, stride_yr,
                     H: tl.constexpr, W: tl.constexpr, D: tl.constexpr, R: tl.constexpr, BLOCK_D: tl.constexpr):
        o_r = tl.arange(0, R)
        for rb in range(0, nr, R):
            k = rb + o_r
            m_r = k < nr
            rr = r0 + k
            oh = rr // ow_n                        # one division per output row
            h0 = oh * sh
            w0 = (rr - oh * ow_n) * sw
            hh = tl.minimum(h0 + sh, H) - h0       # edge windows average only the tokens inside
            ww = tl.minimum(w0 + sw, W) - w0
            xo = ((h0 * W + w0) * D)[:, None] + xd[None, :]
            acc = tl.zeros([R, BLOCK_D], dtype=tl.float32)
            for i in range(tl.minimum(sh, H)):
                for j in range(tl.minimum(sw, W)):
                    mm = (m_r & (hh > i) & (ww > j))[:, None] & m_d[None, :]
                    v = tl.load(x_frame + xo + (i * W + j) * D, mask=mm, other=0.0)
                    acc += v.to(tl.float32)
            inv = 1.0 / tl.maximum(hh * ww, 1).to(tl.float32)   # masked lanes: no 0/0
            tl.store(y_tile + (k * stride_yr)[:, None] + yd[None, :],
                     _round(acc * inv[:, None], y_tile.dtype.element_ty),
                     mask=m_r[:, None] & m_d[None, :])

    @triton.autotune(configs=_configs(), key=["D", "SIZE_CLASS", "H", "W"],
                     prune_configs_by={"early_config_prune": _prune_by_dtype}, do_bench=_bench)
    @triton.jit(do_not_specialize=["SIZE_CLASS"])
    def _pool_pack_fwd_kernel(
        x, y, tiles, dest,
        SIZE_CLASS, stride_xt, stride_yr, stride_yd,
        H: tl.constexpr, W: tl.constexpr, D: tl.constexpr,
        BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        row, t, r0, nr, sh, sw, o_d, m_d = _unpack_tile(tiles, D, BLOCK_D)
        # int64 at the bases only: T*N*D and L*D may pass 2**31.
        x_frame = x + t.to(tl.int64) * stride_xt
        y_tile = y + (tl.load(dest + t) + r0).to(tl.int64) * stride_yr
        xd = o_d  # frames' rows are contiguous (the launcher sees to it): stride D, 1
        yd = o_d * stride_yd
        if (sh == 1) & (sw == 1):
            _fwd_window(x_frame, y_tile, r0, nr, xd, yd, m_d, stride_yr, H, W, D, 1, 1, BLOCK_R, BLOCK_D)
        elif (sh == 2) & (sw == 2):
            _fwd_window(x_frame, y_tile, r0, nr, xd, yd, m_d, stride_yr, H, W, D, 2, 2, BLOCK_R, BLOCK_D)
        elif (sh == 4) & (sw == 4):
            _fwd_window(x_frame, y_tile, r0, nr, xd, yd, m_d, stride_yr, H, W, D, 4, 4, BLOCK_R, BLOCK_D)
        elif (sh == 8) & (sw == 8):
            # A 16x16 frame has 4 rows of 8x8 windows: 4 lanes of rows.
            _fwd_window(x_frame, y_tile, r0, nr, xd, yd, m_d, stride_yr, H, W, D, 8, 8, 4, BLOCK_D)
        else:
            _fwd_generic(x_frame, y_tile, r0, nr, sh, sw, tl.load(row + 5), xd, yd, m_d, stride_yr,
                         H, W, D, BLOCK_R, BLOCK_D)

    @triton.jit
    def _bwd_window(dy_tile, dx_frame, dk_tile, r0, nr, xd, yd, kd, m_d, stride_dyr, stride_kr,
                    H: tl.constexpr, W: tl.constexpr, D: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
                    WRITE_DX: tl.constexpr, ZERO_DY: tl.constexpr, R: tl.constexpr, BLOCK_D: tl.constexpr):
        o_r = tl.arange(0, R)
        for rb in range(0, nr, R):
            k = rb + o_r
            m = (k < nr)[:, None] & m_d[None, :]
            if ZERO_DY:
                tl.store(dk_tile + (k * stride_kr)[:, None] + kd[None, :],
                         tl.zeros([R, BLOCK_D], dtype=dk_tile.dtype.element_ty), mask=m)
            if WRITE_DX:
                rr = r0 + k
                oh = rr // ((W + SW - 1) // SW)
                h0 = oh * SH
                w0 = (rr - oh * ((W + SW - 1) // SW)) * SW
                xo = ((h0 * W + w0) * D)[:, None] + xd[None, :]
                g = tl.load(dy_tile + (k * stride_dyr)[:, None] + yd[None, :], mask=m, other=0.0)
                if SH * SW == 1:
                    g = g.to(dx_frame.dtype.element_ty)
                elif (H % SH != 0) or (W % SW != 0):
                    area = (tl.minimum(h0 + SH, H) - h0) * (tl.minimum(w0 + SW, W) - w0)
                    g = _round(g.to(tl.float32) * (1.0 / tl.maximum(area, 1).to(tl.float32))[:, None],
                               dx_frame.dtype.element_ty)
                else:
                    g = _round(g.to(tl.float32) * (1.0 / (SH * SW)), dx_frame.dtype.element_ty)
                for i in tl.static_range(SH):
                    for j in tl.static_range(SW):
                        if (H % SH != 0) or (W % SW != 0):
                            mm = m & ((h0 + i < H) & (w0 + j < W))[:, None]
                        else:
                            mm = m
                        tl.store(dx_frame + xo + (i * W + j) * D, g, mask=mm)

    @triton.jit
    def _bwd_generic(dy_tile, dx_frame, dk_tile, r0, nr, sh, sw, ow_n, xd, yd, kd, m_d,
                     stride_dyr, stride_kr,
                     H: tl.constexpr, W: tl.constexpr, D: tl.constexpr, WRITE_DX: tl.constexpr,
                     ZERO_DY: tl.constexpr,
                     R: tl.constexpr, BLOCK_D: tl.constexpr):
        o_r = tl.arange(0, R)
        for rb in range(0, nr, R):
            k = rb + o_r
            m_r = k < nr
            m = m_r[:, None] & m_d[None, :]
            if ZERO_DY:
                tl.store(dk_tile + (k * stride_kr)[:, None] + kd[None, :],
                         tl.zeros([R, BLOCK_D], dtype=dk_tile.dtype.element_ty), mask=m)
            if WRITE_DX:
                rr = r0 + k
                oh = rr // ow_n
                h0 = oh * sh
                w0 = (rr - oh * ow_n) * sw
                hh = tl.minimum(h0 + sh, H) - h0
                ww = tl.minimum(w0 + sw, W) - w0
                xo = ((h0 * W + w0) * D)[:, None] + xd[None, :]
                g = tl.load(dy_tile + (k * stride_dyr)[:, None] + yd[None, :], mask=m, other=0.0)
                g = _round(g.to(tl.float32) * (1.0 / tl.maximum(hh * ww, 1).to(tl.float32))[:, None],
                           dx_frame.dtype.element_ty)
                for i in range(tl.minimum(sh, H)):
                    for j in range(tl.minimum(sw, W)):
                        mm = (m_r & (hh > i) & (ww > j))[:, None] & m_d[None, :]
                        tl.store(dx_frame + xo + (i * W + j) * D, g, mask=mm)

    @triton.autotune(configs=_configs(), key=["D", "SIZE_CLASS", "H", "W", "WRITE_DX", "ZERO_DY"],
                     prune_configs_by={"early_config_prune": _prune_by_dtype}, do_bench=_bench)
    @triton.jit(do_not_specialize=["SIZE_CLASS"])
    def _pool_pack_bwd_kernel(
        dy, dx, dy_kept, tiles, dest,
        SIZE_CLASS, stride_dyr, stride_dyd, stride_xt, stride_kr, stride_kd,
        H: tl.constexpr, W: tl.constexpr, D: tl.constexpr,
        WRITE_DX: tl.constexpr, ZERO_DY: tl.constexpr,
        BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        # dx[t, token] = dy[row(token)] / area(window): the exact adjoint of the forward; every
        # token written once, no atomics. ZERO_DY: dy_kept (a copy of dy, the gradient w.r.t.
        # the original `out`) gets zeros in the rows the forward overwrote. Reads come from dy,
        # never from dy_kept, so the kernel is idempotent (autotuning may run it several times).
        row, t, r0, nr, sh, sw, o_d, m_d = _unpack_tile(tiles, D, BLOCK_D)
        dx_frame = dx + t.to(tl.int64) * stride_xt
        xd = o_d  # frames' rows are contiguous (the launcher sees to it): stride D, 1
        yd = o_d * stride_dyd
        kd = o_d * stride_kd
        if sh == 0:
            # Zero tile: tokens [r0, r0 + nr) of a dropped frame.
            if WRITE_DX:
                o_r = tl.arange(0, BLOCK_R)
                zero = tl.zeros([BLOCK_R, BLOCK_D], dtype=dx.dtype.element_ty)
                for k0 in range(0, nr, BLOCK_R):
                    k = k0 + o_r
                    tl.store(dx_frame + ((r0 + k) * D)[:, None] + xd[None, :], zero,
                             mask=(k < nr)[:, None] & m_d[None, :])
        else:
            y0 = (tl.load(dest + t) + r0).to(tl.int64)
            dy_tile = dy + y0 * stride_dyr
            dk_tile = dy_kept + y0 * stride_kr
            if (sh == 1) & (sw == 1):
                _bwd_window(dy_tile, dx_frame, dk_tile, r0, nr, xd, yd, kd, m_d, stride_dyr,
                            stride_kr, H, W, D, 1, 1, WRITE_DX, ZERO_DY, BLOCK_R, BLOCK_D)
            elif (sh == 2) & (sw == 2):
                _bwd_window(dy_tile, dx_frame, dk_tile, r0, nr, xd, yd, kd, m_d, stride_dyr,
                            stride_kr, H, W, D, 2, 2, WRITE_DX, ZERO_DY, BLOCK_R, BLOCK_D)
            elif (sh == 4) & (sw == 4):
                _bwd_window(dy_tile, dx_frame, dk_tile, r0, nr, xd, yd, kd, m_d, stride_dyr,
                            stride_kr, H, W, D, 4, 4, WRITE_DX, ZERO_DY, BLOCK_R, BLOCK_D)
            elif (sh == 8) & (sw == 8):
                _bwd_window(dy_tile, dx_frame, dk_tile, r0, nr, xd, yd, kd, m_d, stride_dyr,
                            stride_kr, H, W, D, 8, 8, WRITE_DX, ZERO_DY, 4, BLOCK_D)
            else:
                _bwd_generic(dy_tile, dx_frame, dk_tile, r0, nr, sh, sw, tl.load(row + 5), xd, yd, kd, m_d,
                             stride_dyr, stride_kr, H, W, D, WRITE_DX, ZERO_DY, BLOCK_R, BLOCK_D)


def _grid(n_tiles: int, D: int):
    # D-blocks vary fastest, so neighbouring programs read neighbouring bytes of the same rows.
    return lambda meta: (n_tiles * triton.cdiv(D, meta["BLOCK_D"]),)


def _frame_rows(frames: torch.Tensor) -> torch.Tensor:
    """``frames`` with contiguous frames (strides (any, D, 1)): the kernels address a frame's
    tokens as ``token * D + column`` with D a constexpr, so the window offsets are immediates.
    The runtime's frames already are; an exotic strided view is copied once."""
    T, N, D = frames.shape
    if (N > 1 and frames.stride(1) != D) or (D > 1 and frames.stride(2) != 1):
        frames = frames.contiguous()
    if N * D > INT32_MAX:  # offsets inside one frame are int32
        raise PoolPackArgError(f"frames: one frame has {N * D} elements, more than 2**31-1; split the hidden size")
    return frames


def _rows_fit(t: torch.Tensor, name: str, tokens_per_tile: int):
    # A tile spans at most tokens_per_tile output rows; their offsets from the tile's base are int32.
    if (tokens_per_tile - 1) * abs(t.stride(0)) + (t.shape[1] - 1) * abs(t.stride(1)) > INT32_MAX:
        raise PoolPackArgError(f"{name}: row stride {t.stride(0)} is too large for 32-bit offsets "
                               f"within a tile; pass a contiguous [L, D] buffer")


def pool_pack_fwd(frames: torch.Tensor, plan: LaunchPlan, tiles: torch.Tensor, n_fwd: int,
                  y: torch.Tensor, dest: torch.Tensor) -> torch.Tensor:
    """Launch the forward kernel: pool ``frames`` per ``plan`` into the rows of ``y``;
    ``dest`` (int32, per frame, on the device) is the first row of each frame's block."""
    if n_fwd > 0:
        H, W = plan.grid
        frames = _frame_rows(frames)
        _rows_fit(y, "out", TOKENS_PER_TILE)
        _pool_pack_fwd_kernel[_grid(n_fwd, plan.D)](
            frames, y, tiles, dest, size_class(n_fwd), frames.stride(0), y.stride(0), y.stride(1),
            H=H, W=W, D=plan.D,
        )
    return y


def pool_pack_bwd(dy: torch.Tensor, plan: LaunchPlan, tiles: torch.Tensor, n_fwd: int, dest: torch.Tensor,
                  dx: Optional[torch.Tensor] = None, dout: Optional[torch.Tensor] = None) -> None:
    """Launch the backward kernel; it fills the buffers it is given.

    ``dx`` ([T, N, D] contiguous, any content): every token gets its window's gradient, dropped
    frames zeros. ``dout`` (a copy of ``dy``): the rows the forward overwrote are zeroed, which
    makes it the gradient w.r.t. ``out`` as it was before the forward."""
    H, W = plan.grid
    need_dx, need_dout = dx is not None, dout is not None
    n = tiles.shape[0] if need_dx else n_fwd  # zero tiles (dropped frames) only matter for dx
    if plan.T * plan.N == 0 or n == 0 or not (need_dx or need_dout):
        return
    if need_dx and not dx.is_contiguous():
        raise PoolPackArgError("dx: the backward writes a contiguous [T, N, D] gradient buffer")
    _rows_fit(dy, "out", TOKENS_PER_TILE)
    xs = dx if need_dx else dy  # placeholders when a side is not written
    ks = dout if need_dout else dy
    _pool_pack_bwd_kernel[_grid(n, plan.D)](
        dy, xs, ks, tiles, dest, size_class(n), dy.stride(0), dy.stride(1),
        dx.stride(0) if need_dx else 0, ks.stride(0), ks.stride(1),
        H=H, W=W, D=plan.D, WRITE_DX=need_dx, ZERO_DY=need_dout,
    )


class PoolPackFunction(torch.autograd.Function):
    """Autograd for the Triton path. With ``out`` the result IS ``out`` (modified in place,
    marked dirty), so autograd rebases ``out`` -- and the tensor it is a view of -- onto this node.

    ``out`` is the FIRST input on purpose: when ``out`` is a view (``embeds.view(-1, D)``),
    autograd wraps this node in CopySlices, which routes the gradient of input 0 into the base's
    gradient; any other order hands it the frames' gradient and fails on the shapes.
    """

    @staticmethod
    def forward(ctx, out, frames, plan, tiles, n_fwd, dest):
        if out is None:
            y = frames.new_empty(plan.rows, plan.D)
        else:
            y = out
            ctx.mark_dirty(out)
        pool_pack_fwd(frames, plan, tiles, n_fwd, y, dest)
        ctx.plan, ctx.n_fwd = plan, n_fwd
        ctx.frames_meta = (frames.shape, frames.dtype)
        ctx.has_out = out is not None
        ctx.save_for_backward(tiles, dest)
        return y

    @staticmethod
    def backward(ctx, dy):
        tiles, dest = ctx.saved_tensors
        need_dout = ctx.has_out and ctx.needs_input_grad[0]
        need_dx = ctx.needs_input_grad[1]
        shape, dtype = ctx.frames_meta
        dx = torch.empty(shape, dtype=dtype, device=dy.device) if need_dx else None
        dout = dy.clone() if need_dout else None
        pool_pack_bwd(dy, ctx.plan, tiles, ctx.n_fwd, dest, dx, dout)
        return dout, dx, None, None, None, None


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


def pool_pack(frames: torch.Tensor, windows: Sequence, grid: Tuple[int, int] = (16, 16),
              out: Optional[torch.Tensor] = None, dest: Optional[Sequence[int]] = None,
              backend: str = "auto") -> torch.Tensor:
    """Mean-pool each frame's H x W token grid with its own window and pack the results.

    Args:
        frames: ``[T, H*W, D]`` fp32 / fp16 / bf16 (fp64 on the PyTorch backends), CUDA or CPU.
        windows: one window per frame: ``0`` (drop), ``s`` (s x s) or ``(sh, sw)``.
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
    plan = check_args(frames, windows, grid, out, dest, dtypes=dtypes)
    if which == "reference":
        return pool_pack_reference(frames, windows, grid, out=out, dest=dest)
    if which == "torch":
        return pool_pack_torch(frames, plan, out)
    tiles, n_fwd = build_tiles(plan, TOKENS_PER_TILE, frames.device)
    return PoolPackFunction.apply(out, frames, plan, tiles, n_fwd, build_dest(plan, frames.device))


# Windows the request path can hand the kernels: Fragment's high/low (1, 4), Global's scale
# (2; the paper's s=2,4 runs use 4), the uniform ladder and the Image Router's pool (1, 2, 4),
# and 8x8 context frames. The kernel branches on the window at run time (one compiled variant per
# autotuning key), so each window here is for the autotuner's choice and to run every branch once.
PLANNER_WINDOWS = (1, 2, 4, 8)


def _forward_tiles(windows: Sequence, grid: Tuple[int, int]) -> int:
    """How many tiles the forward launches for ``windows`` (one per frame; what ``size_class``
    is taken of)."""
    plan = check_args(torch.empty(len(windows), grid[0] * grid[1], 1, device="meta"), windows, grid,
                      None, None, dtypes=(torch.float32,))
    return tile_table(plan.sched(), plan.N, TOKENS_PER_TILE)[1]


def warmup_launches(max_frames: int, grid: Tuple[int, int] = (16, 16),
                    windows: Sequence = PLANNER_WINDOWS) -> list:
    """The forward launches that cover every kernel variant a request of up to ``max_frames``
    frames can hit: one per size class from 1 tile up to ``max_frames`` frames at the finest
    window (the most tiles a request can launch). Each cycles through ``windows`` (all 1x1 where
    the mix cannot land in a class) with as many frames as the class holds, up to ``max_frames``,
    because the autotuner tunes a class on its first launch.
    Pure host arithmetic: ``[{"frames", "windows", "tiles", "size_class"}]`` (``"windows"``: the
    launch's window per frame)."""
    if int(max_frames) < 1:
        raise ValueError(f"max_frames: expected >= 1, got {max_frames}")
    max_frames = int(max_frames)
    mixes = [list(windows) or [1], [1]]
    most = _forward_tiles([1] * max_frames, grid)

    def sched(mix, T):
        return [mix[i % len(mix)] for i in range(T)]

    def search(mix, ok):  # the smallest T in [1, max_frames] with ok(tiles(T)); tiles grow with T
        lo, hi = 1, max_frames
        if not ok(_forward_tiles(sched(mix, hi), grid)):
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            if ok(_forward_tiles(sched(mix, mid), grid)):
                hi = mid
            else:
                lo = mid + 1
        return lo

    launches = []
    for cls in range(size_class(most) + 1):
        for mix in mixes:
            above = search(mix, lambda n: size_class(n) > cls)  # the first T past this class
            T = (above - 1) if above else max_frames
            if T >= 1 and size_class(_forward_tiles(sched(mix, T), grid)) == cls:
                frame_windows = sched(mix, T)
                launches.append(dict(frames=T, windows=frame_windows,
                                     tiles=_forward_tiles(frame_windows, grid), size_class=cls))
                break
    return launches


def warmup(hidden_size: int, dtype: torch.dtype = torch.bfloat16, device="cuda", grid: Tuple[int, int] = (16, 16),
           max_frames: int = 256, backward: bool = False, windows: Sequence = PLANNER_WINDOWS) -> dict:
    """Compile and autotune, at model load, every kernel variant a request can launch, so that no
    request pays for compilation or benchmarking.

    The autotuning key is (D, grid, size class of the launch, dtype[, WRITE_DX, ZERO_DY]); this
    launches the forward once per size class a request of up to ``max_frames`` frames can reach
    (``warmup_launches``), each over every window in ``windows``, in both forms the request path
    uses: packed (the Image Router's ``pool_frames``) and into ``out`` at ``dest`` (compression).
    Requests run under ``torch.inference_mode``, so no inference path launches the backward;
    ``backward=True`` (training) adds it, the frames' gradient with and without ``out``'s.
    Temporary memory: about ``max_frames`` frames of ``grid`` x ``hidden_size``.

    Returns ``{"seconds", "launches": [{kernel, form, frames, tiles, size_class, seconds}],
    "size_classes", "windows", "backward", "max_frames", "best"}``; ``{"skipped": reason}`` where
    nothing is compiled (CPU tensors: the runtime takes the PyTorch path there)."""
    device = torch.device(device)
    if device.type != "cuda":
        return {"skipped": f"{device.type}: no kernels to compile (the PyTorch path serves this device)"}
    if not HAS_TRITON:
        return {"skipped": "triton is not installed"}
    t_start = time.perf_counter()
    specs = warmup_launches(max_frames, grid, windows)
    launches = []
    for spec in specs:
        launches += _warm(spec, hidden_size, dtype, device, grid, backward)
    best = _best_configs()
    return {"seconds": time.perf_counter() - t_start, "launches": launches,
            "size_classes": sorted({p["size_class"] for p in specs}), "windows": list(windows),
            "backward": bool(backward), "max_frames": int(max_frames), "best": best}


def _warm(spec: dict, hidden_size: int, dtype: torch.dtype, device: torch.device,
          grid: Tuple[int, int], backward: bool) -> list:
    """Run one of :func:`warmup_launches`' launches in every form a request (or, with
    ``backward``, training) uses; each timed, as ``warmup``'s ``launches`` entries."""
    frame_windows, T = spec["windows"], spec["frames"]
    H, W = grid
    frames = torch.randn(T, H * W, hidden_size, device=device, dtype=dtype, requires_grad=backward)
    dest, rows = _blocks_from(pooled_counts(frame_windows, grid), first=4)
    info = dict(frames=T, tiles=spec["tiles"], size_class=spec["size_class"])
    done = []
    t0 = time.perf_counter()
    y = pool_pack(frames, frame_windows, grid, backend="triton")
    done.append(_timed("fwd", "packed", t0, device, info))
    t0 = time.perf_counter()
    with torch.no_grad():
        emb = torch.randn(rows + 8, hidden_size, device=device, dtype=dtype)
        pool_pack(frames, frame_windows, grid, out=emb, dest=dest, backend="triton")
    done.append(_timed("fwd", "out+dest", t0, device, info))
    if backward:
        t0 = time.perf_counter()
        y.backward(torch.ones_like(y))
        out = torch.zeros(rows + 8, hidden_size, device=device, dtype=dtype, requires_grad=True)
        pool_pack(frames, frame_windows, grid, out=out * 1.0, dest=dest, backend="triton").sum().backward()
        done.append(_timed("bwd", "packed and out+dest", t0, device, info))
    return done


def _blocks_from(counts: Sequence[int], first: int) -> Tuple[list, int]:
    """Each frame's first row when the blocks are laid end to end from row ``first``, and the
    row after the last block."""
    dest, acc = [], first
    for c in counts:
        dest.append(acc)
        acc += c
    return dest, acc


def _timed(kernel: str, form: str, t0: float, device: torch.device, info: dict) -> dict:
    """A ``launches`` entry: the launch's time from ``t0`` once the device is done."""
    torch.cuda.synchronize(device)
    return dict(kernel=kernel, form=form, seconds=time.perf_counter() - t0, **info)


def _best_configs() -> dict:
    """The autotuner's choice for every key tuned so far: ``{"fwd <key>": config}``."""
    best = {}
    for name, k in (("fwd", _pool_pack_fwd_kernel), ("bwd", _pool_pack_bwd_kernel)):
        for key, cfg in getattr(k, "cache", {}).items():
            best[f"{name} {key}"] = str(cfg)
    return best
