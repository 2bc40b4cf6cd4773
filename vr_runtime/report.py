"""The JSON report of one answer (docs/CONTRACT.md section 3 fields and extras), built from the pipeline's
typed stage results in one place.

``videorouter ask --plot`` draws the same reports (:func:`plot_report`): bars are the tokens
each sampled frame keeps (its pooled row count; 0 = dropped) at the frame's time, the line
(second axis) the Image Router's relevance probability with the 0.5 decision threshold.
Rendered with matplotlib's Agg canvas directly, so no pyplot global state and no display are
touched."""
from __future__ import annotations

import math
import os
from typing import Optional, Sequence

from vr_kernels import pooled_counts
from vr_kernels.windows import normalize_window, window_tokens

__all__ = ["build_report", "json_window", "STAGES", "TTFT_STAGES", "frame_rows", "plot_report",
           "plot_reports"]

STAGES = ("frames", "vision", "router", "compress", "prefill", "generate")
TTFT_STAGES = ("vision", "router", "compress", "prefill")   # after decoding, as in the paper


def json_window(w):
    nw = normalize_window(w)
    if nw is None:
        return 0
    return nw[0] if nw[0] == nw[1] else [nw[0], nw[1]]


def build_report(lm, routers, p, generated: int) -> dict:
    """The report of one answer on backbone ``lm`` with ``routers``: ``p`` is the request's
    ``runtime.Prepared`` (its request, frames, policy decision, scores, fitted plan, prompt
    ids, timer and notes), ``generated`` the new tokens' count."""
    req, frames, decision, scores, fitted = p.req, p.frames, p.decision, p.scores, p.fitted
    timer, prompt_tokens, visual_cache = p.timer, p.ids.numel(), p.visual_cache
    counts = pooled_counts(fitted.plan, lm.grid)
    return {**_model_fields(lm, routers, req, decision, scores),
            **_frame_fields(frames, scores, visual_cache, fitted.plan, counts, req),
            **_token_fields(lm.grid, fitted, counts, req, prompt_tokens, generated),
            "timings_s": _timings(frames, timer),
            **_memory_fields(lm, routers, timer),
            "notes": p.notes}


def _model_fields(lm, routers, req, decision, scores) -> dict:
    """Which model ran, and which policy and scorer."""
    return {
        "model": lm.name,
        "backbone": lm.family,
        "device": str(lm.device),
        "dtype": str(lm.dtype).replace("torch.", ""),
        "policy": decision.policy,
        "policy_requested": req.policy,
        "policy_probability": decision.probability,
        "routers_trained": bool(getattr(routers, "trained", False)),
        "scorer": scores.source if scores is not None else None,
    }


def _frame_fields(frames, scores, visual_cache, plan, counts, req) -> dict:
    """The sampled frames: where they came from, their scores and windows."""
    fragment = scores is not None   # only relevance policies (fragment, fragment-literal) score
    return {
        "num_frames_requested": int(req.num_frames),
        "num_frames_used": len(plan),
        "decoder": frames.decoder,
        "codec": frames.codec,
        "seek": getattr(frames, "seek", None),
        "frame_indices": [int(i) for i in frames.indices],
        "frame_times_s": None if frames.times_s is None
        else [round(float(x), 4) for x in frames.times_s],
        "frame_scores": None if scores is None or scores.scores is None
        else [round(float(s), 6) for s in scores.scores],
        "router_pool": scores.router_pool if scores is not None else None,
        "visual_cache": visual_cache,
        "relevant": scores.relevant if fragment else None,
        "windows": [json_window(w) for w in plan],
        "frame_tokens": counts,
        "frames_kept": sum(1 for c in counts if c > 0),
        "frames_dropped": sum(1 for c in counts if c == 0),
        # Algorithm 1 found no relevant frame: `fragment` fell back to the Global plan,
        # `fragment-literal` put every frame at s0 (the eval tables count how often)
        "no_relevant_frame": bool(fragment and not any(scores.relevant)),
    }


def dropped_note(plan: Sequence, grid, budget: Optional[int], policy: str,
                 relevant: Optional[Sequence[bool]] = None) -> Optional[str]:
    """Why a plan left frames out of the prompt (None when it kept every frame): the budget
    holds fewer frames than were sampled even at the windows the plan used, so the planner kept
    a subset spread evenly in time (the relevant frames first, under a relevance policy)."""
    dropped = [t for t, w in enumerate(plan) if json_window(w) == 0]
    if not dropped:
        return None
    T, kept = len(plan), len(plan) - len(dropped)
    lost = "" if relevant is None else \
        f" ({sum(1 for t in dropped if relevant[t])} of them relevant)"
    coarsest = min((window_tokens(w, grid) for w in plan if json_window(w) != 0), default=0)
    why = (f"the visual budget of {budget} tokens holds only {kept} of the {T} sampled frames "
           f"at these windows" if budget is not None else "the plan keeps a subset")
    return (f"{len(dropped)} of {T} sampled frames were dropped{lost} under {policy}: {why} "
            f"(the smallest kept frame is {coarsest} tokens); the kept frames are spread evenly "
            f"in time. Sample fewer frames (--frames) or raise --max-length to keep them all")


