"""The summary of a bench/gpu_run.sh run as it stands: the goals table from whatever results
files exist so far, then one line a stage (its status, seconds and cap).

    python3 -m bench.report.gpu_summary WORK [tune|main|extra]      # markdown on stdout

Run after every stage, so a run stopped part-way still says what it measured. A row whose file
is missing says which stage would have filled it. Standard library only: it must work in any
state the device is left in.
"""
from __future__ import annotations

import json
import os
import re
import sys
from typing import Callable, Dict, List, Optional, Tuple

# The goals, and the one H100 run (2026-11-24, bench/results/gpu_h100_2026-11-24) to compare.
GOALS: List[Tuple[str, str, str, str]] = [   # (key, row, goal, H100 2026-11-24)
    ("ttft_ratio", "TTFT VideoRouter (2,4) / Dense", "<= 0.50", "0.68"),
    ("ttft_s", "TTFT VideoRouter (2,4)", "<= 0.30 s", "0.439 s"),
    ("router_share", "router share of TTFT", "<= 5%", "16%"),
    ("memory", "peak memory VR / Dense", "<= 0.90", "1.01"),
    ("kernel", "pool_pack % of a device copy (fwd / bwd)", ">= 90 / >= 85", "88 / 65"),
    ("decode_ms", "decode per token, wall (batch 1)", "<= 7 ms", "20-45 ms"),
    ("batch4", "4 videos / 1 video", "<= 2.0x", "3.1x"),
    ("ttft_ratio_256", "TTFT ratio at 256 frames", "<= 0.25", "0.32"),
]


def _load(work: str, name: str) -> Optional[dict]:
    """The results file ``name`` of the run: its newest run where it holds several (the layout
    of bench.harness.results, read here without the harness's imports)."""
    try:
        with open(os.path.join(work, name)) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc["runs"][-1] if isinstance(doc, dict) and isinstance(doc.get("runs"), list) else doc


def _row(doc: Optional[dict], sweep: str, policy: str, **match) -> Optional[dict]:
    for r in (doc or {}).get("rows", []):
        if (r.get("sweep") == sweep and r.get("policy") == policy and not r.get("error")
                and all(r.get(k) == v for k, v in match.items())):
            return r
    return None


def _e2e(work: str, key: str) -> Optional[str]:
    r = _row(_load(work, "e2e_gpu_8b.json"), "main", "vr24")
    if r is None:
        return None
    if key == "ttft_ratio":
        return f"{r['ttft_x_dense']:.2f}"
    if key == "ttft_s":
        return f"{r['ttft_s']:.3f} s"
    if key == "router_share":
        return f"{100 * r['router_s'] / r['ttft_s']:.1f}%"
    return f"{r['mem_x_dense']:.2f}"


def _kernel(work: str, _key: str) -> Optional[str]:
    doc = _load(work, "pool_pack_gpu_8b.json") or {}
    got = {s["dir"]: s for s in doc.get("speedups", [])
           if s.get("T") == 64 and s.get("D") == 3584 and s.get("copy_frac") is not None}
    if not got:
        return None
    spread = [f"{s['spread']:.0%}" for s in got.values() if s.get("spread") is not None]
    text = " / ".join(f"{100 * got[d]['copy_frac']:.0f}" for d in ("fwd", "bwd") if d in got)
    return text + (f" (spread {', '.join(spread)})" if spread else "")


def _decode(work: str, _key: str) -> Optional[str]:
    doc = _load(work, "decode_gpu_8b.json") or {}
    ms = {r["mode"]: r["ms_per_token"] for r in doc.get("rows", [])
          if r.get("batch") == 1 and r.get("ms_per_token") is not None}
    return ", ".join(f"{m} {v:.1f} ms" for m, v in ms.items()) or None


def _batch(work: str, _key: str) -> Optional[str]:
    doc = _load(work, "e2e_gpu_8b_batch.json")
    one, four = (_row(doc, "batch", "vr24", batch=b) for b in (1, 4))
    if one is None or four is None:
        return None
    return f"{four['total_s'] / one['total_s']:.2f}x"


def _frames(work: str, _key: str) -> Optional[str]:
    doc = _load(work, "e2e_gpu_8b_frames.json")
    r = _row(doc, "frames", "vr24", frames=256)
    if r is None:
        return None
    if r.get("ttft_x_dense") is None:   # Dense did not run at 256 frames: say why
        dense = [d for d in (doc or {}).get("rows", []) if d.get("sweep") == "frames"
                 and d.get("policy") == "dense" and d.get("frames") == 256]
        why = (dense[0].get("error") or "no error recorded").split(":")[0] if dense else "no row"
        return f"no Dense row ({why}); VideoRouter TTFT {r['ttft_s']:.3f} s"
    return f"{r['ttft_x_dense']:.2f}"


