"""Allocation-policy labels from an A/B probing study (paper Sec. 4.1, Video-QTR).

A question category C gets the Fragment label (1) when
``Acc_fragment(C) - Acc_global(C) > tau``, otherwise the Global label (0).

Input: JSONL lines ``{"category": ..., "acc_global": 0.61, "acc_fragment": 0.70}``
(accuracies in [0, 1] or in percent, consistently). ``label_questions`` then turns a JSONL of
questions with a ``category`` field into the policy JSONL Stage 2 reads.
"""
from __future__ import annotations

from typing import Dict, List

from .data import DataFormatError, iter_jsonl, write_jsonl


def policy_labels(accuracies: Dict[str, tuple], tau: float) -> Dict[str, int]:
    """{category: (acc_global, acc_fragment)} -> {category: 1 if frag - global > tau else 0}."""
    if not isinstance(tau, (int, float)) or isinstance(tau, bool) or tau != tau:
        raise ValueError(f"tau: expected a number (the accuracy margin), got {tau!r}")
    out = {}
    for cat, pair in accuracies.items():
        try:
            g, f = (float(x) for x in pair)
        except (TypeError, ValueError):
            raise ValueError(f"accuracies[{cat!r}]: expected (acc_global, acc_fragment), "
                             f"got {pair!r}")
        out[cat] = int(f - g > tau)
    return out


def read_accuracies(path: str) -> Dict[str, tuple]:
    acc = {}
    for where, rec in iter_jsonl(path, "accuracy"):
        if not isinstance(rec, dict):
            raise DataFormatError(f"{where}: expected a JSON object")
        cat = rec.get("category")
        if not isinstance(cat, str) or not cat:
            raise DataFormatError(f"{where}: 'category' must be a non-empty string")
        if cat in acc:
            raise DataFormatError(f"{where}: category {cat!r} listed twice")
        vals = []
        for k in ("acc_global", "acc_fragment"):
            v = rec.get(k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise DataFormatError(f"{where}: '{k}' must be a number >= 0, got {v!r}")
            vals.append(float(v))
        acc[cat] = tuple(vals)
    if not acc:
        raise DataFormatError(f"{path}: no categories")
    return acc


def label_questions(questions_path: str, labels: Dict[str, int], out_path: str) -> int:
    """Copy each question line adding ``policy`` from its ``category``; returns lines written."""
    recs: List[dict] = []
    for where, rec in iter_jsonl(questions_path, "question"):
        cat = rec.get("category") if isinstance(rec, dict) else None
        if cat not in labels:
            raise DataFormatError(f"{where}: category {cat!r} has no A/B accuracies; "
                                  f"add it to the accuracy file")
        rec["policy"] = labels[cat]
        recs.append(rec)
    write_jsonl(out_path, recs)
    return len(recs)
