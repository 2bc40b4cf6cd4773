"""Held-out evidence that routing follows the question, through the runtime.

On a held-out split of the synthetic task (``synthetic_videos.write_dataset``: big targets of
different colors in disjoint frames, distractors, an absent color; held-out wordings mixed in),
with a :class:`~vr_runtime.runtime.VideoRouter`, every number comes from ``VideoRouter.answer``'s
own reports (no internals):

- Image Router, per frame: sigmoid > threshold against the frame labels, on every Fragment-
  category question (every target and the absent color), overall / by category / by phrasing
  (forced ``policy="fragment"`` so that the scores exist whatever the Semantic Router says);
- AUC of the queried target's frames against *every other* target's frames (the score must
  follow the color word, not the salient object): Mann-Whitney per question, then the mean;
- the frames kept at full resolution under ``auto`` differ between every pair of targets
  (fraction of videos with two or more targets), and so do the Image Router's relevant sets;
- absent color: mean number of frames marked relevant (ideal 0: the Global fallback);
- Semantic Router accuracy (the policy ``auto`` chose) by phrasing and category;
- exact-match answers under ``auto``, and with the correct frames forced (Fragment with the
  labelled frames relevant; Global for Global questions); a shape may come after its color
  (``answered``).

The budget of the answers: ``max_length`` (the demo's 1,400 tokens of context at 16 frames),
or with ``budget_fraction`` a fixed visual budget of that fraction of the video's *dense*
tokens, ``round(fraction * T * tokens_per_frame)`` (``tokens_per_frame``: the backbone's grid,
256 for the tiny model and InternVL3), so that videos of 8 and 64 frames are held to the same
compression. The per-factor goals (``GOALS``) are stated at a quarter (``QUARTER``), which is
``routing-eval``'s default on task-v2 data.

Task v2 data (every line records the video's ``factors``, its own ``num_frames`` and, in the
held-out layout, which factor it ``varies``) is also reported per factor value
(``by_factor``): the row "aspect=16:9" holds the videos that vary the aspect (with every other
factor at its base value) and show 16:9, the row of a base value ("aspect=1:1") the base
videos; on a split without ``varies`` (a training split, every factor random) a row holds every
video with that value. Each row is checked against the goals (``GOALS``).
"""
from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from tqdm.auto import tqdm

from vr_runtime.data.atomic import write_atomic
from vr_runtime.data.synthetic_videos import FACTORS
from vr_runtime.fingerprint import environment
from vr_runtime.runtime import VideoRouter
from vr_runtime.training.data import iter_jsonl, read_jsonl

from .layouts import color_first

TARGETS = {  # the held-out targets of the task v1 split: (metric path, comparison, value)
    "image_router_frame_accuracy": (("image_router_frame_accuracy", "all", "rate"), ">=", 0.95),
    "auc_queried_vs_other_target": (("auc_queried_vs_other_target", "mean"), ">=", 0.95),
    "kept_frames_differ_between_colors": (("kept_full_res_differ_between_targets", "rate"),
                                          ">=", 0.90),
    "absent_color_mean_frames_marked": (("absent_color_frames_marked", "mean"), "<=", 0.5),
    "semantic_router_heldout_phrasings": (("semantic_router_accuracy", "phrasing=heldout", "rate"),
                                          ">=", 0.95),
    "answers_auto": (("answers_auto", "all", "rate"), ">=", 0.85),
}
QUARTER = 0.25   # the goals' budget: answers under ``auto`` at a quarter of the dense tokens
GOALS = {  # stricter goals, checked overall and for every factor value: (comparison, value)
    "image_router_frame_accuracy": (">=", 0.97),
    "auc_queried_vs_other_target": (">=", 0.97),
    "kept_full_res_differ_between_targets": (">=", 0.95),
    "absent_color_frames_marked": ("<=", 0.5),
    "answers_auto": (">=", 0.90),
}
# the per-factor columns: (metric, how a group's values combine, short header)
COLUMNS = (("image_router_frame_accuracy", "rate", "frame acc"),
           ("auc_queried_vs_other_target", "mean", "AUC vs other targets"),
           ("kept_full_res_differ_between_targets", "rate", "kept differ"),
           ("absent_color_frames_marked", "mean", "absent: frames marked"),
           ("answers_auto", "rate", "answers auto"),
           ("answers_forced_correct_frames", "rate", "answers forced"),
           ("semantic_router_accuracy", "rate", "semantic router"))


