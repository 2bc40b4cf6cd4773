"""Stages 3 and 3b of the tiny run again, with ``random_plan_prob`` (measured, not shipped).

    python scripts/studies/stage3_random_plans.py --work runs/tiny_rp --freeze-projector
    python scripts/studies/stage3_random_plans.py --work runs/tiny_random      # projector trainable

Trains ``tiny_stage3`` then ``tiny_stage3b`` with ``random_plan_prob`` (default 0.25) from the
Stage 0 model and Stage 2 routers of a finished ``scripts/tiny/train_tiny.sh`` run (``--tiny``,
default runs/tiny) into ``WORK/stage3`` and ``WORK/stage3b``; ``--freeze-projector`` also sets
``freeze_mlp``. Evaluate the result as the training README does::

    python -m vr_tiny routing-eval --data runs/tiny/data/heldout_conversations.jsonl \\
        --model WORK/stage3b/hf --routers WORK/stage3b/routers.safetensors --out OUT.json
    python -m vr_tiny label-study --model WORK/stage3b/hf \\
        --routers WORK/stage3b/routers.safetensors --work runs/label_study_rp \\
        --results OUT.json --videos-count 20 --mode drop --margin 1.0

The models behind ``studies/results/label_study/label_study_random_plans_frozen_projector.json``
and the two routing files of docs/TRAINING_STUDIES.md ("The v1 weights"; at commit 89a6471);
the shipped weights do not use it.
"""
import argparse
import json
import os
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--tiny", default="runs/tiny")
    ap.add_argument("--prob", type=float, default=0.25)
    ap.add_argument("--freeze-projector", action="store_true")
    args = ap.parse_args(argv)
    base = os.path.join(args.tiny, "stage0", "hf")
    prev = os.path.join(args.tiny, "stage2", "routers.safetensors")
    data = os.path.join(args.tiny, "data")
    for path in (base, prev, data):
        if not os.path.exists(path):
            sys.exit(f"{path}: not found; run scripts/tiny/train_tiny.sh first")
    import vr_tiny  # noqa: F401  (the tiny configs and their "tiny" section)
    from vr_runtime.training.config import ConfigError, load_config
    from vr_runtime.training.loop import train
    try:   # every argument before any training
        load_config("tiny_stage3", **{"tiny.random_plan_prob": args.prob})
    except ConfigError as e:
        sys.exit(f"--prob: {e}")
    for stage in (3, "3b"):
        model = base if stage == 3 else os.path.join(args.work, "stage3", "hf")
        cfg = load_config(f"tiny_stage{stage}", **{"tiny.random_plan_prob": args.prob},
                          freeze_mlp=args.freeze_projector, model=model, routers=prev,
                          train_data=os.path.join(data, "train_conversations.jsonl"),
                          eval_data=os.path.join(data, "heldout_conversations.jsonl"),
                          output_dir=os.path.join(args.work, f"stage{stage}"))
        res = train(cfg, progress=False)
        prev = os.path.join(args.work, f"stage{stage}", "routers.safetensors")
        print(json.dumps({f"stage{stage}": {k: v for k, v in res["metrics"].items()
                                             if k not in ("samples", "by_max_length")}}),
              flush=True)


if __name__ == "__main__":
    main()
