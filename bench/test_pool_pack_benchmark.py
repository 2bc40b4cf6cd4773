"""pool_pack against PyTorch as pytest-benchmark groups: one group a shape and direction.

    pytest bench/ --benchmark-only --benchmark-json=F             # every group, GB/s in extra_info
    pytest bench/ --benchmark-only --benchmark-save=base          # keep a run (.benchmarks/)
    pytest bench/ --benchmark-only --benchmark-compare=0001 --benchmark-compare-fail=median:10%
    pytest bench/ --benchmark-only -m gpu                         # the Triton rows only (CUDA)
    python -m bench.report.pytest_benchmark_table F              # F as a markdown table

Rows of each group, all producing the same rows of the LLM's ``inputs_embeds``:

* ``triton``     ``pool_pack(..., backend="triton")``, the fused kernel (CUDA only, ``-m gpu``);
                 backward: its launcher into a preallocated gradient, as autograd calls it;
* ``torch``      the vectorised PyTorch path of vr_kernels (``backend="torch"``);
* ``reference``  the per-frame loop (``pool_pack_reference``: ``avg_pool2d`` a frame);
* ``compiled``   ``torch.compile(pool_pack_reference, dynamic=False)``, steady state (its compile
                 is the untimed first call). By default at the paper shape on a GPU only: on the
                 CPU compiling takes 4-35 s a shape (BENCHMARKS.md 1b) and every sweep shape
                 would recompile, so those rows skip and say so; ``--bench-compile`` runs them;
* ``copy``       a device copy moving the same bytes: the bandwidth a memory-bound row can reach.

Shapes: ``smoke`` (T=4, D=64: host overhead; the test suite's smoke run), ``paper`` (T=64,
16x16 grid, D=3584, windows 1/2/4/8 and dropped frames; bf16 and fp32, forward and backward)
and a skewed ragged sweep at D=3584 (GPU) / 896 (CPU): ``ragged`` T=16/64/256 (most frames
dropped or 8x8 / 4x8, a few 2x2 / 2x4 / 1x1: 0-256 rows a frame), ``one_kept`` (T=256, one
frame kept) and ``all1x1`` (T=64, packing without pooling).

Every row is first checked against the reference within its dtype's tolerance (``TOLERANCE``),
then timed as bench_pool_pack.py times it: >= 200 ms of work first to warm the clocks, input
sets rotated so that the memory touched between two uses of a set is >= 2x the last-level cache
(each call reads cold memory, as a request does), and pytest-benchmark's timer synchronises the
device before reading the clock (``device_timer``), so a round is the call's wall time with its
device work done. The spread over fresh processes stays with ``bench_pool_pack.py --processes 3``
(a pytest run is one process), and so do CUDA-graph device times.

GB/s come from an explicit minimal byte count (``extra_info``: ``bytes``, ``gbps`` at the
median, ``byte_count``): forward reads every token of the kept frames once and writes every
output row once; backward reads every output-row gradient once and writes every frame-token
gradient once.

Regressions: save a baseline and compare with ``--benchmark-compare-fail=median:10%`` on a
GPU (the goal for the spread across processes is 10%), ``median:25%`` on a shared CPU (3-20%
spread measured across processes there); a row slower than that by the median fails the run.
"""
from __future__ import annotations

import random
import time
from typing import List, NamedTuple

import pytest
import torch

from bench.harness.timing import gbps, rotation_count, warm_clocks
from bench.models.pool_pack_inputs import GRID, Case, copy_fn, reference_into, reference_packed
from vr_kernels import pool_pack, pool_pack_reference

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
D_SWEEP = 3584 if CUDA else 896     # the sweep's hidden size: the 8B's on a GPU, smaller on CPU
WARM_S = 0.2                        # seconds of work before a row is timed (clocks out of idle)
MAX_ROUNDS = 200                    # rounds of a row: about --benchmark-max-time seconds (default
                                    # 1), at least --benchmark-min-rounds (default 5), at most this
# Per-dtype tolerances of a row against the reference (the kernels and the PyTorch path
# accumulate in fp32 and round once, in another order than the reference).
TOLERANCE = {torch.float32: dict(atol=1e-5, rtol=1e-5),
             torch.float16: dict(atol=1e-3, rtol=1e-3),
             torch.bfloat16: dict(atol=1e-2, rtol=1.6e-2)}


def device_timer() -> float:
    """pytest-benchmark's clock: the device's queued work is finished before it is read."""
    if CUDA:
        torch.cuda.synchronize()
    return time.perf_counter()


pytestmark = pytest.mark.benchmark(timer=device_timer, disable_gc=True)


