r"""``python -m vr_runtime.training``: the paper's three stages and its label construction.

    python -m vr_runtime.training stage --config stage1 [--resume latest] [--set key=value ...]
    accelerate launch --num_processes 4 --use_deepspeed \
        --deepspeed_config_file vr_runtime/configs/ds_zero2.json \
        -m vr_runtime.training stage --config stage1 --set model=path/to/InternVL3-8B-hf
    python -m vr_runtime.training policy-labels --accuracies ab.jsonl --tau 0.02 \
        [--questions questions.jsonl --out policy.jsonl]
    python -m vr_runtime.training frame-labels --data mc.jsonl --videos DIR --out flr.jsonl \
        [--model tiny] [--mode drop|pool8] [--margin 1.0] [--diagnostics diag.jsonl]
    python -m vr_runtime.training ab-probe --data mc.jsonl --videos DIR --out ab.jsonl \
        [--routers r.safetensors | --relevance flr.jsonl] [--budget 1024]

The tiny model's curriculum (the synthetic task, Stage 0, the recipes, its studies) has its
own command: ``python -m vr_tiny --help``.
"""
from __future__ import annotations

import argparse
import json
import sys

# Only light modules here: each command imports what it runs inside its function, so that
# --help and argument errors never load torch or the model stack.
from .checkpoints import CheckpointError
from .config import ConfigError
from .data import DataFormatError


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def overrides(pairs):
    out = {}
    for p in pairs or []:
        if "=" not in p:
            raise ConfigError(f"--set: expected key=value, got {p!r}")
        k, v = p.split("=", 1)
        out[k] = _value(v)
    return out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m vr_runtime.training", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    add_stage_parser(sub)
    add_policy_labels_parser(sub)
    for name in ("frame-labels", "ab-probe"):
        add_labels_parser(sub, name)
    return ap


def add_stage_parser(sub, names: str = "stage1..3") -> argparse.ArgumentParser:
    s = sub.add_parser("stage", help="run one training stage from a config")
    s.add_argument("--config", required=True, help=f"JSON file or {names}")
    s.add_argument("--resume", default=None, help="a checkpoint folder, or 'latest'")
    s.add_argument("--set", nargs="*", metavar="KEY=VALUE", help="override config keys")
    s.add_argument("--no-progress", action="store_true")
    return s


def add_policy_labels_parser(sub) -> argparse.ArgumentParser:
    s = sub.add_parser("policy-labels", help="A/B accuracies -> Global/Fragment labels")
    s.add_argument("--accuracies", required=True)
    s.add_argument("--tau", type=float, required=True)
    s.add_argument("--questions", default=None)
    s.add_argument("--out", default=None)
    return s


_LABELS_HELP = {"frame-labels": "counterfactual frame-relevance labels (Appendix A)",
                "ab-probe": "forced Global vs Fragment accuracy per category"}


def add_labels_parser(sub, name: str) -> argparse.ArgumentParser:
    """frame-labels and ab-probe: the question file, the model arguments, then their own."""
    s = sub.add_parser(name, help=_LABELS_HELP[name])
    s.add_argument("--data", required=True, help="questions (a file or a folder)")
    s.add_argument("--videos", required=True, help="folder the video paths resolve in")
    s.add_argument("--benchmark", default="jsonl",
                   help="reader: jsonl (default), videomme, longvideobench, mlvu")
    s.add_argument("--out", required=True)
    s.add_argument("--limit", type=int, default=None)
    add_model_arguments(s, "letter", "mc")
    if name == "ab-probe":
        _add_ab_probe_arguments(s)
    else:
        add_frame_label_arguments(s)
        s.add_argument("--diagnostics", default=None)
    return s


def add_model_arguments(s, answer_mode: str, prompt_style: str) -> None:
    """The model a label tool scores with, and how it is asked."""
    s.add_argument("--model", default="tiny")
    s.add_argument("--routers", default=None)
    s.add_argument("--frames", type=int, default=16)
    s.add_argument("--answer-mode", default=answer_mode, choices=("letter", "option-text"))
    s.add_argument("--prompt-style", default=prompt_style, choices=("mc", "bare"))
    s.add_argument("--device", default="cpu")
    s.add_argument("--dtype", default=None)


def _add_ab_probe_arguments(s) -> None:
    s.add_argument("--relevance", default=None,
                   help="JSONL of id + frame_labels for Fragment (default: the routers)")
    s.add_argument("--scoring", default="loglik", choices=("loglik", "generate"))
    s.add_argument("--max-length", type=int, default=12288)
    s.add_argument("--budget", type=int, default=None)
    s.add_argument("--max-new-tokens", type=int, default=16)
    s.add_argument("--predictions", default=None)


