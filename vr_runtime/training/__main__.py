r"""``python -m vr_runtime.training``: data generation, the three stages, the tiny demo.

    python -m vr_runtime.training synth --out runs/tiny/data --train 240 --heldout 60
    python -m vr_runtime.training synth --task v2 --out runs/tiny_v2/data --train 40 --heldout 85
        # factors real footage varies: aspect, codec, noise, motion, targets, frames,
        # distractors
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
    python -m vr_runtime.training label-study --work runs/label_study \
        --results studies/results/label_study/label_study.json
    python -m vr_runtime.training labeller [--config tiny_labeller] [--set key=value ...]
        # tiny-only: the model rule (a) labels the synthetic task with (training/labeller.py)
    python -m vr_runtime.training tiny [--work runs/tiny] [--ship]   # the whole tiny demo
    python -m vr_runtime.training routing-eval --data runs/tiny/data/heldout_conversations.jsonl \
        --out routing_basic.json                        # held-out routing metrics
        # on the wide task's data also per factor value, answers at a quarter of the dense tokens
    python -m vr_runtime.training curves --runs runs/tiny --out runs/tiny/training_curves.png
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
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


def _overrides(pairs):
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
    add_synth_parser(sub)
    add_stage_parser(sub)
    add_labeller_parser(sub)
    add_policy_labels_parser(sub)
    for name in ("frame-labels", "ab-probe", "label-study"):
        add_labels_parser(sub, name)
    add_tiny_parser(sub)
    add_routing_eval_parser(sub)
    add_curves_parser(sub)
    return ap


def add_synth_parser(sub) -> argparse.ArgumentParser:
    s = sub.add_parser("synth", help="write the synthetic evidence task (videos + JSONL)")
    s.add_argument("--out", required=True)
    s.add_argument("--train", type=int, default=240)
    s.add_argument("--heldout", type=int, default=60)
    s.add_argument("--frames", type=int, default=16, help="task v1's frames a video")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--task", default="v1", choices=("v1", "v2"),
                   help="v1: the original task (square, near-lossless H.264, static, 2 targets, "
                        "16 frames); v2: the factors real footage varies, drawn at random in "
                        "--train, one factor varied at a time in --heldout (--heldout 85: 5 "
                        "videos for each of its 17 settings)")
    s.add_argument("--footage", type=int, default=0,
                   help="task v2: videos of the 'footage' split, every factor off its base at "
                        "once, like harder real footage (16:9, VP9, noise 4, 3 moving "
                        "targets, 32 of 64 frames)")
    return s


def add_stage_parser(sub) -> argparse.ArgumentParser:
    s = sub.add_parser("stage", help="run one training stage from a config")
    s.add_argument("--config", required=True, help="JSON file or stage1..3 / tiny_stage1..3")
    s.add_argument("--resume", default=None, help="a checkpoint folder, or 'latest'")
    s.add_argument("--set", nargs="*", metavar="KEY=VALUE", help="override config keys")
    s.add_argument("--no-progress", action="store_true")
    return s


def add_labeller_parser(sub) -> argparse.ArgumentParser:
    s = sub.add_parser("labeller", help="tiny-only: train the synthetic task's labeller")
    s.add_argument("--config", default="tiny_labeller", help="JSON file or a name in "
                   "vr_runtime/configs")
    s.add_argument("--set", nargs="*", metavar="KEY=VALUE", help="override config keys")
    s.add_argument("--results", default=None, help="also write the held-out metrics here, with "
                   "device, date, versions and command")
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
                "ab-probe": "forced Global vs Fragment accuracy per category",
                "label-study": "frame-labels on the synthetic task vs its true labels"}


def add_labels_parser(sub, name: str) -> argparse.ArgumentParser:
    """frame-labels, ab-probe and label-study: the model arguments they share, then their own."""
    s = sub.add_parser(name, help=_LABELS_HELP[name])
    if name == "label-study":
        s.add_argument("--work", default="runs/label_study")
        s.add_argument("--results", default=None,
                       help="the study's results file (default: WORK/label_study.json)")
        s.add_argument("--videos-count", type=int, default=8, dest="num_videos")
        s.add_argument("--seed", type=int, default=0)
    else:
        s.add_argument("--data", required=True, help="questions (a file or a folder)")
        s.add_argument("--videos", required=True, help="folder the video paths resolve in")
        s.add_argument("--benchmark", default="jsonl",
                       help="reader: jsonl (default), videomme, longvideobench, mlvu")
        s.add_argument("--out", required=True)
        s.add_argument("--limit", type=int, default=None)
    s.add_argument("--model", default="tiny")
    s.add_argument("--routers", default=None)
    s.add_argument("--frames", type=int, default=16)
    s.add_argument("--answer-mode", default="option-text" if name == "label-study"
                   else "letter", choices=("letter", "option-text"))
    s.add_argument("--prompt-style", default="bare" if name == "label-study" else "mc",
                   choices=("mc", "bare"))
    s.add_argument("--device", default="cpu")
    s.add_argument("--dtype", default=None)
    if name == "ab-probe":
        _add_ab_probe_arguments(s)
    else:
        _add_frame_label_arguments(s)
    if name == "frame-labels":
        s.add_argument("--diagnostics", default=None)
    return s


def _add_ab_probe_arguments(s) -> None:
    s.add_argument("--relevance", default=None,
                   help="JSONL of id + frame_labels for Fragment (default: the routers)")
    s.add_argument("--scoring", default="loglik", choices=("loglik", "generate"))
    s.add_argument("--max-length", type=int, default=12288)
    s.add_argument("--budget", type=int, default=None)
    s.add_argument("--max-new-tokens", type=int, default=16)
    s.add_argument("--predictions", default=None)


def _add_frame_label_arguments(s) -> None:
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


def add_tiny_parser(sub) -> argparse.ArgumentParser:
    s = sub.add_parser("tiny", help="synthetic data + the three tiny stages + curves")
    s.add_argument("--work", default="runs/tiny")
    s.add_argument("--ship", action="store_true", help="copy the weights to vr_runtime/assets/tiny")
    s.add_argument("--train", type=int, default=160)
    s.add_argument("--heldout", type=int, default=40)
    s.add_argument("--results", default=None,
                   help="folder for training_curves.png and training_metrics.json (default: WORK)")
    s.add_argument("--task", default="v1", choices=("v1", "v2", "v3", "v4", "v5", "v6", "v8",
                                                        "v9"),
                   help="the synthetic task to train on (see synth --task; v3 is v2's data and "
                        "stages plus Stage 3c, the dense and long layouts; v4 is v3's plus "
                        "Stage 3d, route supervision over dense dialogues; v5 is v3's plus "
                        "Stages 3e and 3f, Stage 3d's settings on every training video; v6 is "
                        "v5's plus Stage 3g, the same on 1,920 more training videos; v8 is "
                        "v5's from a longer Stage 0, tiny_stage0b; v9 is v8's with each shape "
                        "answer color first, 'red circle'; v7 was a study, no recipe)")
    s.add_argument("--from-model", default=None, metavar="DIR",
                   help="--task v3 to v6: start the task's own stages (v3: 3c; v4: 3d; "
                        "v5: 3e, 3f; v6: 3g) from this finished model of the task before "
                        "(config.json, model.safetensors, tokenizer.json, routers.safetensors; "
                        "e.g. the v2, v3 or v5 weights) instead of training the stages before")
    return s


def add_routing_eval_parser(sub) -> argparse.ArgumentParser:
    s = sub.add_parser("routing-eval", help="held-out routing metrics and their targets")
    s.add_argument("--data", required=True, help="a synthetic *_conversations.jsonl")
    s.add_argument("--model", default="tiny")
    s.add_argument("--routers", default=None)
    s.add_argument("--max-length", type=int, default=1400)
    s.add_argument("--frames", type=int, default=16)
    s.add_argument("--limit-videos", type=int, default=0)
    s.add_argument("--no-answers", action="store_true", help="router metrics only (fast)")
    s.add_argument("--router-pool", type=int, default=None,
                   help="the Image Router's window on Z_t (default: the routers' own setting)")
    s.add_argument("--budget-fraction", type=float, default=None,
                   help="answer at this fraction of each video's dense visual tokens instead "
                        "of at --max-length (default: 0.25 on task-v2 data, where the routing "
                        "goals are stated; --max-length on task-v1 data)")
    s.add_argument("--out", required=True)
    return s


def add_curves_parser(sub) -> argparse.ArgumentParser:
    s = sub.add_parser("curves", help="plot the training curves of a tiny run")
    s.add_argument("--runs", default="runs/tiny")
    s.add_argument("--out", default=None, help="the plot (default: RUNS/training_curves.png)")
    return s


def _command(argv) -> str:
    """The command line as typed, for results files."""
    return "python -m vr_runtime.training " + " ".join(
        shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:]))


def _synth(a, argv) -> None:
    from ..data.synthetic_videos import generate
    splits = (("train", a.train), ("heldout", a.heldout), ("footage", a.footage))
    for split, n in splits:
        if n < 0:
            raise ConfigError(f"--{split}: expected a number of videos >= 0, got {n}")
    if a.footage and a.task != "v2":
        raise ConfigError("--footage: a task-v2 split; add --task v2")
    if not any(n for _, n in splits):
        raise ConfigError("--train, --heldout and --footage are all 0: nothing to write")
    for split, n in splits:
        if not n:
            continue
        paths = generate(a.out, n, seed=a.seed, num_frames=a.frames, split=split, task=a.task)
        print(json.dumps(paths))


def _stage(a, argv) -> None:
    from .config import load_config
    from .loop import train
    cfg = load_config(a.config, **_overrides(a.set))
    res = train(cfg, resume=a.resume, progress=not a.no_progress)
    print(json.dumps({"global_step": res["global_step"], "metrics": res["metrics"]}, indent=2))


def _labeller(a, argv) -> None:
    from .labeller import LabellerConfig, train_labeller
    cfg = LabellerConfig.load(a.config, **_overrides(a.set))
    res = train_labeller(cfg, progress=not a.no_progress, results=a.results,
                         command=_command(argv))
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


def _tiny(a, argv) -> None:
    from .tiny_demo import run_tiny
    for name in ("train", "heldout"):
        if getattr(a, name) < 1:
            raise ConfigError(f"--{name}: expected a number of videos >= 1, "
                              f"got {getattr(a, name)}")
    if a.from_model is not None:
        from .tiny_demo import FROM_TASK
        if a.task not in FROM_TASK:
            raise ConfigError("--from-model: the starting point of task v3's, v4's or v5's "
                              "own stages; add --task v3, v4 or v5")
        missing = [f for f in ("config.json", "model.safetensors", "routers.safetensors")
                   if not os.path.isfile(os.path.join(a.from_model, f))]
        if missing:
            raise ConfigError(f"--from-model {a.from_model!r}: expected a finished task "
                              f"{FROM_TASK[a.task]} model directory, missing {', '.join(missing)}")
    run_tiny(a.work, ship=a.ship, n_train=a.train, n_heldout=a.heldout,
             results=a.results or a.work, task=a.task, from_model=a.from_model)


def _routing_eval(a, argv) -> None:
    if not os.path.isfile(a.data):
        raise DataFormatError(f"--data {a.data!r}: no such file (write one with "
                              f"'python -m vr_runtime.training synth')")
    for name in ("max_length", "frames", "router_pool"):
        if getattr(a, name) is not None and getattr(a, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}: expected >= 1, "
                              f"got {getattr(a, name)}")
    if a.budget_fraction is not None and not 0 < a.budget_fraction <= 1:
        raise ConfigError(f"--budget-fraction: expected a fraction in (0, 1], "
                          f"got {a.budget_fraction}")
    from .routing_eval import QUARTER, is_task_v2, run
    fraction = a.budget_fraction
    if fraction is None and is_task_v2(a.data):
        fraction = QUARTER
    res = run(a.model, a.routers, a.data, a.out, a.max_length, a.frames, a.limit_videos,
              answers=not a.no_answers, command=_command(argv), router_pool=a.router_pool,
              budget_fraction=fraction)
    print(json.dumps(res["targets"], indent=2))
    print(res["table_markdown"])


def _curves(a, argv) -> None:
    from .curves import plot_curves
    plot_curves(a.runs, a.out or os.path.join(a.runs, "training_curves.png"))


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    from vr_runtime.errors import DeviceError, ModelFilesError, RouterWeightsError, VideoError
    from vr_runtime.eval.benchmarks import BenchmarkError
    from .labels import LabelError
    from .loop import DivergedError
    commands = {"synth": _synth, "stage": _stage, "labeller": _labeller,
                "policy-labels": _policy_labels, "frame-labels": _labels_command,
                "ab-probe": _labels_command, "label-study": _labels_command, "tiny": _tiny,
                "routing-eval": _routing_eval, "curves": _curves}
    try:
        commands[a.cmd](a, argv)
    except (ConfigError, CheckpointError, DataFormatError, ModelFilesError, RouterWeightsError,
            LabelError, BenchmarkError, VideoError, DeviceError, DivergedError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _labels_command(a, argv) -> None:
    """frame-labels / ab-probe / label-study: every argument and the question file are checked
    before the model loads."""
    from . import labels
    cfg = labels.LabelConfig(model=a.model, routers=a.routers, frames=a.frames,
                        answer_mode=a.answer_mode, prompt_style=a.prompt_style, device=a.device,
                        dtype=a.dtype)
    for k in ("benchmark", "data", "videos", "limit", "mode", "keep_window", "margin", "rule",
              "validate", "max_set", "batch"):
        if hasattr(a, k):
            setattr(cfg, k, getattr(a, k))
    if a.cmd == "label-study":
        if a.num_videos < 1:
            raise labels.LabelError(f"--videos-count: expected >= 1, got {a.num_videos}")
        a.results = a.results or os.path.join(a.work, "label_study.json")
        study = labels.label_study(cfg, a.work, a.results, a.num_videos, a.seed,
                              command=_command(argv))
        print(json.dumps({k: study[k] for k in ("questions", "labelled", "unanswerable",
                                                "labels", "wall_s")}, indent=2))
        print(f"wrote {a.results} and {study['relevance_jsonl']}", file=sys.stderr)
        return
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
