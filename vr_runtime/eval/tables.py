"""Results files of an evaluation run (docs/CONTRACT.md section 5), laid out like the paper's tables.

``OUT/predictions.jsonl``  one line per question x method x budget x frames
``OUT/results.json``       {"rows": [{method, budget, frames, n, failed, accuracy,
                            visual_tokens_mean, frames_mean, no_relevant, ttft_s_mean,
                            ttft_cached_s_mean, unanswered, by_duration, by_category, policies,
                            correct, accuracy_ci95, by_duration_ci95, by_category_ci95,
                            by_duration_n, by_category_n}], "meta": {..., failed_questions}}
``OUT/results.md``         Method | Frames | B_img | Visual tokens | n | Overall | Unanswered |
                           Failed | Frames kept | No relevant | per duration | per category;
                           every accuracy cell with its 95% Wilson interval, "46.5 (38.6-54.6)"
``OUT/results.csv``        the same columns (accuracies alone), then a low and a high column of
                           the 95% interval for each accuracy column
``OUT/accuracy_vs_tokens.png``  accuracy against *actual* mean visual tokens, one line per
                            method (and frame count) across budgets, with the intervals as bars
``OUT/accuracy_vs_frames.png``  with more than one frame count: accuracy against the frames
                            sampled, one line per method (and budget), intervals as bars
"""
from __future__ import annotations

import csv
import io
import json
import pathlib
from collections import Counter, defaultdict
from typing import Dict, List, Optional, Sequence

from ..data.atomic import write_files_atomically
from .stats import wilson

# What a failed write of an evaluation's files tells the user (runner.py's settings.json too).
WRITE_HINT = ("nothing there was replaced (free space and rerun the same command: finished "
              "predictions are kept)")

DURATION_ORDER = ("short", "medium", "long")

# Said under every table with the tiny preset's dense row: its training never showed it every
# frame at full resolution, so that row is no upper reference (a fair one needs retraining).
TINY_DENSE_NOTE = ("*dense* is not a fair upper reference for the tiny model: it never trained "
                   "on full-resolution layouts of all frames, so its dense row is low for that "
                   "reason, not because compression beats seeing every frame.")


def _acc(ps: Sequence[dict]) -> float:
    return 100.0 * sum(bool(p["correct"]) for p in ps) / len(ps) if ps else float("nan")


def _ci(ps: Sequence[dict]) -> Optional[List[float]]:
    """The 95% Wilson interval of the accuracy over ``ps``, in %, as [low, high]."""
    ci = wilson(sum(bool(p["correct"]) for p in ps), len(ps))
    return None if ci is None else [round(ci[0], 2), round(ci[1], 2)]


def _ordered(keys) -> List[str]:
    keys = [k for k in keys if k]
    known = [k for k in DURATION_ORDER if k in keys]
    rest = sorted((k for k in keys if k not in DURATION_ORDER),
                  key=lambda k: (not str(k).isdigit(), int(k) if str(k).isdigit() else 0, k))
    return known + rest


def aggregate(preds: Sequence[dict], methods: Sequence) -> List[dict]:
    groups: Dict[tuple, List[dict]] = defaultdict(list)
    for p in preds:
        groups[(p["method"], p["budget"], p["frames"])].append(p)
    order = {m.name: i for i, m in enumerate(methods)}
    rows = []
    for (method, budget, frames), group in sorted(
            groups.items(), key=lambda kv: (kv[0][2], order.get(kv[0][0], 99),
                                            -1 if kv[0][1] is None else kv[0][1])):
        # A question whose video could not be decoded is not scored: it is counted as
        # `failed`, apart from wrong answers, and every other figure is over the rest.
        ps = [p for p in group if not p.get("failed")]
        by_d: Dict[str, List[dict]] = defaultdict(list)
        by_c: Dict[str, List[dict]] = defaultdict(list)
        for p in ps:
            by_d[str(p.get("duration") or "")].append(p)
            by_c[str(p.get("category") or "")].append(p)
        ttft = [p["ttft_s"] for p in ps if p.get("ttft_s") is not None]
        # as measured with the visual cache (ttft_s adds back what the cache saved: eval/ttft.py)
        cached = [p["ttft_cached_s"] for p in ps if p.get("ttft_cached_s") is not None]
        rows.append({
            "method": method, "budget": budget, "frames": frames, "n": len(ps),
            "failed": len(group) - len(ps),
            "accuracy": round(_acc(ps), 2) if ps else None,
            "visual_tokens_mean": round(sum(p["visual_tokens"] for p in ps) / len(ps), 1)
            if ps else None,
            # the paper's Table 2 column: frames actually kept (InternVL3* keeps fewer)
            "frames_mean": round(sum(p.get("frames_kept") or p.get("frames_used") or frames
                                     for p in ps) / len(ps), 1) if ps else None,
            # questions where the Image Router marked no frame (Algorithm 1's empty branch)
            "no_relevant": sum(bool(p.get("no_relevant_frame")) for p in ps),
            "ttft_s_mean": round(sum(ttft) / len(ttft), 4) if ttft else None,
            "ttft_cached_s_mean": round(sum(cached) / len(cached), 4) if cached else None,
            "unanswered": sum(p["prediction"] is None for p in ps),
            "by_duration": {k: round(_acc(by_d[k]), 2) for k in _ordered(by_d)},
            "by_category": {k: round(_acc(by_c[k]), 2) for k in sorted(k for k in by_c if k)},
            "policies": dict(Counter(p["policy"] for p in ps)),
            # the 95% Wilson intervals (eval/stats.py) of the accuracies above, and what they
            # are computed from: one question is 100 / n points
            "correct": sum(bool(p["correct"]) for p in ps),
            "accuracy_ci95": _ci(ps),
            "by_duration_ci95": {k: _ci(by_d[k]) for k in _ordered(by_d)},
            "by_category_ci95": {k: _ci(by_c[k]) for k in sorted(k for k in by_c if k)},
            "by_duration_n": {k: len(by_d[k]) for k in _ordered(by_d)},
            "by_category_n": {k: len(by_c[k]) for k in sorted(k for k in by_c if k)},
        })
    return rows