def add_frame_label_arguments(s) -> None:
    """How frame-labels and label-study ablate frames and turn answers into labels."""
    s.add_argument("--mode", default="drop", choices=("drop", "pool8"))
    s.add_argument("--keep-window", type=int, default=1, dest="keep_window",
                   help="window of the frames not ablated (1: full resolution, the "
                        "paper; coarser for a model never trained on all frames at 1)")
    s.add_argument("--margin", type=float, default=1.0)
    s.add_argument("--rule", default="union",
                   choices=("union", "necessary", "minimal-set"))
    s.add_argument("--validate", default="correct",
                   choices=("correct", "remove", "off"),
                   help="the paper's counterfactual-necessity filter: mask the labelled "
                        "frames; if the answer survives, add the evidence that carries "
                        "it (correct) or drop the question (remove)")
    s.add_argument("--max-set", type=int, default=None)
    s.add_argument("--batch", type=int, default=8)


def stage_command(a, argv) -> None:
    from .config import load_config
    from .loop import train
    cfg = load_config(a.config, **overrides(a.set))
    res = train(cfg, resume=a.resume, progress=not a.no_progress)
    print(json.dumps({"global_step": res["global_step"], "metrics": res["metrics"]}, indent=2))


def _policy_labels(a, argv) -> None:
    from .policy_labels import label_questions, policy_labels, read_accuracies
    labels = policy_labels(read_accuracies(a.accuracies), a.tau)
    print(json.dumps(labels, indent=2))
    if a.questions:
        if not a.out:
            raise ConfigError("--out: needed with --questions")
        n = label_questions(a.questions, labels, a.out)
        print(f"wrote {n} labelled questions to {a.out}", file=sys.stderr)


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    commands = {"stage": stage_command, "policy-labels": _policy_labels,
                "frame-labels": _labels_command, "ab-probe": _labels_command}
    return run(commands[a.cmd], a, argv)


def run(command, a, argv) -> int:
    """``command(a, argv)``; an error the user can fix is one line on stderr and status 2."""
    from vr_runtime.errors import DeviceError, ModelFilesError, RouterWeightsError, VideoError
    from vr_runtime.eval.benchmarks import BenchmarkError
    from .labels import LabelError
    from .loop import DivergedError
    try:
        command(a, argv)
    except (ConfigError, CheckpointError, DataFormatError, ModelFilesError, RouterWeightsError,
            LabelError, BenchmarkError, VideoError, DeviceError, DivergedError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def label_config(a):
    """The ``LabelConfig`` of a label tool's arguments."""
    from .labels import LabelConfig
    cfg = LabelConfig(model=a.model, routers=a.routers, frames=a.frames,
                      answer_mode=a.answer_mode, prompt_style=a.prompt_style, device=a.device,
                      dtype=a.dtype)
    for k in ("benchmark", "data", "videos", "limit", "mode", "keep_window", "margin", "rule",
              "validate", "max_set", "batch"):
        if hasattr(a, k):
            setattr(cfg, k, getattr(a, k))
    return cfg


def _labels_command(a, argv) -> None:
    """frame-labels / ab-probe: every argument and the question file are checked before the
    model loads."""
    from . import labels
    cfg = label_config(a)
    labels.check_config(cfg)
    if a.cmd == "ab-probe":
        if a.max_length < 1 or (a.budget is not None and a.budget < 1) or a.max_new_tokens < 1:
            raise labels.LabelError(
                "--max-length, --budget and --max-new-tokens: expected ints >= 1")
    relevance = labels.read_relevance(a.relevance) if getattr(a, "relevance", None) else None
    questions = labels.load_questions(cfg)
    if relevance is not None:
        labels.check_relevance(questions, relevance, cfg.frames)
    vr = labels.load_router(cfg)
    if a.cmd == "frame-labels":
        res = labels.label_frames(vr, questions, cfg, a.out, a.diagnostics)
        res.pop("diagnostics")
        print(json.dumps(res, indent=2))
    else:
        if relevance is None and not vr.routers_trained:
            print("note: the routers are untrained; Fragment's frame scores come from untrained "
                  "weights (pass --routers or --relevance)", file=sys.stderr)
        acc = labels.ab_probe(vr, questions, cfg, a.out, relevance, a.scoring, a.max_length,
                         a.budget, a.max_new_tokens, a.predictions)
        print(json.dumps({c: {"acc_global": g, "acc_fragment": f} for c, (g, f) in acc.items()},
                         indent=2))
    print(f"wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