class Shape(NamedTuple):
    name: str
    T: int
    D: int
    mix: str
    dtype: torch.dtype

    @property
    def id(self) -> str:
        return f"{self.name}-T{self.T}-D{self.D}-{str(self.dtype).replace('torch.', '')}"


def ragged(T: int, seed: int = 0) -> List:
    """A skewed, ragged schedule: most frames dropped or coarse (8x8, 4x8), a few fine (2x2,
    2x4, 1x1), so a frame's rows run from 0 to 256 with a long tail."""
    rng = random.Random(seed)
    choices = [0] * 4 + [8] * 3 + [(4, 8)] * 2 + [4] * 2 + [(2, 4), 2, 1]
    s = [rng.choice(choices) for _ in range(T)]
    if all(w == 0 for w in s):
        s[0] = 1
    return s


SHAPES = [Shape("smoke", 4, 64, "paper", torch.bfloat16),
          Shape("paper", 64, 3584, "paper", torch.bfloat16),
          Shape("paper", 64, 3584, "paper", torch.float32)] + \
         [Shape("ragged", T, D_SWEEP, "ragged", torch.bfloat16) for T in (16, 64, 256)] + \
         [Shape("one_kept", 256, D_SWEEP, "one_kept", torch.bfloat16),
          Shape("all1x1", 64, D_SWEEP, "all1x1", torch.bfloat16)]
BWD_SHAPES = [s for s in SHAPES if s.name in ("smoke", "paper")]
METHODS = [pytest.param("triton", marks=pytest.mark.gpu), "torch", "reference", "compiled", "copy"]


def _case(shape: Shape) -> Case:
    mix = "paper" if shape.mix == "ragged" else shape.mix
    case = Case(shape.T, shape.D, mix, shape.dtype, DEVICE)
    if shape.mix == "ragged":
        case.mix = "ragged"
        case.set_schedule(ragged(shape.T))
    return case


def _compile_or_skip(request, shape: Shape):
    if request.config.getoption("--bench-compile"):
        return
    if not CUDA:
        pytest.skip("torch.compile of the reference on CPU: 4-35 s of compiling a shape "
                    "(BENCHMARKS.md 1b); --bench-compile runs it")
    if shape.name != "paper":
        pytest.skip("torch.compile runs at the paper shape only (recompiling every sweep "
                    "shape would dominate the run); --bench-compile runs it")


