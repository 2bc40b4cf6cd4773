"""Qwen3-VL: the cost model's TTFT table for Qwen3-VL-8B (a *model*, not a measurement) and
CPU TTFT by policy for the tiny-qwen3-vl preset (measured).

    python -m bench.scripts.bench_qwen3_vl [--out bench/results/qwen3_vl] [--runs 3]

1. Model: ``vr_runtime.planning.cost_model.predict_ttft`` with Qwen3VLBackbone.cost_shape of
   ``vr_runtime/configs/qwen3_vl_8b.json`` on the nominal H100 and H200 specs: 128 sampled
   frames = 64 units (temporal patches) of 196 tokens at 448x448, B_img = 12,288, per policy
   (Fragment with 28 of 64 units relevant, as the paper's 28 of 64 frames). The text is an
   estimate: 620 tokens (Qwen's tokenizer splits digits, so a unit's `<t seconds>` and its two
   delimiters are about 9 tokens). Not modelled: the three DeepStack mergers (each the size of
   the main merger) and the 4x wider pool_pack rows (compress); both are small beside the tower.
2. Measured: tiny-qwen3-vl (random weights) on this CPU, a random 16-frame clip (8 units),
   ``answer(..., budget=...)`` per policy, the fastest and the median of ``--runs`` TTFTs
   (vision + router + compress + prefill) after one warm-up call. Untrained routers: ``auto``
   falls back to ``global``; ``fragment`` gets its relevance from ``FixedRelevance`` (every
   fourth unit), with both routers still run and timed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

from bench.harness.env import environment, environment_line
from bench.harness.tables import markdown_table

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

UNITS, PER_UNIT, BUDGET, TEXT, RELEVANT = 64, 196, 12288, 620, 28


def model_rows(config_path: str):
    from vr_kernels import pooled_counts
    from vr_runtime.planning.cost_model import predict_ttft
    from vr_runtime.planning.budget import plan_fragment, plan_global, plan_uniform
    grid = (14, 14)
    rel = [u % 16 < 7 for u in range(UNITS)]   # 28 of 64
    plans = {
        "dense": ([1] * UNITS, False),
        "budget": ([1] * (BUDGET // PER_UNIT), False),
        "uniform": (plan_uniform(UNITS, BUDGET, grid), False),
        "global": (plan_global(UNITS, BUDGET, grid, 2), True),
        "fragment (s=2,1,4)": (plan_fragment(rel, BUDGET, grid, 1, 4, 2), True),
        "fragment (s=4,1,8)": (plan_fragment(rel, BUDGET, grid, 1, 8, 4), True),
    }
    cfg = json.load(open(config_path))
    rows = []
    for name, (plan, routers) in plans.items():
        vt = sum(pooled_counts(plan, grid))
        kept = sum(1 for w in plan if w)
        row = {"policy": name, "units": kept, "visual_tokens": vt}
        for dev in ("h100", "h200"):
            p = predict_ttft(cfg, vt, TEXT, kept, dev, routers=routers)
            row[f"{dev}_ttft_s"] = round(p["ttft_s"], 3)
            if dev == "h100":
                row.update({f"h100_{k}_s": round(v, 3) for k, v in p["stages_s"].items()})
        rows.append(row)
    return rows


def cpu_rows(runs: int):
    from vr_runtime.runtime import VideoRouter
    from vr_runtime.backbones import load_backbone
    from vr_runtime.routing.scorers import FixedRelevance
    vr = VideoRouter(load_backbone("tiny-qwen3-vl"), warmup_frames=0)
    g = torch.Generator().manual_seed(0)
    clip = type("Clip", (), {})()
    clip.pixel_values = torch.randn(16, 3, 448, 448, generator=g)
    clip.frame_indices = list(range(0, 96, 6))
    clip.timestamps_s = [i / 24 for i in clip.frame_indices]
    clip.note = None
    budget = 4 * PER_UNIT
    rel = [u % 4 == 0 for u in range(8)]
    rows = []
    for policy in ("dense", "budget", "uniform", "global", "auto", "fragment"):
        kw = dict(num_frames=16, max_new_tokens=1, policy=policy)
        if policy != "dense":
            kw["budget"] = budget
        if policy == "fragment":
            kw["scorer"] = FixedRelevance(rel, run_routers=True)   # the routers run, timed
        vr.answer(clip, "What happens in the video?", **kw)   # warm-up
        reps = [vr.answer(clip, "What happens in the video?", **kw).report for _ in range(runs)]
        best = min(reps, key=lambda r: r["timings_s"]["ttft"])   # least disturbed by the load
        rows.append({"policy": policy, "units": sum(1 for w in best["windows"] if w),
                     "visual_tokens": best["visual_tokens"],
                     "ttft_median_ms": round(1e3 * statistics.median(
                         r["timings_s"]["ttft"] for r in reps), 1),
                     "ttft_ms": round(1e3 * best["timings_s"]["ttft"], 1),
                     **{f"{k}_ms": round(1e3 * best["timings_s"][k], 1)
                        for k in ("vision", "router", "compress", "prefill")}})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "qwen3_vl"))
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args(argv)
    env = environment(torch.device("cpu"))
    model = model_rows(os.path.join(ROOT, "vr_runtime", "configs",
                                    "qwen3_vl_8b.json"))
    cpu = cpu_rows(a.runs)
    res = {"environment": env, "model_qwen3_vl_8b": model, "cpu_tiny_qwen3_vl": cpu}
    with open(a.out + ".json", "w") as f:
        json.dump(res, f, indent=2)
    md = ["# Qwen3-VL", "",
          "## Qwen3-VL-8B, model (cost model, nominal specs; not measured)", "",
          f"128 frames = {UNITS} units of {PER_UNIT} tokens, B_img = {BUDGET:,}, "
          f"{TEXT} text tokens (estimate), Fragment: {RELEVANT} of {UNITS} units relevant.", "",
          markdown_table(model, ["policy", "units", "visual_tokens", "h100_vision_s",
                                 "h100_router_s", "h100_compress_s", "h100_prefill_s",
                                 "h100_ttft_s", "h200_ttft_s"]), "",
          "## tiny-qwen3-vl, CPU (measured)", "", environment_line(env), "",
          f"16 frames = 8 units, fixed budget {4 * PER_UNIT} tokens (dense: none); of {a.runs} "
          f"runs, the fastest (ttft_ms, its stages) and the median TTFT: on a shared CPU the "
          f"fastest run is the least disturbed one.", "",
          markdown_table(cpu, ["policy", "units", "visual_tokens", "vision_ms", "router_ms",
                               "compress_ms", "prefill_ms", "ttft_ms", "ttft_median_ms"]), ""]
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