READERS: Dict[str, Tuple[Callable, str]] = {   # key: (reader, the stage that fills it)
    "ttft_ratio": (_e2e, "e2e"), "ttft_s": (_e2e, "e2e"), "router_share": (_e2e, "e2e"),
    "memory": (_e2e, "e2e"), "kernel": (_kernel, "kernels"), "decode_ms": (_decode, "decode"),
    "batch4": (_batch, "batch"), "ttft_ratio_256": (_frames, "frames"),
}


# The tune part (bench_fast_path.py, bench_decode.py cold and warm, bench_train.py): each row's
# goal, then what the run measured, today's path beside the tuned one.
TUNE_GOALS: List[Tuple[str, str, str]] = [   # (key, row, goal)
    ("vision", "vision tower, ms a frame", "<= 1.1 (floor 0.91)"),
    ("router1", "router, ms a frame, pool 1", "<= 0.8 (floor 0.68)"),
    ("router2", "router, ms a frame, pool 2", "<= 0.3 (floor 0.22)"),
    ("ttft64", "TTFT at 64 frames", "<= 0.30 s"),
    ("ratio64", "TTFT VideoRouter / Dense, 64 frames", "<= 0.58x"),
    ("ttft1024", "TTFT at 1,024 frames", "<= 2.0 s"),
    ("memory", "peak memory VideoRouter / Dense, 64 frames", "<= 1.0x"),
    ("decode", "decode per token, batch 1 (graph)", "<= 5.0 ms"),
    ("warm", "graph decoding's compile: cold / warm start", "warm <= 5 s"),
    ("train", "Stage 3 step, fused / reference (2B, 8B)", "no slower, no larger"),
]


def _best(rows, **where) -> Optional[dict]:
    ok = [r for r in rows or [] if r.get("ms_per_frame") is not None and not r.get("error")
          and all(r.get(k) == v for k, v in where.items())]
    return min(ok, key=lambda r: r["ms_per_frame"]) if ok else None


def _today_best(rows, **where) -> Optional[str]:
    today = _best([r for r in rows or [] if r["variant"].startswith("today")], **where)
    best = _best([r for r in rows or [] if not r["variant"].startswith("today")], **where)
    if today is None:
        return None
    text = f"today {today['ms_per_frame']:.2f}"
    return text + (f"; best {best['ms_per_frame']:.2f} ({best['variant']})" if best else "")


def _ttft(doc, settings, policy, frames) -> Optional[dict]:
    for r in (doc or {}).get("ttft", []):
        if (r.get("settings"), r.get("policy"), r.get("frames")) == (settings, policy, frames) \
                and r.get("ttft_s") is not None:
            return r
    return None


def _tune(work: str, key: str) -> Optional[str]:
    fp = _load(work, "fast_path_gpu_8b.json")
    if key == "vision":
        return _today_best((fp or {}).get("vision"))
    if key in ("router1", "router2"):
        return _today_best((fp or {}).get("router"), pool=int(key[-1]))
    if key in ("ttft64", "ttft1024", "ratio64", "memory"):
        T = 1024 if key == "ttft1024" else 64
        got = {s: _ttft(fp, s, "videorouter", T) for s in ("today", "tuned", "tuned-pool2")}
        dense = {s: _ttft(fp, s, "dense", T) for s in ("today", "tuned")}
        if key == "memory":
            pairs = [(s, got[s], dense[s]) for s in got if got[s] and dense.get(s)
                     and got[s].get("peak_total_gb") and dense[s].get("peak_total_gb")]
            return "; ".join(f"{s} {v['peak_total_gb'] / d['peak_total_gb']:.2f}x"
                             for s, v, d in pairs) or None
        if key == "ratio64":
            return "; ".join(f"{s} {r['ratio_to_dense']:.2f}x (tokens {r['floor_ratio_tokens']:.2f}x)"
                             for s, r in got.items() if r and r.get("ratio_to_dense")) or None
        return "; ".join(f"{s} {r['ttft_s']:.3f} s" for s, r in got.items() if r) or None
    if key in ("decode", "warm"):
        cold = _load(work, "decode_cold_gpu_8b.json") or {}
        warm = _load(work, "decode_warm_gpu_8b.json") or {}
        rows = {(d, r["mode"]): r for d, doc in (("cold", cold), ("warm", warm))
                for r in doc.get("rows", []) if r.get("batch") == 1 and not r.get("error")}
        if key == "decode":
            return ", ".join(f"{m} {r['ms_per_token']:.2f} ms" for (d, m), r in rows.items()
                             if d == "cold") or None
        c, w = rows.get(("cold", "graph")), rows.get(("warm", "graph"))
        return f"{c['compile_s']:.1f} s / {w['compile_s']:.1f} s" if c and w else None
    parts = []
    for shape in ("2b", "8b"):
        doc = _load(work, f"train_gpu_{shape}.json") or {}
        r = {x["backend"]: x for x in doc.get("rows", []) if x.get("stage") == 3
             and not x.get("error")}
        if "kernel" in r and "reference" in r:
            k, ref = r["kernel"], r["reference"]
            parts.append(f"{shape} {k['step_s'] / ref['step_s']:.2f}x time, "
                         f"{(k.get('peak_step_gb') or 0) / max(ref.get('peak_step_gb') or 1e-9, 1e-9):.2f}x memory")
    return "; ".join(parts) or None


