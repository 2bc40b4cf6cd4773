"""``python -m vr_runtime.training``: data generation, the three stages, the tiny demo.

    python -m vr_runtime.training synth --out runs/tiny/data --train 240 --heldout 60
    python -m vr_runtime.training stage --config stage1 [--resume latest] [--set key=value ...]
    accelerate launch --num_processes 4 --use_deepspeed \\
        --deepspeed_config_file vr_runtime/configs/ds_zero2.json \\
        -m vr_runtime.training stage --config stage1 --set model=path/to/InternVL3-8B-hf
    python -m vr_runtime.training policy-labels --accuracies ab.jsonl --tau 0.02 \\
        [--questions questions.jsonl --out policy.jsonl]
    python -m vr_runtime.training tiny [--work runs/tiny] [--ship]   # the whole tiny demo
    python -m vr_runtime.training curves --runs runs/tiny --out bench/results/training_curves.png
"""
from __future__ import annotations

import argparse
import json
import sys


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _overrides(pairs):
    out = {}
    for p in pairs or []:
        if "=" not in p:
            raise SystemExit(f"--set: expected key=value, got {p!r}")
        k, v = p.split("=", 1)
        out[k] = _value(v)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vr_runtime.training", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("synth", help="write the synthetic evidence task (videos + JSONL)")
    s.add_argument("--out", required=True)
    s.add_argument("--train", type=int, default=240)
    s.add_argument("--heldout", type=int, default=60)
    s.add_argument("--frames", type=int, default=16)
    s.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("stage", help="run one training stage from a config")
    s.add_argument("--config", required=True, help="JSON file or stage1..3 / tiny_stage1..3")
    s.add_argument("--resume", default=None, help="a checkpoint folder, or 'latest'")
    s.add_argument("--set", nargs="*", metavar="KEY=VALUE", help="override config keys")
    s.add_argument("--no-progress", action="store_true")
    s = sub.add_parser("policy-labels", help="A/B accuracies -> Global/Fragment labels")
    s.add_argument("--accuracies", required=True)
    s.add_argument("--tau", type=float, required=True)
    s.add_argument("--questions", default=None)
    s.add_argument("--out", default=None)
    s = sub.add_parser("tiny", help="synthetic data + the three tiny stages + curves")
    s.add_argument("--work", default="runs/tiny")
    s.add_argument("--ship", action="store_true", help="copy the weights to vr_runtime/assets/tiny")
    s.add_argument("--train", type=int, default=160)
    s.add_argument("--heldout", type=int, default=40)
    s.add_argument("--results", default="bench/results")
    s = sub.add_parser("curves", help="plot the training curves of a tiny run")
    s.add_argument("--runs", default="runs/tiny")
    s.add_argument("--out", default="bench/results/training_curves.png")
    a = ap.parse_args(argv)

    from vr_runtime.errors import ModelFilesError, RouterWeightsError
    from .config import ConfigError
    from .data import DataFormatError
    try:
        if a.cmd == "synth":
            from .synthetic import generate
            for split, n in (("train", a.train), ("heldout", a.heldout)):
                paths = generate(a.out, n, seed=a.seed, num_frames=a.frames, split=split)
                print(json.dumps(paths))
        elif a.cmd == "stage":
            from .config import load_config
            from .loop import train
            cfg = load_config(a.config, **_overrides(a.set))
            res = train(cfg, resume=a.resume, progress=not a.no_progress)
            print(json.dumps({"global_step": res["global_step"], "metrics": res["metrics"]},
                             indent=2))
        elif a.cmd == "policy-labels":
            from .policy_labels import label_questions, policy_labels, read_accuracies
            labels = policy_labels(read_accuracies(a.accuracies), a.tau)
            print(json.dumps(labels, indent=2))
            if a.questions:
                if not a.out:
                    raise ConfigError("--out: needed with --questions")
                n = label_questions(a.questions, labels, a.out)
                print(f"wrote {n} labelled questions to {a.out}", file=sys.stderr)
        elif a.cmd == "tiny":
            from .tiny_demo import run_tiny
            run_tiny(a.work, ship=a.ship, n_train=a.train, n_heldout=a.heldout,
                     results=a.results)
        elif a.cmd == "curves":
            from .curves import plot_curves
            plot_curves(a.runs, a.out)
    except (ConfigError, DataFormatError, ModelFilesError, RouterWeightsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