def _rounds(benchmark, fn, setup) -> int:
    args, kwargs = setup()
    t0 = device_timer()
    fn(*args, **kwargs)
    once = device_timer() - t0
    budget = benchmark._max_time, benchmark._min_rounds   # pytest-benchmark's own options
    return int(min(MAX_ROUNDS, max(budget[1], budget[0] // max(once, 1e-9))))


def _run(benchmark, fn, setup, n_sets: int, nbytes: int, info: dict):
    """Warm, then time ``fn(*setup())`` over rotated sets; GB/s from ``nbytes``."""
    benchmark.extra_info.update(info, bytes=nbytes, rotation=n_sets, device=str(DEVICE))
    if benchmark.disabled:      # --benchmark-disable (the smoke test): one untimed call
        return benchmark.pedantic(fn, setup=setup, rounds=1)
    def call():
        args, kwargs = setup()
        fn(*args, **kwargs)

    warm = warm_clocks([call], device=DEVICE, seconds=WARM_S, calls=n_sets)
    benchmark.extra_info["warm"] = dict(calls=warm["calls"], seconds=round(warm["seconds"], 3))
    rounds = _rounds(benchmark, fn, setup)
    result = benchmark.pedantic(fn, setup=setup, rounds=rounds, warmup_rounds=1)
    median = benchmark.stats.stats.median
    benchmark.extra_info["gbps"] = round(gbps(nbytes, median), 3)
    return result


def _cycle(items):
    state = {"i": 0}

    def nxt():
        x = items[state["i"] % len(items)]
        state["i"] += 1
        return x
    return nxt


FWD_BYTES = "(kept_frames*256*D + out_rows*D) * elem_size"
BWD_BYTES = "(out_rows*D + T*256*D) * elem_size"


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.id)
def test_pool_pack_fwd(benchmark, request, shape, method):
    """Forward, the runtime's call: frames pooled into ``out`` at ``dest``."""
    case = _case(shape)
    sc, dest, D = case.scales, case.dest, case.D
    benchmark.group = f"fwd {shape.id}"
    info = dict(T=shape.T, D=D, mix=shape.mix, dtype=str(shape.dtype), method=method,
                direction="fwd", kept_frames=case.kept, out_rows=case.total,
                byte_count=FWD_BYTES)
    nbytes = case.fwd_bytes()
    n = rotation_count(nbytes + case.embeds.numel() * case.embeds.element_size(), DEVICE)
    if method == "copy":
        fns = [copy_fn(nbytes, DEVICE) for _ in range(n)]
        nxt = _cycle(fns)
        _run(benchmark, lambda f: f(), lambda: ((nxt(),), {}), n, nbytes, info)
        return
    if method == "triton":
        fn = lambda f, e: pool_pack(f, sc, GRID, out=e, dest=dest, backend="triton")  # noqa: E731
    elif method == "torch":
        fn = lambda f, e: pool_pack(f, sc, GRID, out=e, dest=dest, backend="torch")  # noqa: E731
    elif method == "reference":
        fn = lambda f, e: pool_pack_reference(f, sc, GRID, out=e, dest=dest)  # noqa: E731
    else:
        _compile_or_skip(request, shape)
        torch._dynamo.reset()
        comp = torch.compile(reference_into, dynamic=False)
        fn = lambda f, e: comp(f, sc, e, dest)  # noqa: E731
    sets = [(f, e.view(-1, D)) for f, e in case.rotation(n)]
    f0, e0 = sets[0]
    want = pool_pack_reference(f0, sc, GRID, out=e0.clone(), dest=dest)
    torch.testing.assert_close(fn(f0, e0.clone()), want, **TOLERANCE[shape.dtype])
    nxt = _cycle(sets)
    _run(benchmark, fn, lambda: (nxt(), {}), n, nbytes, info)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape", BWD_SHAPES, ids=lambda s: s.id)
def test_pool_pack_bwd(benchmark, request, shape, method):
    """Backward: the gradient w.r.t. the frames of the packed rows (dropped frames get zeros).
    The PyTorch rows go through autograd; the forward that builds the graph is untimed."""
    case = _case(shape)
    sc, D = case.scales, case.D
    benchmark.group = f"bwd {shape.id}"
    info = dict(T=shape.T, D=D, mix=shape.mix, dtype=str(shape.dtype), method=method,
                direction="bwd", kept_frames=case.kept, out_rows=case.total,
                byte_count=BWD_BYTES)
    nbytes = case.bwd_bytes()
    n = rotation_count(nbytes, DEVICE)
    if method == "copy":
        fns = [copy_fn(nbytes, DEVICE) for _ in range(n)]
        nxt = _cycle(fns)
        _run(benchmark, lambda f: f(), lambda: ((nxt(),), {}), n, nbytes, info)
        return
    grads = [torch.randn(case.total, D, device=DEVICE, dtype=shape.dtype) for _ in range(n)]
    frames = [f for f, _ in case.rotation(n)]
    leaf = frames[0].detach().clone().requires_grad_(True)
    pool_pack_reference(leaf, sc, GRID).backward(grads[0])
    want = leaf.grad
    if method == "triton":
        from vr_kernels.checks import KERNEL_DTYPES, check_args
        from vr_kernels.pool_pack import TOKENS_PER_TILE, pool_pack_bwd
        from vr_kernels.tiles import build_dest, build_tiles
        plan = check_args(frames[0], sc, GRID, None, None, dtypes=KERNEL_DTYPES)
        tiles, n_fwd = build_tiles(plan, TOKENS_PER_TILE, DEVICE)
        dest_t = build_dest(plan, DEVICE)
        dxs = [torch.empty_like(f) for f in frames]
        fn = lambda g, dx: pool_pack_bwd(g, plan, tiles, n_fwd, dest_t, dx)  # noqa: E731
        fn(grads[0], dxs[0])      # fills dx
        torch.testing.assert_close(dxs[0], want, **TOLERANCE[shape.dtype])
        nxt = _cycle(list(zip(grads, dxs)))
        _run(benchmark, fn, lambda: (nxt(), {}), n, nbytes, info)
        return
    if method == "torch":
        forward = lambda a: pool_pack(a, sc, GRID, backend="torch")  # noqa: E731
    elif method == "reference":
        forward = lambda a: pool_pack_reference(a, sc, GRID)  # noqa: E731
    else:
        _compile_or_skip(request, shape)
        torch._dynamo.reset()
        comp = torch.compile(reference_packed, dynamic=False)
        forward = lambda a: comp(a, sc)  # noqa: E731
    leaves = [f.detach().clone().requires_grad_(True) for f in frames]
    forward(leaves[0]).backward(grads[0])
    torch.testing.assert_close(leaves[0].grad, want, **TOLERANCE[shape.dtype])
    nxt = _cycle(list(zip(leaves, grads)))

    def setup():
        a, g = nxt()
        a.grad = None
        return (forward(a), g), {}
    _run(benchmark, lambda y, g: y.backward(g), setup, n, nbytes, info)