TUNE_STAGES = {"vision": "fast", "router1": "fast", "router2": "fast", "ttft64": "fast",
               "ratio64": "fast", "ttft1024": "fast", "memory": "fast", "decode": "decode_cold",
               "warm": "decode_warm", "train": "train_2b"}


def _stages(work: str) -> List[List[str]]:
    rows = []
    try:
        with open(os.path.join(work, "stages.tsv")) as f:
            rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    except OSError:
        pass
    checked = {}
    try:   # a dry run's argument check replaces "queued"
        with open(os.path.join(work, "check.tsv")) as f:
            for line in f:
                p = line.rstrip("\n").split("\t")
                if len(p) >= 2:
                    checked[p[0]] = "arguments ok" if p[1] == "ok" else f"BAD ARGUMENTS: {p[2]}"
    except OSError:
        pass
    for r in rows:
        if r[0] in checked:
            r[1] = r[1].replace("queued for the argument check", checked[r[0]])
    return rows


def _extras(work: str) -> List[str]:
    """One line each for the tests, the NVDEC rows and the extra part's files."""
    out = []
    try:
        with open(os.path.join(work, "logs", "tests.log")) as f:
            last = [line.strip() for line in f if re.search(r"\d+ (passed|failed|error)", line)]
        if last:
            out.append(f"- GPU tests: {last[-1].strip('= ')}")
    except OSError:
        pass
    video = _load(work, "video_nvdec_gpu.json")
    for r in (video or {}).get("rows", []):
        out.append(f"- decode {r['frames']} frames, {r['method']}: {r['time_s']} s")
    for name in ("cold_start_tiny_gpu.json", "cold_start_8b_gpu.json"):
        if _load(work, name) is not None:
            out.append(f"- {name}: written (its .md has the table)")
    doc = _load(work, "e2e_gpu_8b_frames_1024.json")
    for r in (doc or {}).get("rows", []):
        if r.get("policy") == "vr24" and r.get("sweep") == "frames":
            out.append(f"- {r['frames']} frames, VideoRouter (2,4): TTFT {r.get('ttft_s')} s, "
                       f"x Dense {r.get('ttft_x_dense')}, {r.get('error') or ''}".rstrip(", "))
    return out


def _measured(work: str, key: str, reader: Callable, stage: str) -> str:
    """A goal row's measured cell: the reader's figure, or the stage that would fill it."""
    try:
        got = reader(work, key)
    except (KeyError, TypeError, ZeroDivisionError) as e:   # a file of another shape
        got = f"unreadable ({type(e).__name__})"
    return got or f"pending (stage {stage})"


def summary(work: str, part: str = "main") -> str:
    env = _load(work, "environment.json") or {}
    lines = [f"# GPU run ({part}): {env.get('device', '?')}", "",
             " ".join(f"{k} {env[k]};" for k in ("python", "torch", "cuda", "triton",
                                                  "transformers", "torchcodec", "commit")
                      if k in env), ""]
    if part == "main":
        lines += ["| row | goal | measured now | H100 2026-11-24 |", "|---|---|---|---|"]
        lines += [f"| {name} | {goal} | {_measured(work, key, *READERS[key])} | {then} |"
                  for key, name, goal, then in GOALS] + [""]
    if part == "tune":
        lines += ["| row | goal | measured now |", "|---|---|---|"]
        lines += [f"| {name} | {goal} | {_measured(work, key, _tune, TUNE_STAGES[key])} |"
                  for key, name, goal in TUNE_GOALS] + [""]
    lines += ["| stage | status | seconds | cap |", "|---|---|---|---|"]
    lines += [f"| {' | '.join((r + ['', '', ''])[:4])} |" for r in _stages(work)]
    extra = _extras(work)
    return "\n".join(lines + ([""] + extra if extra else [])) + "\n"


def main(argv: List[str] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or not os.path.isdir(argv[0]):
        sys.exit(f"usage: python3 -m bench.report.gpu_summary WORK [main|extra] (WORK: the run's work "
                 f"folder; got {argv[:1]})")
    sys.stdout.write(summary(argv[0], argv[1] if len(argv) > 1 else "main"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