def _columns(rows):
    durs = _ordered({k for r in rows for k in r["by_duration"]})
    cats = sorted({k for r in rows for k in r["by_category"]})
    return durs, cats


def table_rows(rows, intervals: bool = False) -> (List[str], List[list]):
    """The table's header and rows. ``intervals``: each accuracy cell reads "46.5 (38.6-54.6)"
    (its 95% Wilson interval), for the markdown view; the CSV keeps the plain figures in these
    columns and gets the intervals in columns of their own (``interval_columns``)."""
    durs, cats = _columns(rows)
    acc = _fmt_ci if intervals else (lambda v, ci: _fmt(v))
    # Frames kept (the paper's Table 2 "frames") and No relevant follow the older columns,
    # so readers of results.csv by position keep working
    head = ["Method", "Frames", "B_img", "Visual tokens", "n", "Overall", "Unanswered",
            "Failed", "Frames kept", "No relevant"] + [f"{d}" for d in durs] + \
        [f"{c}" for c in cats]
    body = []
    for r in rows:
        body.append([r["method"], r["frames"], "-" if r["budget"] is None else r["budget"],
                     "-" if r["visual_tokens_mean"] is None else f"{r['visual_tokens_mean']:.0f}",
                     r["n"], acc(r["accuracy"], r.get("accuracy_ci95")), r["unanswered"],
                     r.get("failed", 0),
                     "-" if r.get("frames_mean") is None else f"{r['frames_mean']:.1f}",
                     r.get("no_relevant", 0)] +
                    [acc(r["by_duration"].get(d), (r.get("by_duration_ci95") or {}).get(d))
                     for d in durs] +
                    [acc(r["by_category"].get(c), (r.get("by_category_ci95") or {}).get(c))
                     for c in cats])
    return head, body


def interval_columns(rows) -> (List[str], List[list]):
    """The CSV's extra columns, after the others (readers by position keep working): the low
    and high end of the 95% Wilson interval of Overall, then of each duration and category."""
    durs, cats = _columns(rows)
    head = ["Overall ci95 low", "Overall ci95 high"]
    for name in list(durs) + list(cats):
        head += [f"{name} ci95 low", f"{name} ci95 high"]
    body = []
    for r in rows:
        cis = [r.get("accuracy_ci95")] + \
            [(r.get("by_duration_ci95") or {}).get(d) for d in durs] + \
            [(r.get("by_category_ci95") or {}).get(c) for c in cats]
        body.append([_fmt(None if ci is None else ci[i]) for ci in cis for i in (0, 1)])
    return head, body


def _fmt(v: Optional[float]) -> str:
    return "-" if v is None or v != v else f"{v:.1f}"


def _fmt_ci(v: Optional[float], ci: Optional[Sequence[float]]) -> str:
    if v is None or v != v or not ci:
        return _fmt(v)
    return f"{v:.1f} ({ci[0]:.1f}-{ci[1]:.1f})"