def auc(pos: Sequence[float], neg: Sequence[float]) -> Optional[float]:
    """P(score(pos) > score(neg)) + 0.5 P(tie): the Mann-Whitney AUC; None without pairs."""
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def norm_answer(text: str) -> str:
    return text.strip().lower().rstrip(".").strip()


def answered(text: str, ex) -> bool:
    """Exact match of ``text`` with ``ex``'s answer, or with its color-first form (``red
    circle`` for "What shape is the red object?" answered ``circle``: ``layouts.color_first``,
    the form the shipped tiny weights answer in). Neither form names another object."""
    got = norm_answer(text)
    return got in {norm_answer(ex.answer), norm_answer(color_first(ex.question, ex.answer))}


def _rate(xs) -> Optional[float]:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None


def _add(table, keys, value):
    for k in keys:
        table[k].append(value)


def factor_groups(meta: dict) -> List[str]:
    """The per-factor rows a task-v2 line belongs to ("name=value"; module docstring)."""
    factors = meta.get("factors")
    if not isinstance(factors, dict):
        return []
    varies = meta.get("varies")
    return [f"{k}={v}" for k, v in factors.items() if varies is None or varies in (k, "base")]


class _Tally:
    """The per-group lists the metrics are computed from: question-level (one value a
    question) and video-level (one value a video), keyed by "all", the factor rows and, for
    question-level ones, "phrasing=..." and "category=..."."""

    def __init__(self):
        self.frame_right, self.sem = defaultdict(list), defaultdict(list)
        self.ans_auto, self.ans_forced = defaultdict(list), defaultdict(list)
        self.aucs, self.absent_marked = defaultdict(list), defaultdict(list)
        self.kept_differ, self.rel_differ = defaultdict(list), defaultdict(list)
        self.samples: List[dict] = []
        self.frames_seen = set()


@dataclass(frozen=True)
class EvalSettings:
    """How a split is evaluated. ``num_frames``: T for lines without their own ``num_frames``.
    ``limit_videos``: the first N videos only (0: all). ``answers``: answer every question too
    (else the routers alone). ``router_pool``: the Image Router's window on Z_t (None: the
    routers' configured one), to measure what a cheaper pool costs in accuracy.
    ``budget_fraction``: answer at that fraction of each video's dense visual tokens (None: at
    ``max_length``)."""
    max_length: int = 1400
    num_frames: int = 16
    max_new_tokens: int = 8
    limit_videos: int = 0
    answers: bool = True
    router_pool: Optional[int] = None
    budget_fraction: Optional[float] = None


def eval_routing(vr, conversations: str, progress: bool = False, **settings) -> dict:
    """Metrics of ``vr`` on a synthetic conversations JSONL (``synthetic_videos.write_dataset``'s
    ``*_conversations.jsonl``: every line has category, phrasing, policy and, for Fragment
    questions, frame labels), evaluated as ``settings`` (:class:`EvalSettings`' fields) say."""
    st = EvalSettings(**settings)
    max_length, num_frames, max_new_tokens = st.max_length, st.num_frames, st.max_new_tokens
    answers, router_pool, budget_fraction = st.answers, st.router_pool, st.budget_fraction
    limit_videos = st.limit_videos

    by_video: Dict[str, list] = defaultdict(list)
    for ex in read_jsonl(conversations, "conversation"):
        by_video[ex.video].append(ex)
    videos = sorted(by_video)[:limit_videos or None]
    grid = vr.lm.grid
    tokens_per_frame = int(grid[0]) * int(grid[1])
    tally = _Tally()
    for video in tqdm(videos, desc="routing eval", disable=not progress, leave=False):
        exs = by_video[video]
        T = exs[0].frames or num_frames
        tally.frames_seen.add(T)
        kw = dict(num_frames=T, max_length=max_length, max_new_tokens=max_new_tokens,
                  cache_visual=True)
        if budget_fraction is not None:
            kw["budget"] = max(1, round(budget_fraction * T * tokens_per_frame))
        if router_pool is not None:
            kw["router_pool"] = router_pool
        _eval_video(vr, video, exs, T, kw, answers, tally)
        vr.clear_visual_cache()
    out = _summary(tally, vr, videos, st, tokens_per_frame)
    rows = sorted({g for d in (tally.frame_right, tally.aucs) for g in d if g != "all"
                   and not g.startswith(("phrasing=", "category="))})
    if rows:
        out["by_factor"] = by_factor(rows, _question_level(tally), _video_level(tally),
                                     by_video, videos)
    return out


