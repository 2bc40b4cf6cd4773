"""Held-out evidence that routing follows the question (issue 8's targets), through the runtime.

On a held-out split of the synthetic task (``synthetic.generate``: two big targets of different
colors in disjoint frames, small distractors, an absent color; held-out wordings mixed in), with
a :class:`~vr_runtime.runtime.VideoRouter`, every number comes from ``VideoRouter.answer``'s own
reports (no internals):

- Image Router, per frame: sigmoid > threshold against the frame labels, on every Fragment-
  category question (both targets and the absent color), overall / by category / by phrasing
  (forced ``policy="fragment"`` so that the scores exist whatever the Semantic Router says);
- AUC of the queried target's frames against the *other* target's frames (the score must follow
  the color word, not the salient object): Mann-Whitney per question, then the mean;
- the frames kept at full resolution under ``auto`` differ between the two target colors
  (fraction of videos), and the Image Router's relevant sets differ;
- absent color: mean number of frames marked relevant (ideal 0: the Global fallback);
- Semantic Router accuracy (the policy ``auto`` chose) by phrasing and category;
- exact-match answers under ``auto`` at ``max_length`` (the demo's 1,400), and with the correct
  frames forced (Fragment with the labelled frames relevant; Global for Global questions).
"""
from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from typing import Dict, Optional, Sequence

TARGETS = {  # issue 8's held-out targets: (metric path, comparison, value)
    "image_router_frame_accuracy": (("image_router_frame_accuracy", "all", "rate"), ">=", 0.95),
    "auc_queried_vs_other_target": (("auc_queried_vs_other_target", "mean"), ">=", 0.95),
    "kept_frames_differ_between_colors": (("kept_full_res_differ_between_targets", "rate"),
                                          ">=", 0.90),
    "absent_color_mean_frames_marked": (("absent_color_frames_marked", "mean"), "<=", 0.5),
    "semantic_router_heldout_phrasings": (("semantic_router_accuracy", "phrasing=heldout", "rate"),
                                          ">=", 0.95),
    "answers_auto": (("answers_auto", "all", "rate"), ">=", 0.85),
}


def auc(pos: Sequence[float], neg: Sequence[float]) -> Optional[float]:
    """P(score(pos) > score(neg)) + 0.5 P(tie): the Mann-Whitney AUC; None without pairs."""
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def norm_answer(text: str) -> str:
    return text.strip().lower().rstrip(".").strip()


def _rate(xs) -> Optional[float]:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None


def _add(table, keys, value):
    for k in keys:
        table[k].append(value)


