"""What a method's wrong answers on the synthetic Video-MME layout say: for each wrong answer to a
shape question, whether it named the shape of the video's *other* target (the question's colour
bound to the wrong object), said ``none`` (the colour not found), or named another shape; and
the shape questions split by whether the video's two targets share their shape (any binding
answers those) or not (only a model that binds the colour to its object beats a coin there).

    python scripts/studies/dense_errors.py --data runs/tiny/videomme_syn/videomme \
        --runs studies/results/shipped_v9/steps/eval_quick ... --out errors.json [--method dense]

Each run folder holds ``videorouter eval``'s ``predictions.jsonl``.
"""
import argparse
import collections
import json
import os
import sys


def _answer(row, letter: str) -> str:
    return next(o for o in row["options"] if o.startswith(letter + ".")).split(". ", 1)[1]


def breakdown(questions: dict, predictions: list, method: str) -> dict:
    rows = [p for p in predictions if p["method"] == method]
    by_video = collections.defaultdict(dict)   # every method's rows: a video's questions
    for p in predictions:
        by_video[p["video"]][p["id"]] = p
    kinds = collections.Counter()
    for p in rows:
        q = questions[p["id"]]
        truth = _answer(q, p["answer"])
        kind = "absent colour" if truth == "none" else (
            "shape" if q["task_type"] == "Object Recognition" else "other")
        kinds[f"{kind}: right" if p["correct"] else f"{kind}: wrong"] += 1
        if kind != "shape":
            continue
        others = {_answer(questions[o["id"]], o["answer"]) for o in by_video[p["video"]].values()
                  if o["id"] != p["id"] and questions[o["id"]]["task_type"] == q["task_type"]}
        shapes = "two shapes" if others - {"none", truth} else "one shape"
        kinds[f"shape, {shapes}: {'right' if p['correct'] else 'wrong'}"] += 1
        if p["correct"]:
            continue
        said = p["response"].strip()
        kinds["shape wrong: the other target's shape" if said in others - {"none"} else
              "shape wrong: none" if said.startswith("none") else
              "shape wrong: another shape"] += 1
    return dict(sorted(kinds.items()))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="the benchmark's videomme folder (parquet)")
    ap.add_argument("--runs", nargs="+", required=True)
    ap.add_argument("--method", default="dense")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    for r in a.runs:
        if not os.path.isfile(os.path.join(r, "predictions.jsonl")):
            sys.exit(f"--runs: {r!r} has no predictions.jsonl (run videorouter eval --out {r})")
    import pandas as pd
    files = [f for f in os.listdir(a.data) if f.endswith(".parquet")]
    if not files:
        sys.exit(f"--data: no .parquet in {a.data!r}")
    df = pd.concat(pd.read_parquet(os.path.join(a.data, f)) for f in files)
    questions = {r["question_id"]: dict(r, options=list(r["options"]))
                 for r in df.to_dict("records")}
    res = {"what": "answers by question kind; wrong shape answers by what they named",
           "command": "python " + " ".join(sys.argv), "method": a.method, "runs": {}}
    for r in a.runs:
        with open(os.path.join(r, "predictions.jsonl")) as f:
            preds = [json.loads(line) for line in f]
        res["runs"][r] = breakdown(questions, preds, a.method)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=2)
    print(json.dumps(res["runs"], indent=1))


if __name__ == "__main__":
    main()