def _eval_video(vr, video: str, exs, T: int, kw: dict, answers: bool, tally: _Tally) -> None:
    """Every question of one video, then the metrics between its targets."""
    thr = vr.routers.config.threshold
    groups = ["all"] + factor_groups(exs[0].meta)
    probs, kept = {}, {}
    for ex in exs:
        cat, phr = ex.meta.get("category", "?"), ex.meta.get("phrasing", "?")
        keys = groups + [f"phrasing={phr}", f"category={cat}"]
        if ex.frame_labels is not None:   # Fragment category: the Image Router's scores
            # the routers read the bare question, as in training (Example.routed_question)
            rep = vr.answer(video, ex.question, policy="fragment",
                            router_question=ex.router_question,
                            **dict(kw, max_new_tokens=1)).report
            p = rep["frame_scores"]
            probs[ex.question] = p
            right = [(x > thr) == bool(y) for x, y in zip(p, ex.frame_labels)]
            for k in keys:
                tally.frame_right[k] += right
            if cat == "absent_color":
                _add(tally.absent_marked, groups, sum(x > thr for x in p))
        if answers:
            kept[ex.question] = _eval_answers(vr, video, ex, T, kw, keys, tally)
    targets = [ex for ex in exs if ex.meta.get("category") == "object_shape"]
    if len(targets) >= 2:
        for ex in targets:   # the queried target against every other target's frames
            p = probs[ex.question]
            others = {t for o in targets if o is not ex
                      for t, y in enumerate(o.frame_labels) if y}
            v = auc([p[t] for t, y in enumerate(ex.frame_labels) if y],
                    [p[t] for t in sorted(others)])
            if v is not None:
                _add(tally.aucs, groups, v)
        rel = [tuple(t for t, x in enumerate(probs[e.question]) if x > thr) for e in targets]
        _add(tally.rel_differ, groups, _all_differ(rel))
        if answers:
            _add(tally.kept_differ, groups, _all_differ([kept[e.question] for e in targets]))


def _eval_answers(vr, video: str, ex, T: int, kw: dict, keys, tally: _Tally) -> tuple:
    """One question answered under ``auto`` and with the correct frames forced; returns the
    frames ``auto`` kept at full resolution."""
    res = vr.answer(video, ex.question, policy="auto", router_question=ex.router_question, **kw)
    _add(tally.sem, keys, int(res.report["policy"] == "fragment") == ex.policy)
    _add(tally.ans_auto, keys, answered(res.text, ex))
    kept = tuple(t for t, w in enumerate(res.report["windows"]) if w == 1)
    if len(tally.samples) < 12:
        tally.samples.append({"video": os.path.basename(video), "question": ex.question,
                              "answer": ex.answer, "auto": res.text,
                              "policy": res.report["policy"],
                              "kept_full_resolution": list(kept)})
    if ex.policy == 1:
        labels = ex.frame_labels or [0] * T
        forced = vr.answer(video, ex.question, policy="fragment",
                           relevant=[bool(y) for y in labels],
                           **{k: v for k, v in kw.items() if k != "router_pool"})
    else:
        forced = vr.answer(video, ex.question, policy="global", **kw)
    _add(tally.ans_forced, keys, answered(forced.text, ex))
    return kept