def eval_routing(vr, conversations: str, max_length: int = 1400, num_frames: int = 16,
                 max_new_tokens: int = 8, limit_videos: int = 0, answers: bool = True,
                 progress: bool = False, router_pool: Optional[int] = None) -> dict:
    """Metrics of ``vr`` on a synthetic conversations JSONL (``synthetic.generate``'s
    ``*_conversations.jsonl``: every line has category, phrasing, policy and, for Fragment
    questions, frame labels). ``router_pool``: the Image Router's window on Z_t (None: the
    routers' configured one), to measure what a cheaper pool costs in accuracy."""
    from tqdm.auto import tqdm
    from .data import read_jsonl

    by_video: Dict[str, list] = defaultdict(list)
    for ex in read_jsonl(conversations, "conversation"):
        by_video[ex.video].append(ex)
    videos = sorted(by_video)[:limit_videos or None]
    thr = vr.routers.config.threshold
    frame_right, sem = defaultdict(list), defaultdict(list)
    ans_auto, ans_forced = defaultdict(list), defaultdict(list)
    aucs, absent_marked, kept_differ, rel_differ, samples = [], [], [], [], []
    kw = dict(num_frames=num_frames, max_length=max_length, max_new_tokens=max_new_tokens,
              cache_visual=True)
    if router_pool is not None:
        kw["router_pool"] = router_pool
    for video in tqdm(videos, desc="routing eval", disable=not progress, leave=False):
        probs, kept = {}, {}
        for ex in by_video[video]:
            cat, phr = ex.meta.get("category", "?"), ex.meta.get("phrasing", "?")
            keys = ("all", f"phrasing={phr}", f"category={cat}")
            if ex.frame_labels is not None:   # Fragment category: the Image Router's scores
                # the routers read the bare question, as in training (Example.routed_question)
                rep = vr.answer(video, ex.question, policy="fragment",
                                router_question=ex.router_question,
                                **dict(kw, max_new_tokens=1)).report
                p = rep["frame_scores"]
                probs[ex.question] = p
                for k in keys:
                    frame_right[k] += [(x > thr) == bool(y) for x, y in zip(p, ex.frame_labels)]
                if cat == "absent_color":
                    absent_marked.append(sum(x > thr for x in p))
            if not answers:
                continue
            res = vr.answer(video, ex.question, policy="auto", router_question=ex.router_question,
                            **kw)
            _add(sem, keys, int(res.report["policy"] == "fragment") == ex.policy)
            _add(ans_auto, keys, norm_answer(res.text) == norm_answer(ex.answer))
            kept[ex.question] = tuple(t for t, w in enumerate(res.report["scales"]) if w == 1)
            if len(samples) < 12:
                samples.append({"video": os.path.basename(video), "question": ex.question,
                                "answer": ex.answer, "auto": res.text,
                                "policy": res.report["policy"],
                                "kept_full_resolution": list(kept[ex.question])})
            if ex.policy == 1:
                labels = ex.frame_labels or [0] * num_frames
                forced = vr.answer(video, ex.question, policy="fragment",
                                   relevant=[bool(y) for y in labels],
                                   **{k: v for k, v in kw.items() if k != "router_pool"})
            else:
                forced = vr.answer(video, ex.question, policy="global", **kw)
            _add(ans_forced, keys, norm_answer(forced.text) == norm_answer(ex.answer))
        targets = [ex for ex in by_video[video] if ex.meta.get("category") == "object_shape"]
        if len(targets) == 2:
            a, b = targets
            for ex, other in ((a, b), (b, a)):
                p = probs[ex.question]
                v = auc([p[t] for t, y in enumerate(ex.frame_labels) if y],
                        [p[t] for t, y in enumerate(other.frame_labels) if y])
                if v is not None:
                    aucs.append(v)
            rel = [tuple(t for t, x in enumerate(probs[e.question]) if x > thr) for e in (a, b)]
            rel_differ.append(rel[0] != rel[1])
            if answers:
                kept_differ.append(kept[a.question] != kept[b.question])
        vr.clear_visual_cache()

    def pack(d):
        return {k: {"rate": _rate(v), "n": len(v)} for k, v in sorted(d.items())}

    out = {
        "videos": len(videos), "max_length": max_length, "num_frames": num_frames,
        "router_pool": vr.routers.config.router_pool if router_pool is None else router_pool,
        "image_router_frame_accuracy": pack(frame_right),
        "auc_queried_vs_other_target": {"mean": _rate(aucs), "questions": len(aucs),
                                        "min": min(aucs) if aucs else None},
        "router_relevant_sets_differ_between_targets": {"rate": _rate(rel_differ),
                                                        "n": len(rel_differ)},
        "absent_color_frames_marked": {"mean": _rate(absent_marked), "n": len(absent_marked),
                                       "max": max(absent_marked) if absent_marked else None},
    }
    if answers:
        out.update({
            "semantic_router_accuracy": pack(sem),
            "kept_full_res_differ_between_targets": {"rate": _rate(kept_differ),
                                                     "n": len(kept_differ)},
            "answers_auto": pack(ans_auto),
            "answers_forced_correct_frames": pack(ans_forced),
            "samples": samples})
    return out


def check_targets(metrics: dict) -> dict:
    """{target: {"value", "target", "met"}} from :func:`eval_routing`'s output (met None when
    the metric was not computed)."""
    out = {}
    for name, (path, op, thr) in TARGETS.items():
        v = metrics
        for k in path:
            v = v.get(k) if isinstance(v, dict) else None
        met = None if v is None else bool(v >= thr if op == ">=" else v <= thr)
        out[name] = {"value": v, "target": f"{op} {thr}", "met": met}
    return out


def run(model: str, routers: Optional[str], data: str, out: str, max_length: int = 1400,
        num_frames: int = 16, limit_videos: int = 0, answers: bool = True,
        command: str = "", router_pool: Optional[int] = None) -> dict:
    """Load the model, evaluate, write ``out`` (JSON with device, date, versions, command)."""
    from vr_runtime.environment import environment
    from vr_runtime.runtime import VideoRouter
    t0 = time.time()
    vr = VideoRouter.from_pretrained(model, routers=routers)
    m = eval_routing(vr, data, max_length=max_length, num_frames=num_frames,
                     limit_videos=limit_videos, answers=answers, progress=True,
                     router_pool=router_pool)
    res = {"what": "issue 8 held-out routing metrics (vr_runtime.training.routing_eval)",
           "command": command, **environment(), "model": model, "routers": routers,
           "data": data, "targets": check_targets(m), "metrics": m,
           "wall_s": round(time.time() - t0, 1)}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f, indent=2)
    os.replace(tmp, out)
    return res


__all__ = ["TARGETS", "auc", "norm_answer", "eval_routing", "check_targets", "run"]
