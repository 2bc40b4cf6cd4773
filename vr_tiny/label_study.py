"""Rule (a) on the synthetic task: the counterfactual frame labels (``frame-labels``,
``vr_runtime.training.labels``) of the synthetic evidence task's Fragment questions against the
labels the generator wrote (``python -m vr_tiny label-study``; docs/TRAINING_STUDIES.md, "Rule
(a) on the synthetic task")."""
from __future__ import annotations

import json
import os
import random
from collections import Counter
from typing import Dict, List, Optional, Sequence

import torch

from vr_runtime.data import synthetic_videos
from vr_runtime.data.jsonl import write_jsonl
from vr_runtime.fingerprint import environment
from vr_runtime.training.labels import (LabelConfig, check_config, label_frames, load_questions,
                                        load_router)

from .routing_eval import auc


def agreement(pairs: Sequence[tuple]) -> dict:
    """(generated labels, ground truth) pairs -> per-frame agreement, precision, recall, F1."""
    tp = fp = fn = tn = 0
    for got, want in pairs:
        for a, b in zip(got, want):
            tp += a and b
            fp += a and not b
            fn += b and not a
            tn += not a and not b
    n = tp + fp + fn + tn
    p = tp / (tp + fp) if tp + fp else None
    r = tp / (tp + fn) if tp + fn else None
    f1 = 2 * p * r / (p + r) if p and r else (0.0 if p is not None and r is not None else None)
    return {"frames": n, "agreement": (tp + tn) / n if n else None, "precision": p,
            "recall": r, "f1": f1, "positives": tp + fp, "true_positives_gt": tp + fn}


def drop_auc(diagnostics: Sequence[dict], truth: Dict[str, List[int]]) -> Optional[float]:
    """Threshold-free: the mean over questions of the AUC with which the per-frame
    log-likelihood drop ranks the true evidence frames above the others."""
    vals = [auc([x for x, y in zip(d["logprob_drop"], truth[d["id"]]) if y],
                [x for x, y in zip(d["logprob_drop"], truth[d["id"]]) if not y])
            for d in diagnostics]
    vals = [v for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None


def synthetic_mc(out_dir: str, videos: int, seed: int = 0, frames: int = 16) -> str:
    """The synthetic evidence task's Fragment questions (``synthetic_videos.write_dataset``) as a
    generic multiple-choice JSONL (options: the shapes, shuffled), keeping the generator's
    ``frame_labels`` (the reader ignores them; the study compares against them). Absent-color
    questions (answer ``none``, no frame relevant) are kept: no frame should be labelled."""
    paths = synthetic_videos.write_dataset(out_dir, videos, seed=seed, num_frames=frames,
                                           split="study")
    rng = random.Random(f"label-study-{seed}")
    lines = []
    with open(paths["relevance"], encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            opts = list(synthetic_videos.SHAPES) + [synthetic_videos.ABSENT_ANSWER]
            rng.shuffle(opts)
            lines.append({"id": r["id"], "video": r["video"], "question": r["question"],
                          "options": opts, "answer": r["answer"], "category": r["category"],
                          "frame_labels": r["frame_labels"]})
    mc = os.path.join(out_dir, "study_mc.jsonl")
    write_jsonl(mc, lines, atomic=True)
    return mc


def label_study(cfg: LabelConfig, work: str, results: str, videos: int = 8, seed: int = 0,
                command: str = "") -> dict:
    """(a) on the synthetic task with ``cfg.model``: agreement of the counterfactual labels (and
    of necessity and the minimal set alone) with the generator's, into ``results`` (JSON with
    device, date, versions, command); the labels also go to ``work/counterfactual_relevance.jsonl``
    (Stage 1's format), next to the generator's own ``work/study_relevance.jsonl``."""
    check_config(cfg)
    os.makedirs(work, exist_ok=True)
    mc = synthetic_mc(work, videos, seed, cfg.frames)
    cfg.data, cfg.videos, cfg.benchmark = mc, work, "jsonl"
    truth = {}
    with open(mc, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            truth[r["id"]] = r["frame_labels"]
    questions = load_questions(cfg)
    vr = load_router(cfg)
    rel = os.path.join(work, "counterfactual_relevance.jsonl")   # not the generator's file
    res = label_frames(vr, questions, cfg, rel, os.path.join(work, "study_diagnostics.jsonl"))
    diagnostics = res.pop("diagnostics")
    ok = [d for d in diagnostics if d["status"] == "ok"]
    study = {
        "what": "counterfactual frame labels (vr_runtime.training.labels, rule (a)) vs the "
                "synthetic generator's ground-truth frame labels, on the Fragment questions",
        "command": command, **environment(), "torch_threads": torch.get_num_threads(),
        "model": cfg.model, "settings": {k: getattr(cfg, k) for k in (
            "frames", "mode", "keep_window", "margin", "rule", "validate", "max_set",
            "answer_mode",
            "prompt_style",
            "batch")},
        "videos": videos, "seed": seed, **res,
        "labels": agreement([(d["frame_labels"], truth[d["id"]]) for d in ok]),
        "necessary_only": agreement([(d["necessary"], truth[d["id"]]) for d in ok]),
        "minimal_set_only": agreement([([int(t in d["minimal_set"]) for t in
                                         range(len(d["necessary"]))], truth[d["id"]])
                                       for d in ok]),
        "evidence_sets_only": agreement([([int(any(t in S for S in d["evidence_sets"])) for t in
                                           range(len(d["necessary"]))], truth[d["id"]])
                                         for d in ok]),
        "validation": dict(sorted(Counter(d.get("validation", "unanswerable")
                                          for d in diagnostics).items())),
        "logprob_drop_auc": drop_auc(ok, truth),
        "mean_minimal_set_size": (sum(len(d["minimal_set"]) for d in ok) / len(ok)) if ok
        else None,
        "relevance_jsonl": rel,
    }
    os.makedirs(os.path.dirname(os.path.abspath(results)) or ".", exist_ok=True)
    tmp = results + ".tmp"
    with open(tmp, "w") as f:
        json.dump(study, f, indent=2)
    os.replace(tmp, results)
    return study


__all__ = ["agreement", "drop_auc", "synthetic_mc", "label_study"]