def _packed(d) -> dict:
    return {k: {"rate": _rate(v), "n": len(v)} for k, v in sorted(d.items())}


def _mean(d, key="all", extra=None) -> dict:
    v = d.get(key, [])
    out = {"mean": _rate(v), "n": len(v)}
    if extra:
        out[extra[0]] = extra[1](v) if v else None
    return out


def _rate_of_all(d) -> dict:
    return {"rate": _rate(d.get("all", [])), "n": len(d.get("all", []))}


def _summary(tally: _Tally, vr, videos, st: EvalSettings, tokens_per_frame: int) -> dict:
    """The split's metrics (``eval_routing``'s output without ``by_factor``)."""
    t = tally
    max_length, router_pool, budget_fraction = st.max_length, st.router_pool, st.budget_fraction
    num_frames = st.num_frames
    out = {
        "videos": len(videos), "max_length": max_length,
        "num_frames": sorted(t.frames_seen) if len(t.frames_seen) > 1 else num_frames,
        "budget": ({"fraction_of_dense": budget_fraction, "tokens_per_frame": tokens_per_frame}
                   if budget_fraction is not None else {"max_length": max_length}),
        "router_pool": vr.routers.config.router_pool if router_pool is None else router_pool,
        "image_router_frame_accuracy": _packed(t.frame_right),
        "auc_queried_vs_other_target": dict(_mean(t.aucs, extra=("min", min)),
                                            questions=len(t.aucs.get("all", []))),
        "router_relevant_sets_differ_between_targets": _rate_of_all(t.rel_differ),
        "absent_color_frames_marked": _mean(t.absent_marked, extra=("max", max)),
    }
    if st.answers:
        out.update({
            "semantic_router_accuracy": _packed(t.sem),
            "kept_full_res_differ_between_targets": _rate_of_all(t.kept_differ),
            "answers_auto": _packed(t.ans_auto),
            "answers_forced_correct_frames": _packed(t.ans_forced),
            "samples": t.samples})
    return out


def _video_level(t: _Tally) -> dict:
    return {"auc_queried_vs_other_target": t.aucs, "absent_color_frames_marked":
            t.absent_marked, "kept_full_res_differ_between_targets": t.kept_differ,
            "router_relevant_sets_differ_between_targets": t.rel_differ}


def _question_level(t: _Tally) -> dict:
    return {"image_router_frame_accuracy": t.frame_right, "answers_auto": t.ans_auto,
            "answers_forced_correct_frames": t.ans_forced, "semantic_router_accuracy": t.sem}


def _all_differ(sets) -> bool:
    """Every pair of targets got a different set of frames."""
    return len(set(sets)) == len(sets)


def _factor_order(row: str):
    name, value = row.split("=", 1)
    names = list(FACTORS)
    vals = [str(v) for v in FACTORS.get(name, ())]
    return (names.index(name) if name in names else len(names),
            vals.index(value) if value in vals else len(vals), value)


def by_factor(rows, question_level, video_level, by_video, videos) -> Dict[str, dict]:
    """{factor: {value: {metric: value, "videos": n, "goals": {...}}}}: a metric computed on
    the split but not for a row (AUC between targets with one target) is None there."""
    counts = defaultdict(int)
    for v in videos:
        for g in factor_groups(by_video[v][0].meta):
            counts[g] += 1
    metrics = dict(video_level, **question_level)
    names = [m for m, _, _ in COLUMNS] + ["router_relevant_sets_differ_between_targets"]
    out: Dict[str, dict] = {}
    for row in sorted(rows, key=_factor_order):
        name, value = row.split("=", 1)
        cell = {"videos": counts[row]}
        for metric in names:
            src = metrics[metric]
            if src:   # computed on this split (the answers' metrics need answers=True)
                cell[metric] = _rate(src.get(row, []))
        cell["goals"] = check_goals(cell)
        out.setdefault(name, {})[value] = cell
    return out


