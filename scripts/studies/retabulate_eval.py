"""Rewrite the tables of finished evaluation runs in the current layout (95% Wilson intervals
included) from their committed predictions, without a model or the videos:

    python scripts/studies/retabulate_eval.py studies/results/eval_*

Each DIR's results.json, results.md, results.csv and accuracy_vs_tokens.png are rebuilt from
DIR/predictions.jsonl and the meta of DIR/results.json (the run's own settings, device and date
stay); the predictions themselves are not touched.
"""
import sys


def main(argv=None):
    from vr_runtime.eval.tables import retabulate
    dirs = sys.argv[1:] if argv is None else argv
    if not dirs:
        sys.exit("usage: python scripts/studies/retabulate_eval.py DIR [DIR ...]")
    for d in dirs:
        rows = retabulate(d)["rows"]
        print(f"{d}: {len(rows)} rows")


if __name__ == "__main__":
    main()