def markdown(rows, meta: dict) -> str:
    head, body = table_rows(rows, intervals=True)
    durs, cats = _columns(rows)
    out = io.StringIO()
    title = meta.get("title") or f"{meta['benchmark']} accuracy (%)"
    out.write(f"# {title}\n\n")
    out.write(f"Model: `{meta['model']}`; benchmark `{meta['benchmark']}` ({meta['questions']} "
              f"questions, {meta['skipped']} skipped); prompt `{meta['prompt_style']}`, answer mode "
              f"`{meta['answer_mode']}`. "
              f"Accuracy in %; *Frames kept* and *Visual tokens* are the actual means over the "
              f"questions (the paper's Table 2 columns); *No relevant*: questions whose Image "
              f"Router marked no frame (`fragment`: Global plan; `fragment-literal`: all at s0). "
              f"*Unanswered*: answers in which the parser found no option (scored wrong); "
              f"*Failed*: questions whose video could not be decoded (not scored, not in n; "
              f"a rerun retries them). "
              f"B_img is the fixed visual budget (the paper's controlled protocol); "
              f"`-` = no budget (dense). In brackets: the 95% Wilson interval of each "
              f"accuracy (one question is 100/n points; compare two runs question by question "
              f"with `videorouter eval compare`).")
    if durs:
        out.write(f" Duration columns: {', '.join(durs)}.")
    if cats:
        out.write(f" Category columns: {', '.join(cats)}.")
    out.write("\n\n")
    out.write("| " + " | ".join(map(str, head)) + " |\n")
    out.write("|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|\n")
    for b in body:
        out.write("| " + " | ".join(map(str, b)) + " |\n")
    if meta.get("model") == "tiny" and any(r["method"] == "dense" for r in rows):
        out.write(f"\n{TINY_DENSE_NOTE}\n")
    out.write(f"\n{meta['device_line']}\n\nCommand: `{meta['command']}`\n")
    return out.getvalue()


def csv_text(rows) -> str:
    head, body = table_rows(rows)
    ci_head, ci_body = interval_columns(rows)
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(head + ci_head)
    w.writerows(b + c for b, c in zip(body, ci_body))
    return out.getvalue()


MARKERS = "osD^vPX*h<>p"
DASHES = ("-", "--", ":", "-.")


def _new_plot():
    """matplotlib's Agg canvas (no display) -> (pyplot, figure, axes)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    return plt, fig, ax


def _accuracy_bars(rs) -> tuple:
    """Accuracy of each row and its 95% interval as error bars (rows written before the
    intervals existed: none) -> (y, yerr)."""
    y = [r["accuracy"] for r in rs]
    cis = [r.get("accuracy_ci95") or [r["accuracy"]] * 2 for r in rs]
    return y, [[a - ci[0] for a, ci in zip(y, cis)], [ci[1] - a for a, ci in zip(y, cis)]]


def _finish_plot(plt, fig, ax, xlabel: str, title: str, path: pathlib.Path) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel("accuracy (%), bars: 95% Wilson interval")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, format="png")   # write_outputs gives a temporary name
    plt.close(fig)


def plot(rows, path: pathlib.Path, title: str) -> None:
    plt, fig, ax = _new_plot()
    lines: Dict[tuple, list] = defaultdict(list)
    for r in rows:
        if r["visual_tokens_mean"] is not None:   # None: every question failed
            lines[(r["method"], r["frames"])].append(r)
    multi_f = len({r["frames"] for r in rows}) > 1
    for i, ((method, frames), rs) in enumerate(lines.items()):
        rs = sorted(rs, key=lambda r: r["visual_tokens_mean"])
        label = f"{method} ({frames} fr)" if multi_f else method
        y, yerr = _accuracy_bars(rs)
        # Distinct markers and dashes: methods with identical plans draw on top of each other.
        ax.errorbar([r["visual_tokens_mean"] for r in rs], y, yerr=yerr,
                    marker=MARKERS[i % len(MARKERS)], label=label, alpha=0.85,
                    markersize=7 - 0.3 * (i % 5), linestyle=DASHES[i % 4]
                    if len(rs) > 1 else "none", capsize=3, elinewidth=0.8)
    _finish_plot(plt, fig, ax, "mean visual tokens (actual)", title, path)


def plot_vs_frames(rows, path: pathlib.Path, title: str) -> None:
    """Accuracy against the frames sampled, one line a method (and budget), 95% intervals as
    bars: the needle benchmark's figure (does an answer survive a longer video?)."""
    plt, fig, ax = _new_plot()
    lines: Dict[tuple, list] = defaultdict(list)
    for r in rows:
        if r["n"]:
            lines[(r["method"], r["budget"])].append(r)
    multi_b = len({b for _, b in lines if b is not None}) > 1
    for i, ((method, budget), rs) in enumerate(lines.items()):
        rs = sorted(rs, key=lambda r: r["frames"])
        y, yerr = _accuracy_bars(rs)
        label = f"{method} (B={budget})" if multi_b and budget is not None else method
        ax.errorbar([r["frames"] for r in rs], y, yerr=yerr, marker=MARKERS[i % len(MARKERS)],
                    label=label, alpha=0.85, linestyle=DASHES[i % 4], capsize=3, elinewidth=0.8)
    ax.set_xscale("log", base=2)
    _finish_plot(plt, fig, ax, "frames sampled", title, path)


