"""``videorouter eval compare DIR_A DIR_B``: two evaluation runs, question by question.

For each method x budget x frames row the two runs share: the questions both answered (scored,
the same correct option), each run's accuracy on them, the difference B - A in points, how many
each run got right that the other got wrong (the discordant pairs), and McNemar's exact p-value
on those (eval/stats.py). A paired test sees much smaller differences than two overlapping
intervals do: both runs answered the same questions, so the questions' own difficulty cancels.

Nothing is dropped silently: a question only one run has, one that failed (its video could not
be decoded) in either, or one whose correct option differs between the runs is named under
its row and left out of the pair counts; rows that only one run has are listed. The runs'
settings (settings.json, what a prediction depends on) and weight fingerprints are compared
and any difference is printed first, since a difference in accuracy then measures it too.
"""
from __future__ import annotations

import json
import pathlib
import sys
from typing import Dict, List, Optional, Tuple

from .benchmarks import BenchmarkError
from .stats import mcnemar_exact

Key = Tuple[str, Optional[int], int]          # method, budget, frames
# how many question ids a text report names per list (--json has them all)
NAMES_SHOWN = 12
UNPAIRED = {"only_in_a": "only in A", "only_in_b": "only in B", "failed_in_a": "failed in A",
            "failed_in_b": "failed in B", "answer_differs": "with another correct option in B"}


