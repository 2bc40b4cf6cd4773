"""Tables, results files and the plot for bench/scripts/bench_e2e.py.

A *row* is a flat dict (see ``models/e2e_measure.py``): sweep, policy, label, frames, budget, batch,
visual_tokens, router_s, vision_compress_s, prefill_s, ttft_s, generate_s, peak_mem_gb,
nvml_peak_gb, ttft_x_dense, mem_x_dense, error, ... Ratios to Dense are always taken against
the Dense row of the same sweep point in the same run.
"""
from __future__ import annotations

import csv
import json
import math
import pathlib
from typing import Iterable, List, Optional

from bench.harness import results as result_files
from bench.harness.tables import markdown_grid

# Table `latency_breakdown` of the paper: InternVL3-8B, 64 frames, visual budget 12,288, on the
# paper's own hardware (not stated beyond "the same hardware as the main experiments").
# (label, visual tokens, router s, vision+compress s, prefill s, TTFT s, peak GB)
PAPER = [
    ("InternVL3 Dense", 16384, None, 1.7, 6.7, 8.4, 36.5),
    ("InternVL3 Budget", 9528, None, 1.1, 3.9, 5.0, 25.8),
    ("Uniform Pooling", 8192, None, 1.2, 3.6, 4.8, 24.6),
    ("CLIP Relevance Pooling", 7936, 0.2, 1.3, 3.4, 4.9, 24.3),
    ("VideoRouter (s=2,4)", 7748, 0.5, 1.2, 3.0, 4.7, 23.9),
    ("VideoRouter (s=4,8)", 5262, 0.5, 1.2, 2.5, 4.2, 22.4),
]
PAPER_NOTE = "paper, its hardware (InternVL3-8B, 64 frames, budget 12,288); not measured here"

COLUMNS = [  # (key, header, format)
    ("label", "Method", "{}"),
    ("visual_tokens", "Visual tokens", "{:,}"),
    ("router_s", "Router s", "{:.3f}"),
    ("vision_compress_s", "Vision+compress s", "{:.3f}"),
    ("prefill_s", "LLM prefill s", "{:.3f}"),
    ("ttft_s", "TTFT s", "{:.3f}"),
    ("peak_mem_gb", "Peak mem GB", "{:.2f}"),
    ("nvml_peak_gb", "NVML peak GB", "{:.2f}"),
    ("ttft_x_dense", "TTFT x Dense", "{:.2f}"),
    ("mem_x_dense", "Mem x Dense", "{:.2f}"),
    # the runtime's report: peak minus the weights on the device (CPU: the resident rise)
    ("activation_x_dense", "Activations x Dense", "{:.2f}"),
]


def _fmt(row: dict, key: str, fmt: str) -> str:
    v = row.get(key)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return fmt.format(v)


def add_ratios(rows: List[dict]) -> None:
    """ttft_x_dense / mem_x_dense against the Dense row with the same sweep, frames, budget, batch."""
    def key(r):
        return (r["sweep"], r["frames"], r["budget"], r.get("batch", 1))
    dense = {key(r): r for r in rows if r["policy"] == "dense" and not r.get("error")}
    for r in rows:
        d = dense.get(key(r))
        for mine, ratio in (("ttft_s", "ttft_x_dense"), ("peak_mem_gb", "mem_x_dense"),
                            ("activation_peak_gb", "activation_x_dense")):
            a, b = r.get(mine), (d or {}).get(mine)
            r[ratio] = a / b if a is not None and b else None


def memory_headers(cpu: bool) -> dict:
    """On CPU the memory columns are process RSS, not GPU memory: the headers say so."""
    if cpu:
        return {"peak_mem_gb": "Peak RSS GB (CPU)", "nvml_peak_gb": "-",
                "mem_x_dense": "RSS x Dense", "activation_x_dense": "RSS rise x Dense (CPU)"}
    return {}


def _columns(rows: List[dict], cpu: bool):
    rename = memory_headers(cpu)
    cols = []
    for key, head, fmt in COLUMNS:
        if cpu and key == "nvml_peak_gb":
            continue  # no NVML without a GPU
        cols.append((key, rename.get(key, head), fmt))
    if any(r.get("error") for r in rows):
        cols.append(("error", "Error", "{}"))
    return cols


