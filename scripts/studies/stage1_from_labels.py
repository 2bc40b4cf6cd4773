"""Stage 1 trained from the counterfactual labels of rule (a) instead of the
generator's, on the same videos, both evaluated on the generator's held-out labels.

    python scripts/studies/stage1_from_labels.py [--study runs/label_study] [--tiny runs/tiny_v2]

Reads ``STUDY/counterfactual_relevance.jsonl`` ((a)'s labels, written by ``python -m
vr_tiny label-study``) and ``STUDY/study_relevance.jsonl`` (the generator's labels
of the same synthetic videos, absent-color questions included), trains ``tiny_stage1`` on each
from Stage 0's model (``TINY/stage0/hf``, as ``scripts/tiny/train_tiny.sh`` does), evaluates both on
every question of ``TINY/data/heldout_relevance.jsonl`` and writes
``studies/results/label_study/stage1_from_labels.json`` (device, date, versions, command, both metrics).
"""
import argparse
import json
import os
import sys
import time


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--study", default="runs/label_study")
    ap.add_argument("--tiny", default="runs/tiny_v2")
    ap.add_argument("--out", default="studies/results/label_study/stage1_from_labels.json")
    ap.add_argument("--steps", type=int, default=1200)
    args = ap.parse_args(argv)
    if args.steps < 1:
        sys.exit(f"--steps: expected an int >= 1, got {args.steps}")
    sources = {"counterfactual": os.path.join(args.study, "counterfactual_relevance.jsonl"),
               "generator": os.path.join(args.study, "study_relevance.jsonl")}
    model = os.path.join(args.tiny, "stage0", "hf")
    heldout = os.path.join(args.tiny, "data", "heldout_relevance.jsonl")
    for path in (*sources.values(), model, heldout):
        if not os.path.exists(path):
            sys.exit(f"{path}: not found; run `python -m vr_tiny label-study --work "
                     f"{args.study}` and scripts/tiny/train_tiny.sh first")
    import vr_tiny  # noqa: F401  (the tiny configs' names)
    from vr_runtime.fingerprint import environment
    from vr_runtime.training.config import load_config
    from vr_runtime.training.loop import train
    out = {"what": "Stage 1 (tiny_stage1) trained from rule (a)'s counterfactual frame labels vs "
                   "from the generator's labels of the same videos; held-out: the generator's "
                   "labels of the tiny run's held-out videos",
           "command": "python " + " ".join(sys.argv), **environment(), "runs": {}}
    for name, data in sources.items():
        with open(data) as f:
            lines = [json.loads(x) for x in f if x.strip()]
        cfg = load_config("tiny_stage1", model=model, train_data=data, eval_data=heldout,
                          output_dir=os.path.join(args.study, f"stage1_{name}"),
                          max_steps=args.steps, eval_limit=0, report_to=[])
        t0 = time.time()
        res = train(cfg, progress=False)
        out["runs"][name] = {
            "train_data": data, "examples": len(lines),
            "positive_frames": sum(sum(x["frame_labels"]) for x in lines),
            "steps": res["global_step"], "wall_s": round(time.time() - t0, 1),
            "heldout": res["metrics"]}
        print(json.dumps({name: out["runs"][name]}, indent=2), flush=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=2)
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
