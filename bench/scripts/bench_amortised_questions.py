"""Amortised TTFT of several questions on one video (CPU): the visual prefix's KV cache reused.

    python -m bench.scripts.bench_amortised_questions [--frames 64] [--questions 4] [--rounds 5]
                                        [--out bench/results/amortised_questions_cpu_tiny.json]

The ``tiny`` preset (shipped routers), ``--frames`` random frames, ``--questions`` different
questions asked one after another about the same video with policy ``global`` (one plan for all:
the Global plan does not depend on the question) and ``cache_visual`` on -- so frames, Z and the
vision stage are reused in both modes -- with the prefix cache off (every question prefills its
whole prompt) and on (``VideoRouter(prefix_cache=True)``: from the second question, only the
tokens after the last visual token are prefilled). A round clears the visual cache and asks the
questions in order; the two modes alternate round by round; medians over rounds. The answers of
the two modes are compared token for token. CPU figures.
"""
from __future__ import annotations

import argparse
import os
import statistics
from typing import Dict, List, Optional

from bench.harness.env import environment
from bench.harness.results import RESULTS, report
from bench.harness.tables import markdown_table

QUESTIONS = ["Which color is the square in the video?", "What shape is the red object?",
             "Is there a star in the video?", "Which color is the background?",
             "How many objects move?", "What is in the top left corner?"]


def main(argv: Optional[List[str]] = None) -> Dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=64)
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--out", default=os.path.join(RESULTS, "amortised_questions_cpu_tiny.json"))
    args = ap.parse_args(argv)
    import torch

    from vr_runtime.runtime import VideoRouter
    torch.set_num_threads(args.threads)
    qs = QUESTIONS[:args.questions]
    vr = VideoRouter.from_pretrained("tiny", warmup_frames=0)
    video = torch.randn(args.frames, 3, 448, 448, generator=torch.Generator().manual_seed(0))
    kw = dict(num_frames=args.frames, max_new_tokens=args.max_new_tokens, policy="global",
              cache_visual=True)

    def round_(reuse: bool):
        vr.prefix_cache = reuse
        vr.clear_visual_cache()
        out = []
        for q in qs:
            ids = []
            rep = vr.answer(video, q, on_token=ids.append, **kw).report
            out.append((ids, rep))
        return out

    round_(False), round_(True)                                         # warm-up
    got = {False: [], True: []}
    for r in range(args.rounds):
        for reuse in ((False, True) if r % 2 == 0 else (True, False)):
            got[reuse].append(round_(reuse))
    same = all(a[0] == b[0] for ra, rb in zip(got[False], got[True]) for a, b in zip(ra, rb))
    rows = []
    for i, q in enumerate(qs):
        row = dict(question=i + 1)
        for reuse, name in ((False, "off"), (True, "on")):
            reps = [rnd[i][1] for rnd in got[reuse]]
            row[f"ttft_{name}_s"] = statistics.median(r["timings_s"]["ttft"] for r in reps)
            row[f"prefill_{name}_s"] = statistics.median(r["timings_s"]["prefill"] for r in reps)
            row[f"vision_{name}_s"] = statistics.median(r["timings_s"]["vision"] for r in reps)
        last = got[True][-1][i][1]
        row["prefix"] = (f"{last['prefix_cache']['status']} ({last['prefix_cache']['tokens']} "
                         f"of {last['prompt_tokens']} tokens)")
        rows.append(row)
    amort = {name: statistics.mean(r[f"ttft_{name}_s"] for r in rows) for name in ("off", "on")}
    later = {name: statistics.mean(r[f"ttft_{name}_s"] for r in rows[1:]) if len(rows) > 1
             else None for name in ("off", "on")}
    first = got[True][-1][0][1]
    env = environment(torch.device("cpu"))
    summary = dict(amortised_ttft_off_s=amort["off"], amortised_ttft_on_s=amort["on"],
                   amortised_ratio=amort["on"] / amort["off"],
                   later_questions_ttft_off_s=later["off"], later_questions_ttft_on_s=later["on"],
                   answers_identical=same, visual_tokens=first["visual_tokens"],
                   prompt_tokens=first["prompt_tokens"])
    notes = [
        f"CPU figures: tiny preset (shipped routers), {args.frames} random frames, policy global, "
        f"cache_visual on in both modes (the first question of a round pays vision; the others "
        f"reuse Z), {args.questions} questions a round, {args.rounds} rounds per mode "
        f"alternating, medians; {args.threads} torch thread(s); max_new_tokens "
        f"{args.max_new_tokens}.",
        "off: every question prefills its whole prompt; on: VideoRouter(prefix_cache=True), the "
        "first question prefills its prompt in two passes (the visual prefix, kept, then the "
        "rest), later ones only the rest.",
        f"Answers of the two modes token for token identical: {same}.",
    ]
    body = [markdown_table(rows, ["question", "prefix", "ttft_off_s", "ttft_on_s", "prefill_off_s",
                                  "prefill_on_s", "vision_off_s", "vision_on_s"],
                           ["question #", "prefix (on)", "TTFT off s", "TTFT on s",
                            "prefill off s", "prefill on s", "vision off s", "vision on s"]),
            "", f"Amortised TTFT per question ({args.questions} questions): off "
                f"{amort['off']:.4f} s, on {amort['on']:.4f} s ({summary['amortised_ratio']:.2f}x); "
                f"questions 2..{args.questions}: off {later['off']:.4f} s, on {later['on']:.4f} s."]
    return report(args.out, "# Amortised TTFT per question, one video, prefix cache off / on (CPU, tiny)",
                  env, notes, body, label="CPU", rows=rows, summary=summary,
                  settings=dict(frames=args.frames, questions=qs, rounds=args.rounds,
                                threads=args.threads, max_new_tokens=args.max_new_tokens))


if __name__ == "__main__":
    main()