def text_table(rows: List[dict], cpu: bool) -> str:
    cols = _columns(rows, cpu)
    cells = [[h for _, h, _ in cols]] + [[_fmt(r, k, f) for k, _, f in cols] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    lines = []
    for n, c in enumerate(cells):
        lines.append("  ".join(s.ljust(w) if i == 0 else s.rjust(w)
                               for i, (s, w) in enumerate(zip(c, widths))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(rows: List[dict], cpu: bool) -> str:
    cols = _columns(rows, cpu)
    return markdown_grid([h for _, h, _ in cols],
                         [[_fmt(r, k, f) for k, _, f in cols] for r in rows], numbers_right=True)


def paper_table(markdown: bool = False) -> str:
    head = ["Method (paper)", "Visual tokens", "Router s", "Vision+compress s", "LLM prefill s",
            "TTFT s", "Peak mem GB", "TTFT x Dense", "Mem x Dense"]
    dense = PAPER[0]
    rows = []
    for label, tok, router, vc, pre, ttft, mem in PAPER:
        rows.append([label, f"{tok:,}", "-" if router is None else f"{router:.1f}", f"{vc:.1f}",
                     f"{pre:.1f}", f"{ttft:.1f}", f"{mem:.1f}", f"{ttft / dense[5]:.2f}",
                     f"{mem / dense[6]:.2f}"])
    if markdown:
        return markdown_grid(head, rows, numbers_right=True)
    widths = [max(len(x[i]) for x in [head] + rows) for i in range(len(head))]
    fmt = lambda r: "  ".join(s.ljust(w) if i == 0 else s.rjust(w)  # noqa: E731
                              for i, (s, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(head), "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows])


def pending_markdown(device: str, reason: str) -> str:
    """The GPU rows of BENCHMARKS.md before anyone has measured them: no figure, a reason."""
    head = [h for _, h, _ in COLUMNS]
    labels = ["Dense", "Budget (InternVL3*)", "Uniform pooling", "VideoRouter (s=2,4) default",
              "VideoRouter (s=4,8)", "CLIP relevance pooling"]
    return f"**{device}**: {reason}\n\n" + markdown_grid(
        head, [[lab] + ["pending"] * (len(head) - 1) for lab in labels], numbers_right=True)


CSV_FIELDS = ["sweep", "policy", "label", "frames", "budget", "batch", "batch_mode", "relevant",
              "visual_tokens", "dense_visual_tokens", "router_s", "vision_s", "compress_s",
              "vision_compress_s", "prefill_s", "ttft_s", "generate_s", "total_s",
              "per_video_s", "peak_mem_gb", "nvml_peak_gb", "ttft_x_dense", "mem_x_dense",
              "activation_peak_gb", "activation_x_dense", "weights_gb", "shadow_stack_gb",
              "runs", "ttft_min_s", "ttft_max_s", "reused_from", "error"]


def write_results(stem: pathlib.Path, meta: dict, rows: List[dict],
                  markdown: Optional[str] = None) -> List[pathlib.Path]:
    """``stem``.json (settings + rows + paper reference), ``stem``.csv (rows) and, given
    ``markdown``, ``stem``.md."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    js, cs = stem.with_suffix(".json"), stem.with_suffix(".csv")
    doc = dict(meta)
    doc["rows"] = rows
    doc["paper_reference"] = {
        "note": PAPER_NOTE,
        "columns": ["label", "visual_tokens", "router_s", "vision_compress_s", "prefill_s",
                    "ttft_s", "peak_mem_gb"],
        "rows": [list(r) for r in PAPER]}
    result_files.write_results(str(js), doc, markdown)
    with cs.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_FIELDS})
    return [js, cs] + ([stem.with_suffix(".md")] if markdown is not None else [])


def plot(path: pathlib.Path, rows: Iterable[dict], title: str, cpu: bool) -> Optional[pathlib.Path]:
    """TTFT and peak memory against visual tokens, one colour per policy (single-video rows).

    Points of the frames and budget sweeps of one policy are joined by lines, so the plot shows
    how each policy scales; the main-table point is drawn larger."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if not r.get("error") and r.get("batch", 1) == 1
            and r.get("visual_tokens") is not None]
    if not rows:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    mem_label = "peak RSS (GB, CPU process)" if cpu else "peak GPU memory (GB, torch)"
    policies = list(dict.fromkeys(r["label"] for r in rows))
    for i, label in enumerate(policies):
        color = f"C{i}"
        mine = [r for r in rows if r["label"] == label]
        for ax, key in ((axes[0], "ttft_s"), (axes[1], "peak_mem_gb")):
            for sweep, style in (("frames", "-"), ("budget", "--")):
                pts = sorted((r["visual_tokens"], r[key]) for r in mine
                             if r["sweep"] == sweep and r.get(key) is not None)
                if len(pts) > 1:
                    ax.plot(*zip(*pts), style, color=color, marker="o", ms=3, lw=1)
            main = [(r["visual_tokens"], r[key]) for r in mine
                    if r["sweep"] == "main" and r.get(key) is not None]
            if main:
                ax.scatter(*zip(*main), color=color, s=60, zorder=3,
                           label=label if key == "ttft_s" else None)
    axes[0].set_ylabel("TTFT (s)")
    axes[1].set_ylabel(mem_label)
    for ax in axes:
        ax.set_xlabel("visual tokens")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title + ("   [CPU figures]" if cpu else "")
                 + "\nlarge dots: main table; solid: frames sweep; dashed: budget sweep", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def batch_text(rows) -> str:
    lines = ["Method  B  mode  visual tokens  total s  per video s  peak GB"]
    for r in rows:
        if r.get("error"):
            lines.append(f"{r['label']}  {r['batch']}  {r['error']}")
        else:
            pk = "-" if r.get("peak_mem_gb") is None else f"{r['peak_mem_gb']:.2f}"
            lines.append(f"{r['label']}  {r['batch']}  {r['batch_mode']}  {r['visual_tokens']:,}  "
                         f"{r['total_s']:.3f}  {r['per_video_s']:.3f}  {pk}")
    return "\n".join(lines)


def settings_line(st: dict, env: dict) -> str:
    """One paragraph with what a reader needs to interpret the table."""
    ml = st.get("max_length")
    parts = [
        f"{st['shape']}, {st['dtype']}, attention {st.get('attn_implementation')}",
        f"{st['frames']} frames, visual budget {st['budget']:,}"
        + (f" (max_length {ml:,} = budget + {st['text_tokens']} text + {st['max_new_tokens']} "
           f"new + {st['margin']} margin)" if ml else ""),
        f"relevance: {st['relevance']}",
        f"routers: {st['router_mode']}, shadow stack {st.get('router_layers')} "
        f"layer(s), router_pool {st.get('router_pool')}",
        f"median of {st['runs']} runs after {st['warmup']} warm-up",
        f"memory: {st['memory']}",
        f"torch {env.get('torch')}, transformers {env.get('transformers')}, triton "
        f"{env.get('triton')}, CUDA {env.get('cuda')}, driver {env.get('driver')}",
        f"{env.get('date_utc')}",
        f"`{env.get('command')}`",
    ]
    if st.get("cpu_threads"):
        parts.insert(5, f"{st['cpu_threads']} CPU thread(s)")
    if st.get("context_raised"):
        parts.insert(2, f"decoder context raised to {st['context']:,} tokens (--context: a "
                        f"compute comparison past the model's own context)")
    return "; ".join(parts) + "."


def markdown_block(main_rows, rows, cpu, title, label, settings=None, env=None) -> str:
    out = [f"### {title}", "", f"*{label}.* Median of the timed runs; ratios to Dense from the same run."]
    if settings is not None:
        out += ["", settings_line(settings, env or {})]
    out += ["", markdown_table(main_rows, cpu)]
    for sweep in ("frames", "budget"):
        srows = [r for r in rows if r["sweep"] == sweep]
        if srows:
            out += ["", f"{sweep} sweep:", "", markdown_table(
                [dict(r, label=f"{r['label']} (T={r['frames']}, B={r['budget']:,})") for r in srows], cpu)]
    brows = [r for r in rows if r["sweep"] == "batch"]
    if brows:
        out += ["", f"batch sweep ({brows[0].get('batch_mode')}):", "", batch_markdown(brows, cpu)]
    if cpu:
        out += ["", "GPU (InternVL3-8B shape, 64 frames, budget 12,288): pending -- run "
                "`python -m bench.scripts.bench_e2e --sweep all` on an H100/H200.", "",
                pending_markdown("NVIDIA H100 / H200", "pending: no GPU in this session")]
    out += ["", f"Reference ({PAPER_NOTE}):", "", paper_table(markdown=True)]
    return "\n".join(out)


def batch_markdown(rows, cpu) -> str:
    mem = "Peak RSS GB (CPU)" if cpu else "Peak mem GB"
    out = [f"| Method | Videos | Visual tokens (all) | Total s | Per video s | {mem} |",
           "|:--|--:|--:|--:|--:|--:|"]
    for r in rows:
        if r.get("error"):
            out.append(f"| {r['label']} | {r['batch']} | {r['error']} | | | |")
            continue
        pk = "-" if r.get("peak_mem_gb") is None else f"{r['peak_mem_gb']:.2f}"
        out.append(f"| {r['label']} | {r['batch']} | {r['visual_tokens']:,} | {r['total_s']:.3f} | "
                   f"{r['per_video_s']:.3f} | {pk} |")
    return "\n".join(out)


def print_run(rows, cpu, label, title, targets, md, files) -> None:
    """The end of a run on stdout: the tables, the paper's, the targets, the markdown for
    BENCHMARKS.md and the files written."""
    main_rows = [r for r in rows if r["sweep"] == "main"]
    print()
    print(f"== {label}: {title}")
    print(text_table(main_rows, cpu))
    for sweep in ("frames", "budget", "batch"):
        srows = [r for r in rows if r["sweep"] == sweep]
        if srows:
            print(f"\n== {sweep} sweep")
            print(batch_text(srows) if sweep == "batch" else text_table(
                [dict(r, label=f"{r['label']} (T={r['frames']}, B={r['budget']:,})") for r in srows], cpu))
    print(f"\n== reference: {PAPER_NOTE}")
    print(paper_table())
    print("\n== targets: " + json.dumps({k: v for k, v in targets.items() if k != "targets"},
                                        default=str))
    print("\n== markdown for BENCHMARKS.md\n")
    print(md)
    print("\nwrote " + ", ".join(str(f) for f in files))
