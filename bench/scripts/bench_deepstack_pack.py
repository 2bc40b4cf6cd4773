"""DeepStack packing: one pool_pack over the stacked streams vs one call a stream.

Qwen3-VL's Z carries its main stream and three DeepStack streams (vr_runtime/backbones/
qwen3_vl.py). Every stream must be pooled with the same per-unit plan. Two layouts:

* stacked   Z [U, N, S*D] (streams side by side), one ``pool_pack`` into [L, S*D] rows: what
            the runtime does (``reconstruct.reconstruct_embeds`` with a wide Z);
* a stream  S tensors [U, N, D], S ``pool_pack`` calls, each into its own [L, D] rows: with
            the streams already apart (another Z layout, which the routers' per-unit reads and
            the runtime's unit indexing do not want), and split from the runtime's wide Z
            (a contiguous copy of each stream first), the per-stream path the runtime could take.

    python -m bench.scripts.bench_deepstack_pack [--units 16] [--hidden 4096] [--streams 4] [--out FILE [--append]]

Prints one JSON object (device, shape, plan, medians). On CPU both run pool_pack's torch path
(the runtime's CPU path); on CUDA the Triton kernels.
"""
from __future__ import annotations

import argparse
import json

import torch

from bench.harness.env import environment
from bench.harness.results import add_append_flag, with_run, write_results
from bench.harness.timing import measure
from vr_kernels import pool_pack, pooled_counts


def plans(U: int):
    """Global (every unit 2x2) and a Fragment mix (every fourth unit at 1, the rest at 4)."""
    return {"global": [2] * U, "fragment": [1 if u % 4 == 0 else 4 for u in range(U)]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=4096)      # Qwen3-VL-8B's D
    ap.add_argument("--streams", type=int, default=4)        # main + 3 DeepStack
    ap.add_argument("--grid", type=int, default=14)          # 448x448 at patch 16, merge 2
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rep", type=int, default=10)
    ap.add_argument("--out", help="results .json to keep (default: stdout only)")
    add_append_flag(ap)
    a = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dt = getattr(torch, a.dtype)
    grid = (a.grid, a.grid)
    U, N, D, S = a.units, a.grid * a.grid, a.hidden, a.streams
    g = torch.Generator().manual_seed(0)
    wide = torch.randn(U, N, S * D, generator=g).to(dev, dt)
    split = [wide[..., s * D:(s + 1) * D].contiguous() for s in range(S)]
    kw = {"backend": "torch"} if dev.type == "cpu" else {}
    rows = {}
    for name, plan in plans(U).items():
        counts = pooled_counts(plan, grid)
        dest = [sum(counts[:t]) for t in range(U)]
        L = sum(counts)
        out_wide = torch.empty(L, S * D, device=dev, dtype=dt)
        outs = [torch.empty(L, D, device=dev, dtype=dt) for _ in range(S)]
        # One input set a layout: the L2 is flushed before each call instead of rotated
        tm = dict(device=dev, rep=a.rep, warmup=3, flush_l2=True)
        stacked = measure(lambda: pool_pack(wide, plan, grid, out=out_wide, dest=dest, **kw), **tm)
        per = measure(lambda: [pool_pack(z, plan, grid, out=o, dest=dest, **kw)
                               for z, o in zip(split, outs)], **tm)
        from_wide = measure(lambda: [pool_pack(wide[..., s * D:(s + 1) * D].contiguous(), plan,
                                               grid, out=outs[s], dest=dest, **kw)
                                     for s in range(S)], **tm)
        ref = pool_pack(wide, plan, grid, out=out_wide, dest=dest, **kw)
        for s in range(S):
            got = pool_pack(split[s], plan, grid, out=outs[s], dest=dest, **kw)
            assert torch.equal(ref[:, s * D:(s + 1) * D], got), "the layouts disagree"
        rows[name] = {"tokens": L, "stacked_ms": round(stacked.median_ms, 3),
                      "per_stream_ms": round(per.median_ms, 3),
                      "per_stream_from_wide_ms": round(from_wide.median_ms, 3),
                      "per_stream_over_stacked": round(per.median / stacked.median, 3)}
    res = {"environment": environment(dev), "dtype": a.dtype, "units": U,
           "tokens_per_unit": N, "hidden": D, "streams": S, "plans": rows}
    print(json.dumps(res, indent=2))
    if a.out:   # whole or not at all (the harness's atomic write)
        write_results(a.out, with_run(a.out, res) if a.append else res)


if __name__ == "__main__":
    main()