def _token_fields(grid, fitted, counts, req, prompt_tokens: int, generated: int) -> dict:
    """Visual tokens against the dense count and the budget; the prompt and the answer."""
    return {
        "visual_tokens": int(sum(counts)),
        "dense_visual_tokens": len(fitted.plan) * grid[0] * grid[1],
        "budget": fitted.budget,
        "max_length": int(req.max_length),
        "text_tokens": int(fitted.text_tokens),
        "prompt_tokens": int(prompt_tokens),
        "generated_tokens": int(generated),
    }


def _timings(frames, timer) -> dict:
    """Seconds per stage, TTFT (the stages after decoding, as in the paper) and the wall time
    from the request's start to its first token. The frames stream through the vision tower:
    "frames" (opening the video, then decoding and resizing, start to last frame) overlaps
    "vision" (the tower's own time); "frames_wait" is the part of it the tower waited for
    frames. So the stages do not add up to the wall time: "first_token" is that."""
    t = timer.times
    timings = {k: round(t.get(k, 0.0), 6) for k in STAGES}
    if frames.decode_s is not None and frames.decode_s > 0:
        timings["frames"] = round(float(frames.decode_s), 6)
    timings["frames_wait"] = round(t.get("frames_wait", 0.0), 6)
    timings["ttft"] = round(sum(t.get(k, 0.0) for k in TTFT_STAGES), 6)
    start, end = getattr(timer, "started", None), timer.ended.get("prefill")
    timings["first_token"] = None if start is None or end is None else round(end - start, 6)
    return timings


def _memory_fields(lm, routers, timer) -> dict:
    """The request's peak memory and the weights'.

    CUDA: the allocator's peak; CPU: the process's resident high-water mark over the request;
    "peak_memory_source" says which. Activation = the request's own memory: CUDA, peak minus
    the weights on the device; CPU, the resident set's rise over the request."""
    from .telemetry.memory import backbone_device_weight_bytes, backbone_weight_bytes
    weights = backbone_weight_bytes(lm, routers)
    peak, peak_source, activation = timer.peak(
        backbone_device_weight_bytes(lm, routers, lm.device)
        if timer.device.type == "cuda" else 0)
    return {
        "peak_memory_bytes": peak,
        "peak_memory_source": peak_source,
        "peak_activation_bytes": activation,
        "weights_bytes": weights,
        "peak_memory_nvml_bytes": timer.nvml_peak,
    }


# One colour per square pooling window (its side) so the eye groups frames by resolution.
_WINDOW_COLORS = {1: "#d62728", 2: "#1f77b4", 3: "#9467bd", 4: "#7f7f7f"}
_OTHER = "#bcbd22"
_DROPPED = "#dddddd"


def _window_color(label: str) -> str:
    """The bar colour of a frame row's window label ("2x2", "1x2", "drop")."""
    if label == "drop":
        return _DROPPED
    sh, sw = (int(x) for x in label.split("x"))
    return _WINDOW_COLORS.get(sh, _OTHER) if sh == sw else _OTHER


def _grid(report: dict):
    g = report.get("grid") or (16, 16)
    return int(g[0]), int(g[1])


def _window(w):
    return normalize_window(tuple(w) if isinstance(w, list) else w)


def window_label(w) -> str:
    """``0`` -> "drop", ``2`` / ``(2, 2)`` -> "2x2", ``(1, 2)`` -> "1x2"."""
    nw = _window(w)
    return "drop" if nw is None else f"{nw[0]}x{nw[1]}"


