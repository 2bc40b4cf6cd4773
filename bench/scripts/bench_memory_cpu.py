"""Activation memory of one request on CPU: Dense against the compressed paths (tiny model).

    python -m bench.scripts.bench_memory_cpu [--frames 256] [--out bench/results/memory_cpu_tiny_256.json]

Each row runs in a fresh process (so the resident figures are its own): the ``tiny`` preset with
its shipped routers, one warm-up answer of the same policy on 8 frames (lazy initialisation is
not counted), then one answer on ``--frames`` random frames (the decoded video, made before the
measurement) with

* the **activation peak**: the most bytes PyTorch's CPU allocator had handed out at once during
  the answer, above what was live at its start (``vr_runtime.telemetry.memory.TorchAllocationPeak``: the
  profiler's memory events) -- the weights, loaded before, are not in it;
* the report's CPU figures: ``peak_memory_bytes`` (the process's resident high-water mark over
  the request, VmHWM reset at its start) and ``peak_activation_bytes`` (its rise over the
  resident set at the start), and ``weights_bytes`` (shadow stack included).

Rows: Dense (every frame at 256 tokens; ``allow_over_length``), Global (the plan fitted into
``max_length`` 12,288) and VideoRouter (s=2,4) (Fragment, both routers run, a fixed relevance
pattern of 7 frames in 16). The tiny preset's context (max_position_embeddings 32,768) is raised
for this run so that Dense at 256 frames (65,536 visual tokens) runs: its rotary embedding has no
scaling, so positions past 32,768 are computed the same way. Times are not reported (the
profiler is on). All figures are CPU figures.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
from typing import Dict, List, Optional

from bench.harness.processes import ROOT, child_command
from bench.harness.results import RESULTS

ROWS = {"dense": "Dense", "global": "Global (s=2, fitted)", "vr24": "VideoRouter (s=2,4)"}
QUESTION = "Which color is the square in the video?"


def relevance(T: int) -> List[bool]:
    return [t % 16 < 7 for t in range(T)]


def options(row: str, T: int, chunk_size: int):
    from vr_runtime.request import AnswerOptions
    from vr_runtime.routing.scorers import FixedRelevance
    kw = dict(num_frames=T, max_new_tokens=4, chunk_size=chunk_size)
    if row == "dense":
        return AnswerOptions(policy="dense", allow_over_length=True, **kw)
    if row == "global":
        return AnswerOptions(policy="global", **kw)
    return AnswerOptions(policy="fragment", scorer=FixedRelevance(relevance(T), run_routers=True),
                         **kw)


def one(row: str, frames: int, threads: int, chunk_size: int) -> Dict:
    import torch

    from vr_runtime.telemetry.memory import TorchAllocationPeak
    from vr_runtime.runtime import VideoRouter
    torch.set_num_threads(threads)
    vr = VideoRouter.from_pretrained("tiny", warmup_frames=0)
    vr.lm.text_config.max_position_embeddings = max(
        int(vr.lm.text_config.max_position_embeddings), 2 * frames * 256 + 4096)
    g = torch.Generator().manual_seed(0)
    vr.answer(torch.randn(8, 3, 448, 448, generator=g), QUESTION,
              options=options(row, 8, chunk_size))                       # warm-up
    video = torch.randn(frames, 3, 448, 448, generator=g)
    with torch.inference_mode(), TorchAllocationPeak() as p:
        rep = vr.answer(video, QUESTION, options=options(row, frames, chunk_size)).report
    return dict(row=row, method=ROWS[row], frames=frames, visual_tokens=rep["visual_tokens"],
                prompt_tokens=rep["prompt_tokens"], activation_peak_bytes=p.peak,
                left_allocated_bytes=p.allocated,
                report_peak_memory_bytes=rep["peak_memory_bytes"],
                report_peak_memory_source=rep["peak_memory_source"],
                report_peak_activation_bytes=rep["peak_activation_bytes"],
                weights_bytes=rep["weights_bytes"], policy_run=rep["policy"],
                windows=sorted(set(map(str, rep["windows"]))))


def main(argv: Optional[List[str]] = None) -> Dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--chunk-size", type=int, default=16, help="frames per vision-tower call")
    ap.add_argument("--rows", default="dense,global,vr24")
    ap.add_argument("--out", default=os.path.join(RESULTS, "memory_cpu_tiny_256.json"))
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(one(args.one, args.frames, args.threads, args.chunk_size)))
        return {}
    import torch

    from bench.harness.env import environment
    from bench.harness.results import report
    from bench.harness.tables import markdown_table
    torch.set_num_threads(args.threads)   # as the rows' processes (the results file says so)
    rows = []
    for row in args.rows.split(","):
        cmd = child_command("bench.scripts.bench_memory_cpu", [
            "--one", row, "--frames", str(args.frames), "--threads", str(args.threads),
            "--chunk-size", str(args.chunk_size)])
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout
        got = json.loads(next(line for line in out.splitlines()
                              if line.startswith("RESULT "))[len("RESULT "):])
        rows.append(got)
        print(got, flush=True)
    dense = next((r for r in rows if r["row"] == "dense"), None)
    mib = 2 ** 20
    for r in rows:
        r["activation_peak_mib"] = r["activation_peak_bytes"] / mib
        r["activation_x_dense"] = (r["activation_peak_bytes"] / dense["activation_peak_bytes"]
                                   if dense else None)
        r["resident_peak_mib"] = r["report_peak_memory_bytes"] / mib
        r["resident_rise_mib"] = (None if r["report_peak_activation_bytes"] is None
                                  else r["report_peak_activation_bytes"] / mib)
        r["weights_mib"] = r["weights_bytes"]["total"] / mib
        r["shadow_stack_mib"] = r["weights_bytes"]["shadow_stack"] / mib
    env = environment(torch.device("cpu"))
    notes = [
        "CPU figures. activation peak: PyTorch's CPU allocator, the most bytes live at once "
        "during the answer above what was live at its start (profiler memory events); weights "
        "and the decoded frames were allocated before it and are not in it.",
        "resident peak: the report's peak_memory_bytes on CPU (VmHWM of the process over the "
        "request: weights, libraries and the allocator's retained heap included); resident "
        "rise: the report's peak_activation_bytes (that peak minus the resident set at the "
        "request's start).",
        f"tiny preset (shipped routers), {args.frames} random frames, {args.threads} torch "
        f"thread(s), vision chunk {args.chunk_size} frames; each row in a fresh process after a "
        f"warm-up answer on 8 frames; the context raised past 32,768 for Dense (see the script).",
    ]
    body = [markdown_table(rows, ["method", "visual_tokens", "prompt_tokens", "activation_peak_mib",
                                "activation_x_dense", "resident_peak_mib", "resident_rise_mib",
                                "weights_mib", "shadow_stack_mib"],
                         ["method", "visual tokens", "prompt tokens",
                          "activation peak MiB (CPU, torch allocator)", "x Dense",
                          "resident peak MiB (CPU, VmHWM)", "resident rise MiB (CPU)",
                          "weights MiB", "of which shadow stack MiB"])]
    return report(args.out, f"# Activation memory, Dense vs compressed: tiny model, {args.frames} "
                  "frames (CPU)", env, notes, body, label="CPU", rows=rows,
                  settings=dict(frames=args.frames, threads=args.threads,
                                chunk_size=args.chunk_size, question=QUESTION))


if __name__ == "__main__":
    main()