def meets(v: Optional[float], op: str, thr: float) -> Optional[bool]:
    """``v op thr`` for a goal or target (``op``: ">=" or "<="); None when there is no value."""
    return None if v is None else bool(v >= thr if op == ">=" else v <= thr)


def check_goals(cell: dict) -> dict:
    """The goals (``GOALS``) on one row: {metric: {"value", "goal", "met"}} (met None where the
    metric does not exist for the row, e.g. AUC between targets with one target)."""
    out = {}
    for metric, (op, thr) in GOALS.items():
        v = cell.get(metric)
        out[metric] = {"value": v, "goal": f"{op} {thr}", "met": meets(v, op, thr)}
    return out


def check_targets(metrics: dict) -> dict:
    """{target: {"value", "target", "met"}} from :func:`eval_routing`'s output (met None when
    the metric was not computed)."""
    out = {}
    for name, (path, op, thr) in TARGETS.items():
        v = metrics
        for k in path:
            v = v.get(k) if isinstance(v, dict) else None
        out[name] = {"value": v, "target": f"{op} {thr}", "met": meets(v, op, thr)}
    return out


def overall_cell(metrics: dict) -> dict:
    """The whole split's value of each per-factor column."""
    cell = {}
    for metric, kind, _ in COLUMNS:
        m = metrics.get(metric)
        if isinstance(m, dict):
            cell[metric] = m["all"]["rate"] if "all" in m else m.get(kind)
    return cell


def markdown_table(metrics: dict) -> str:
    """The per-factor table (overall first), a mark after each value checked against a goal:
    "ok" met, "MISS" not met; "n/a" where the metric does not exist for the row."""
    head = ["factor", "value", "videos"] + [h for _, _, h in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def fmt(metric, v):
        if v is None:
            return "n/a"
        text = f"{v:.2f}" if metric == "absent_color_frames_marked" else f"{v:.3f}"
        if metric in GOALS:
            op, thr = GOALS[metric]
            text += " ok" if meets(v, op, thr) else " MISS"
        return text

    rows = [("overall", "", metrics.get("videos"), overall_cell(metrics))]
    for name, values in metrics.get("by_factor", {}).items():
        for value, cell in values.items():
            rows.append((name, value, cell["videos"], cell))
    for name, value, n, cell in rows:
        lines.append("| " + " | ".join([name, str(value), str(n)] + [
            fmt(metric, cell.get(metric)) for metric, _, _ in COLUMNS]) + " |")
    return "\n".join(lines)


def is_task_v2(path: str) -> bool:
    """Whether a conversations JSONL is task-v2 data (its first line records ``factors``)."""
    for _, rec in iter_jsonl(path):
        return isinstance(rec, dict) and isinstance(rec.get("factors"), dict)
    return False


def run(model: str, routers: Optional[str], data: str, out: str, command: str = "",
        **settings) -> dict:
    """Load the model, evaluate as ``settings`` (:class:`EvalSettings`' fields) say, write
    ``out`` (JSON with device, date, versions, command, the targets, the goals overall and per
    factor, and the markdown table)."""
    t0 = time.time()
    vr = VideoRouter.from_pretrained(model, routers=routers)
    m = eval_routing(vr, data, progress=True, **settings)
    res = {"what": "held-out routing metrics, their targets and their goals overall and per "
                   "factor (vr_runtime.training.routing_eval)",
           "command": command, **environment(), "model": model, "routers": routers,
           "data": data, "targets": check_targets(m),
           "goals": check_goals(overall_cell(m)), "metrics": m,
           "table_markdown": markdown_table(m), "wall_s": round(time.time() - t0, 1)}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    write_atomic(out, json.dumps(res, indent=2))
    return res


__all__ = ["EvalSettings", "TARGETS", "GOALS", "QUARTER", "auc", "norm_answer", "factor_groups", "eval_routing",
           "by_factor", "check_targets", "check_goals", "overall_cell", "markdown_table",
           "is_task_v2", "run"]