def _read_run(d) -> Tuple[pathlib.Path, Dict[Key, Dict[str, dict]], dict, dict]:
    """(folder, {row key: {question id: prediction}}, settings, results meta) of one run."""
    d = pathlib.Path(d)
    f = d / "predictions.jsonl"
    if not d.is_dir():
        raise BenchmarkError(f"{d}: no such directory")
    if not f.is_file():
        raise BenchmarkError(f"{d}: no predictions.jsonl (not a finished `videorouter eval` "
                             f"run)")
    rows: Dict[Key, Dict[str, dict]] = {}
    for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            p = json.loads(line)
            key = (str(p["method"]), p["budget"], int(p["frames"]))
            qid = str(p["id"])
            if "correct" not in p:
                raise KeyError("correct")
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            what = f"missing field {e}" if isinstance(e, KeyError) else "not a prediction"
            raise BenchmarkError(f"{f}:{i}: {what}") from None
        rows.setdefault(key, {})[qid] = p     # a later line replaces an earlier one
    settings, meta = {}, {}
    for name, into in (("settings.json", settings), ("results.json", meta)):
        g = d / name
        if g.is_file():
            try:
                obj = json.loads(g.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                raise BenchmarkError(f"{g}: cannot be read ({getattr(e, 'strerror', None) or e})"
                                     ) from None
            if isinstance(obj, dict):
                into.update(obj if name == "settings.json" else obj.get("meta") or {})
    return d, rows, settings, meta


def _settings_diff(sa: dict, sb: dict) -> Tuple[Dict[str, list], Dict[str, dict]]:
    """({setting: [A's, B's]} for the settings that differ, {weights name: {a, b, match}})."""
    diff = {k: [sa.get(k, "not recorded"), sb.get(k, "not recorded")]
            for k in sorted(set(sa) | set(sb)) if k != "weights" and sa.get(k) != sb.get(k)}
    wa, wb = sa.get("weights") or {}, sb.get("weights") or {}
    weights = {k: {"a": wa.get(k), "b": wb.get(k), "match": wa.get(k) == wb.get(k)}
               for k in sorted(set(wa) | set(wb))}
    return diff, weights


def _row_order(methods: List[str]):
    """Rows as the tables order them: frames, then the run's method order, then budget."""
    order = {m: i for i, m in enumerate(methods)}

    def key(k: Key):
        method, budget, frames = k
        return frames, order.get(method, len(order)), method, -1 if budget is None else budget
    return key


def compare(dir_a, dir_b) -> dict:
    """The comparison of two run folders as a JSON-able dict (see the module's docstring)."""
    da, ra, sa, ma = _read_run(dir_a)
    db, rb, sb, mb = _read_run(dir_b)
    if not sa or not sb:
        missing = [str(d) for d, s in ((da, sa), (db, sb)) if not s]
        settings_note = f"settings.json missing in {', '.join(missing)}: settings not compared"
    else:
        settings_note = None
    diff, weights = _settings_diff(sa, sb)
    order = _row_order(list(ma.get("methods") or ()) + list(mb.get("methods") or ()))
    rows = []
    for key in sorted(set(ra) & set(rb), key=order):
        qa, qb = ra[key], rb[key]
        failed_a = sorted(q for q, p in qa.items() if p.get("failed"))
        failed_b = sorted(q for q, p in qb.items() if p.get("failed"))
        both = set(qa) & set(qb)
        answer_differs = sorted(q for q in both if qa[q].get("answer") != qb[q].get("answer"))
        paired = sorted(both - set(failed_a) - set(failed_b) - set(answer_differs))
        a_only = sum(bool(qa[q]["correct"]) and not qb[q]["correct"] for q in paired)
        b_only = sum(bool(qb[q]["correct"]) and not qa[q]["correct"] for q in paired)
        n = len(paired)
        acc_a = 100.0 * sum(bool(qa[q]["correct"]) for q in paired) / n if n else None
        acc_b = 100.0 * sum(bool(qb[q]["correct"]) for q in paired) / n if n else None
        rows.append({
            "method": key[0], "budget": key[1], "frames": key[2], "n_paired": n,
            "accuracy_a": None if acc_a is None else round(acc_a, 2),
            "accuracy_b": None if acc_b is None else round(acc_b, 2),
            "difference": None if n == 0 else round(acc_b - acc_a, 2),
            "right_in_a_only": a_only, "right_in_b_only": b_only,
            "mcnemar_p": mcnemar_exact(a_only, b_only) if n else None,
            "unpaired": {"only_in_a": sorted(set(qa) - set(qb)),
                         "only_in_b": sorted(set(qb) - set(qa)),
                         "failed_in_a": failed_a, "failed_in_b": failed_b,
                         "answer_differs": answer_differs}})
    label = lambda ks: [{"method": m, "budget": b, "frames": f}  # noqa: E731
                        for m, b, f in sorted(ks, key=order)]
    return {"a": {"dir": str(da), "date": ma.get("date"), "model": ma.get("model"),
                  "device": ma.get("device")},
            "b": {"dir": str(db), "date": mb.get("date"), "model": mb.get("model"),
                  "device": mb.get("device")},
            "settings_match": settings_note is None and not diff,
            "settings_differ": diff, "settings_note": settings_note,
            "weights": weights,
            "weights_match": settings_note is None and all(w["match"] for w in weights.values()),
            "rows": rows,
            "rows_only_in_a": label(set(ra) - set(rb)),
            "rows_only_in_b": label(set(rb) - set(ra))}


def _pct(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def _p(v) -> str:
    return "-" if v is None else ("1" if v >= 1 else f"{v:.3g}")


def _names(ids: List[str]) -> str:
    shown = ", ".join(ids[:NAMES_SHOWN])
    more = len(ids) - NAMES_SHOWN
    return shown + (f" and {more} more (--json lists all)" if more > 0 else "")


def text(c: dict) -> str:
    """The comparison as markdown: settings, the table, then every question left unpaired."""
    out = [f"# `{c['a']['dir']}` (A) vs `{c['b']['dir']}` (B), question by question", ""]
    for side in ("a", "b"):
        s = c[side]
        out.append(f"- {side.upper()}: model `{s['model']}`, {s['device']}, {s['date']}")
    if c["settings_note"]:
        out.append(f"- {c['settings_note']}")
    elif c["settings_differ"]:
        out.append("- settings DIFFER: " + "; ".join(
            f"{k}: {v[0]!r} (A) vs {v[1]!r} (B)" for k, v in c["settings_differ"].items()))
    else:
        out.append("- settings: the same")
    if c["weights"]:
        out.append("- weights: " + "; ".join(
            f"{k} {'the same' if w['match'] else 'DIFFER'} ({w['a']}"
            + ("" if w["match"] else f" vs {w['b']}") + ")" for k, w in c["weights"].items()))
    out += ["", "B - A in points over the questions both runs scored; A only / B only: "
            "questions right in one run and wrong in the other; p: McNemar's exact test on "
            "those (two-sided).", "",
            "| Method | Frames | B_img | n paired | A | B | B - A | A only | B only | p | "
            "Unpaired |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in c["rows"]:
        unpaired = sum(len(v) for v in r["unpaired"].values())
        diff = "-" if r["difference"] is None else f"{r['difference']:+.1f}"
        out.append(f"| {r['method']} | {r['frames']} | "
                   f"{'-' if r['budget'] is None else r['budget']} | {r['n_paired']} | "
                   f"{_pct(r['accuracy_a'])} | {_pct(r['accuracy_b'])} | {diff} | "
                   f"{r['right_in_a_only']} | {r['right_in_b_only']} | {_p(r['mcnemar_p'])} | "
                   f"{unpaired} |")
    notes = []
    for r in c["rows"]:
        for what, ids in r["unpaired"].items():
            if ids:
                b = "-" if r["budget"] is None else r["budget"]
                notes.append(f"- {r['method']} B_img {b}, {r['frames']} frames: "
                             f"{len(ids)} {UNPAIRED[what]}: {_names(ids)}")
    for side in ("a", "b"):
        for r in c[f"rows_only_in_{side}"]:
            b = "-" if r["budget"] is None else r["budget"]
            notes.append(f"- row only in {side.upper()}: {r['method']} B_img {b}, "
                         f"{r['frames']} frames")
    if notes:
        out += ["", "Not compared:", ""] + notes
    return "\n".join(out) + "\n"


def main(argv: List[str]) -> int:
    from ..cli_args import Parser
    p = Parser(prog="videorouter eval compare",
               description="Compare two evaluation runs question by question: per method and "
                           "budget, the accuracy difference and McNemar's exact test, and "
                           "whether the runs' settings and weights match.")
    p.add_argument("dir_a", metavar="DIR_A", help="a `videorouter eval` --out folder")
    p.add_argument("dir_b", metavar="DIR_B", help="another one")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    a = p.parse_args(argv)
    c = compare(a.dir_a, a.dir_b)
    sys.stdout.write(json.dumps(c, indent=1) + "\n" if a.json else text(c))
    return 0


__all__ = ["compare", "text", "main"]