def failed_questions(preds: Sequence[dict]) -> List[dict]:
    """One entry per question with a failed prediction: {id, video, reason}."""
    seen: Dict[str, dict] = {}
    for p in preds:
        if p.get("failed") and str(p["id"]) not in seen:
            seen[str(p["id"])] = {"id": p["id"], "video": p.get("video"), "reason": p["failed"]}
    return list(seen.values())


def write_outputs(out: pathlib.Path, preds: List[dict], bench, methods, cfg, world: int) -> dict:
    from ..fingerprint import environment
    env = environment()
    rows = aggregate(preds, methods)
    meta = {"benchmark": bench.name, "data": str(cfg.data), "model": cfg.model,
            "routers": cfg.routers, "clip": cfg.clip, "data_ft_model": cfg.data_ft_model,
            "questions": len(bench.questions), "skipped": len(bench.skipped),
            "skipped_questions": [{"where": w, "reason": r} for w, r in bench.skipped],
            "methods": [m.name for m in methods], "budgets": list(cfg.budgets),
            "frames": list(cfg.frames), "answer_mode": cfg.prompt.answer_mode,
            "prompt_style": cfg.prompt.style,
            "pre_prompt": cfg.prompt.pre_prompt, "post_prompt": cfg.prompt.post_prompt,
            "max_new_tokens": cfg.max_new_tokens, "processes": world, "command": cfg.command,
            "title": cfg.title, **env}
    failed = failed_questions(preds)
    meta["failed"] = len(failed)
    meta["failed_questions"] = failed
    meta["answers"] = sum(r["n"] for r in rows)           # scored (not failed)
    meta["unanswered"] = sum(r["unanswered"] for r in rows)
    meta["device_line"] = (f"Device: {env['device']} ({env['cpu']}); {env['date']}; torch "
                           f"{env['torch']}, transformers {env['transformers']}, Python "
                           f"{env['python']}; {world} process(es).")
    results = {"rows": rows, "meta": meta}
    files = {out / "predictions.jsonl": "".join(json.dumps(p) + "\n" for p in preds)}
    files.update(_table_files(out, results))
    # All or nothing: a full disk leaves the previous set of files as it was (atomic.py).
    write_files_atomically(files, WRITE_HINT)
    return results


def _table_files(out: pathlib.Path, results: dict) -> dict:
    """results.json, .md, .csv and the plot of ``results``, for write_files_atomically."""
    rows, meta = results["rows"], results["meta"]
    files = {out / "results.json": json.dumps(results, indent=1) + "\n",
             out / "results.md": markdown(rows, meta),
             out / "results.csv": csv_text(rows)}
    if any(r["visual_tokens_mean"] is not None for r in rows):
        title = meta.get("title") or \
            f"{meta['benchmark']}: accuracy vs visual tokens ({meta['model']})"
        files[out / "accuracy_vs_tokens.png"] = lambda path: plot(rows, path, title)
        if len({r["frames"] for r in rows}) > 1:
            by_frames = meta.get("title") or \
                f"{meta['benchmark']}: accuracy vs frames ({meta['model']})"
            files[out / "accuracy_vs_frames.png"] = \
                lambda path: plot_vs_frames(rows, path, by_frames)
    return files


def retabulate(out) -> dict:
    """Rewrite OUT's results.json, .md, .csv and plot from its predictions.jsonl and the meta
    of its results.json (the run's settings, device and date stay): the tables of an older
    run in the current layout, without loading a model or reading a video."""
    from types import SimpleNamespace
    from .benchmarks import BenchmarkError
    out = pathlib.Path(out)
    try:
        meta = json.loads((out / "results.json").read_text(encoding="utf-8"))["meta"]
        lines = (out / "predictions.jsonl").read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise BenchmarkError(f"{out}: not a finished evaluation run "
                             f"({getattr(e, 'strerror', None) or e})") from None
    preds = [json.loads(line) for line in lines if line.strip()]
    rows = aggregate(preds, [SimpleNamespace(name=n) for n in meta.get("methods") or ()])
    results = {"rows": rows, "meta": meta}
    write_files_atomically(_table_files(out, results), WRITE_HINT)
    return results


__all__ = ["aggregate", "markdown", "csv_text", "plot", "write_outputs", "failed_questions",
           "retabulate", "interval_columns"]