def frame_rows(report: dict, timestamps_s: Optional[Sequence[float]] = None) -> list:
    """One dict per sampled frame: frame (source index), time_s, score (or None), window (its
    label: "2x2", "1x2", or "drop" for a frame left out of the prompt), tokens.

    Times come from ``timestamps_s``, else the report's ``frame_times_s``, else
    ``frame_indices / fps``; None where none of those is known. Tokens are the report's
    ``frame_tokens``, or computed from ``windows`` on the report's ``grid`` (default 16x16)."""
    idx = list(report.get("frame_indices") or [])
    windows = list(report.get("windows") or [])
    if len(windows) != len(idx):
        raise ValueError(f"report: {len(windows)} windows for {len(idx)} frame_indices")
    scores = report.get("frame_scores")
    scores = list(scores) if scores is not None else [None] * len(idx)
    if timestamps_s is None:
        timestamps_s = report.get("frame_times_s") or report.get("timestamps_s")
    if timestamps_s is None and report.get("fps"):
        timestamps_s = [i / float(report["fps"]) for i in idx]
    times = list(timestamps_s) if timestamps_s is not None else [None] * len(idx)
    counts = report.get("frame_tokens")
    if counts is None or len(counts) != len(idx):
        counts = pooled_counts([tuple(w) if isinstance(w, list) else w for w in windows],
                               _grid(report))
    return [{"frame": int(f), "time_s": t, "score": s, "window": window_label(w), "tokens": n}
            for f, t, s, w, n in zip(idx, times, scores, windows, counts)]


def plot_report(report: dict, path, timestamps_s: Optional[Sequence[float]] = None,
                title: Optional[str] = None) -> str:
    """Write the tokens-per-frame / relevance plot of ``report`` to ``path`` (PNG)."""
    return plot_reports([report], path, timestamps_s, None if title is None else [title])


def plot_reports(reports: Sequence[dict], path, timestamps_s: Optional[Sequence[float]] = None,
                 titles: Optional[Sequence[str]] = None) -> str:
    """One panel per report, stacked (e.g. the demo's two questions on one video), to ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    if not reports:
        raise ValueError("plot_reports: no report to plot")
    if titles is not None and len(titles) != len(reports):
        raise ValueError(f"plot_reports: {len(titles)} titles for {len(reports)} reports")
    fig = Figure(figsize=(10, 4 * len(reports)), dpi=100)
    FigureCanvasAgg(fig)
    for i, report in enumerate(reports):
        _draw(fig.add_subplot(len(reports), 1, i + 1), report, timestamps_s,
              None if titles is None else titles[i])
    fig.tight_layout()
    path = os.fspath(path)
    fig.savefig(path, format="png")
    return path


def _draw(ax, report: dict, timestamps_s, title: Optional[str]) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    rows = frame_rows(report, timestamps_s)
    have_times = rows and all(r["time_s"] is not None and math.isfinite(r["time_s"]) for r in rows)
    xs = [r["time_s"] for r in rows] if have_times else [float(i) for i in range(len(rows))]
    gaps = [b - a for a, b in zip(xs, xs[1:]) if b > a]
    width = 0.8 * min(gaps) if gaps else 0.8

    # square windows get their side's colour; rectangular or unusual ones share "other"
    colors = [_window_color(r["window"]) for r in rows]
    ax.bar(xs, [r["tokens"] for r in rows], width=width, color=colors, edgecolor="black",
           linewidth=0.4)
    for x, r in zip(xs, rows):  # mark dropped frames, whose bars have no height
        if r["tokens"] == 0:
            ax.plot([x], [0], marker="x", color="#555555", markersize=5)
    ax.set_xlabel("time (s)" if have_times else "sampled frame")
    ax.set_ylabel("visual tokens")
    ax.set_ylim(0, max([r["tokens"] for r in rows] + [1]) * 1.15)
    handles = [Patch(color=c, label=f"{s}x{s}") for s, c in sorted(_WINDOW_COLORS.items())
               if any(r["window"] == f"{s}x{s}" for r in rows)]
    handles += [Patch(color=_OTHER, label="other")] if _OTHER in colors else []

    scores = [r["score"] for r in rows]
    if any(s is not None for s in scores):
        ax2 = ax.twinx()
        pts = [(x, s) for x, s in zip(xs, scores) if s is not None]
        ax2.plot([p[0] for p in pts], [p[1] for p in pts], color="#2ca02c", marker="o",
                 markersize=3, linewidth=1.2, label="relevance")
        ax2.axhline(0.5, color="#2ca02c", linestyle="--", linewidth=0.8)
        ax2.set_ylim(-0.02, 1.05)
        ax2.set_ylabel("relevance (Image Router)", color="#2ca02c")
        handles.append(Line2D([], [], color="#2ca02c", marker="o", label="relevance"))
    if handles:
        ax.legend(handles=handles, loc="upper left", fontsize=8, ncol=len(handles))

    if title is None:
        pol = report.get("policy", "?")
        p = report.get("policy_probability")
        ptxt = f" (p={p:.2f})" if isinstance(p, (int, float)) else ""
        title = (f"policy {pol}{ptxt}: {report.get('visual_tokens', sum(r['tokens'] for r in rows))}"
                 f" visual tokens, budget {report.get('budget', '?')}, "
                 f"dense {report.get('dense_visual_tokens', '?')}")
    ax.set_title(title, fontsize=10)
