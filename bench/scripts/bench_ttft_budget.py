"""Latency-budgeted routing on CPU (the target: "the measured TTFT is within the target in >= 90% of
runs across a range of targets"): ``answer(ttft_budget_s=target)`` with the tiny preset.

    python -m bench.scripts.bench_ttft_budget                       # 16 frames, 7 targets x 8 runs, 1 thread
    python -m bench.scripts.bench_ttft_budget --runs 3 --targets 0.25,0.4 --out /tmp/x.json

For each policy (global: the vision tower sees only the kept frames, so the budget moves the
vision cost too; fragment: the shipped routers on the bundled sample clip) it first measures the
TTFT of the full budget and of the smallest plan, then asks for targets spread between the two,
``--runs`` answers each, in a shuffled order (so the correction of the cost model by this
process's measurements cannot ride on one monotone sweep). One untimed warm-up answer per policy
runs first (the first request of a process uses the uncorrected model). CPU figures.
"""
from __future__ import annotations

import argparse
import pathlib
import random
import statistics
import sys

import torch

from bench.harness.env import environment
from bench.harness.results import finish
from bench.harness.tables import markdown_table

ROOT = pathlib.Path(__file__).resolve().parents[2]

QUESTION = "What shape is the red object?"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--targets", default=None, help="comma-separated seconds (default: 7 spread "
                    "between each policy's smallest and full plan)")
    ap.add_argument("--policies", default="global,fragment")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "ttft_budget_cpu_tiny.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from vr_runtime import VideoRouter
    from vr_runtime.backbones.tiny import ASSETS
    video = str(ASSETS.parent / "sample.mp4")
    vr = VideoRouter.from_pretrained("tiny")
    rng = random.Random(args.seed)
    rows, per_policy = [], {}
    for policy in args.policies.split(","):
        kw = dict(num_frames=args.frames, max_length=12288, max_new_tokens=4, policy=policy)
        vr.answer(video, QUESTION, **kw, ttft_budget_s=10.0)         # warm-up (uncorrected model)
        full = statistics.median(vr.answer(video, QUESTION, **kw).report["timings_s"]["ttft"]
                                 for _ in range(3))
        # the smallest plan: what a target far too small gets (one frame at the coarse window)
        small = statistics.median(vr.answer(video, QUESTION, **kw, ttft_budget_s=1e-6).report[
            "timings_s"]["ttft"] for _ in range(3))
        if args.targets:
            targets = [float(x) for x in args.targets.split(",")]
        else:  # from above the smallest plan to above the full one (a loaded machine drifts)
            lo, hi = small * 1.3, max(full, small) * 1.4
            targets = [round(lo + (hi - lo) * i / 6, 3) for i in range(7)]
        order = [t for t in targets for _ in range(args.runs)]
        rng.shuffle(order)
        for target in order:
            r = vr.answer(video, QUESTION, **kw, ttft_budget_s=target).report
            rows.append(dict(policy=policy, target_s=target, ttft_s=r["timings_s"]["ttft"],
                             predicted_s=r["ttft_predicted_s"], visual_tokens=r["visual_tokens"],
                             budget=r["budget"], within=r["timings_s"]["ttft"] <= target,
                             infeasible=any("even the smallest plan" in n for n in r["notes"])))
        per_policy[policy] = dict(full_budget_ttft_s=full, smallest_plan_ttft_s=small,
                                  targets=targets)
    summary = []
    for policy in per_policy:
        for t in per_policy[policy]["targets"]:
            rs = [r for r in rows if r["policy"] == policy and r["target_s"] == t]
            summary.append(dict(policy=policy, target_s=t, runs=len(rs),
                                within=sum(r["within"] for r in rs),
                                infeasible=sum(r["infeasible"] for r in rs),
                                median_ttft_s=statistics.median(r["ttft_s"] for r in rs),
                                median_predicted_s=statistics.median(r["predicted_s"] for r in rs),
                                median_visual_tokens=statistics.median(r["visual_tokens"] for r in rs)))
    n = len(rows)
    within = sum(r["within"] for r in rows)
    feasible = [r for r in rows if not r["infeasible"]]
    within_f = sum(r["within"] for r in feasible)
    env = environment(torch.device("cpu"))
    payload = dict(benchmark="ttft_budget", label="CPU figures", environment=env,
                   settings=dict(model="tiny", frames=args.frames, runs=args.runs,
                                 threads=args.threads, video="vr_runtime/assets/sample.mp4"),
                   policies=per_policy, summary=summary, rows=rows,
                   within_fraction=within / max(n, 1), runs_total=n,
                   feasible_runs=len(feasible), within_fraction_feasible=within_f / max(len(feasible), 1))
    md = ["# Latency-budgeted routing, tiny preset (CPU figures)", "",
          f"{env['device']}, {env['date_utc']}, torch {env['torch']}, transformers "
          f"{env['transformers']}, load average {env.get('load_avg_1m')}; `{env['command']}`.", "",
          f"**Measured TTFT within the target in {within_f} of {len(feasible)} runs whose target "
          f"the model judged reachable ({100 * within_f / max(len(feasible), 1):.0f}%); "
          f"{within} of {n} over all runs** (a target below the smallest plan's predicted TTFT "
          f"gets the smallest plan and a note).", "",
          markdown_table(summary, ["policy", "target_s", "runs", "within", "infeasible",
                                          "median_ttft_s", "median_predicted_s",
                                          "median_visual_tokens"])]
    for policy, p in per_policy.items():
        md.append(f"\n{policy}: full budget TTFT {p['full_budget_ttft_s']:.3f} s, smallest plan "
                  f"{p['smallest_plan_ttft_s']:.3f} s (medians of 3).")
    finish(args.out, payload, "\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
