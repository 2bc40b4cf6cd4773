r"""``python -m vr_tiny``: the tiny model's curriculum: its data, stages, recipes and studies.

    python -m vr_tiny synth --out runs/tiny/data --train 240 --heldout 60
    python -m vr_tiny synth --task v2 --out runs/tiny_v2/data --train 40 --heldout 85
        # factors real footage varies: aspect, codec, noise, motion, targets, frames,
        # distractors
    python -m vr_tiny stage --config tiny_stage1 [--resume latest] [--set key=value ...]
        # one stage from a config of vr_tiny/configs (a section's key: --set tiny.KEY=VALUE)
    python -m vr_tiny tiny [--work runs/tiny] [--task v9] [--ship]   # a whole recipe
    python -m vr_tiny labeller [--config tiny_labeller] [--set key=value ...]
        # the model rule (a) labels the synthetic task with (labeller.py)
    python -m vr_tiny label-study --work runs/label_study \
        --results studies/results/label_study/label_study.json
    python -m vr_tiny routing-eval --data runs/tiny/data/heldout_conversations.jsonl \
        --out routing_basic.json                        # held-out routing metrics
        # on the wide task's data also per factor value, answers at a quarter of the dense tokens
    python -m vr_tiny curves --runs runs/tiny --out runs/tiny/training_curves.png

The paper's stages and label tools: ``python -m vr_runtime.training --help``.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

# Light modules only, as in vr_runtime.training's command: --help never loads torch.
from vr_runtime.training.__main__ import (add_frame_label_arguments, add_model_arguments,
                                          add_stage_parser, label_config, overrides, run,
                                          stage_command)
from vr_runtime.training.config import ConfigError
from vr_runtime.training.data import DataFormatError

from . import TINY   # noqa: F401  (registers the "tiny" config section before a stage loads)

TASKS = ("v1", "v2", "v3", "v4", "v5", "v6", "v8", "v9")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m vr_tiny", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    add_synth_parser(sub)
    add_stage_parser(sub, "a name in vr_tiny/configs (tiny_stage1, ...)")
    add_tiny_parser(sub)
    add_labeller_parser(sub)
    add_label_study_parser(sub)
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


def add_tiny_parser(sub) -> argparse.ArgumentParser:
    s = sub.add_parser("tiny", help="synthetic data + Stage 0 + the recipe's stages + curves")
    s.add_argument("--work", default="runs/tiny")
    s.add_argument("--ship", action="store_true", help="copy the weights to vr_runtime/assets/tiny")
    s.add_argument("--train", type=int, default=160)
    s.add_argument("--heldout", type=int, default=40)
    s.add_argument("--results", default=None,
                   help="folder for training_curves.png and training_metrics.json (default: WORK)")
    s.add_argument("--task", default="v1", choices=TASKS,
                   help="the recipe (see synth --task; v3 is v2's data and stages plus Stage "
                        "3c, the dense and long layouts; v4 is v3's plus Stage 3d, route "
                        "supervision over dense dialogues; v5 is v3's plus Stages 3e and 3f, "
                        "Stage 3d's settings on every training video; v6 is v5's plus Stage "
                        "3g, the same on 1,920 more training videos; v8 is v5's from a longer "
                        "Stage 0, tiny_stage0b; v9 is v8's with each shape answer color first, "
                        "'red circle'; v7 was a study, no recipe)")
    s.add_argument("--from-model", default=None, metavar="DIR",
                   help="--task v3 to v6: start the task's own stages (v3: 3c; v4: 3d; "
                        "v5: 3e, 3f; v6: 3g) from this finished model of the task before "
                        "(config.json, model.safetensors, tokenizer.json, routers.safetensors; "
                        "e.g. the v2, v3 or v5 weights) instead of training the stages before")
    return s


def add_labeller_parser(sub) -> argparse.ArgumentParser:
    s = sub.add_parser("labeller", help="train the synthetic task's labeller")
    s.add_argument("--config", default="tiny_labeller", help="JSON file or a name in "
                   "vr_tiny/configs")
    s.add_argument("--set", nargs="*", metavar="KEY=VALUE", help="override config keys")
    s.add_argument("--results", default=None, help="also write the held-out metrics here, with "
                   "device, date, versions and command")
    s.add_argument("--no-progress", action="store_true")
    return s


def add_label_study_parser(sub) -> argparse.ArgumentParser:
    s = sub.add_parser("label-study", help="frame-labels on the synthetic task vs its true labels")
    s.add_argument("--work", default="runs/label_study")
    s.add_argument("--results", default=None,
                   help="the study's results file (default: WORK/label_study.json)")
    s.add_argument("--videos-count", type=int, default=8, dest="num_videos")
    s.add_argument("--seed", type=int, default=0)
    add_model_arguments(s, "option-text", "bare")
    add_frame_label_arguments(s)
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


def command_line(argv) -> str:
    """The command line as typed, for results files."""
    return "python -m vr_tiny " + " ".join(
        shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:]))


def _synth(a, argv) -> None:
    from vr_runtime.data.synthetic_videos import write_dataset
    splits = (("train", a.train), ("heldout", a.heldout), ("footage", a.footage))
    for split, n in splits:
        if n < 0:
            raise ConfigError(f"--{split}: expected a number of videos >= 0, got {n}")
    if a.footage and a.task != "v2":
        raise ConfigError("--footage: a task-v2 split; add --task v2")
    if not any(n for _, n in splits):
        raise ConfigError("--train, --heldout and --footage are all 0: nothing to write")
    for split, n in splits:
        if n:
            print(json.dumps(write_dataset(a.out, n, seed=a.seed, num_frames=a.frames,
                                           split=split, task=a.task)))


def _labeller(a, argv) -> None:
    from .labeller import LabellerConfig, train_labeller
    cfg = LabellerConfig.load(a.config, **overrides(a.set))
    res = train_labeller(cfg, progress=not a.no_progress, results=a.results,
                         command=command_line(argv))
    print(json.dumps({"global_step": res["global_step"], "metrics": res["metrics"]}, indent=2))


def _label_study(a, argv) -> None:
    from vr_runtime.training.labels import LabelError
    from .label_study import label_study
    if a.num_videos < 1:
        raise LabelError(f"--videos-count: expected >= 1, got {a.num_videos}")
    results = a.results or os.path.join(a.work, "label_study.json")
    study = label_study(label_config(a), a.work, results, a.num_videos, a.seed,
                        command=command_line(argv))
    print(json.dumps({k: study[k] for k in ("questions", "labelled", "unanswerable", "labels",
                                            "wall_s")}, indent=2))
    print(f"wrote {results} and {study['relevance_jsonl']}", file=sys.stderr)


def _tiny(a, argv) -> None:
    from .recipe import FROM_TASK, run_tiny
    for name in ("train", "heldout"):
        if getattr(a, name) < 1:
            raise ConfigError(f"--{name}: expected a number of videos >= 1, "
                              f"got {getattr(a, name)}")
    if a.from_model is not None:
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
                              f"'python -m vr_tiny synth')")
    for name in ("max_length", "frames", "router_pool"):
        if getattr(a, name) is not None and getattr(a, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}: expected >= 1, "
                              f"got {getattr(a, name)}")
    if a.budget_fraction is not None and not 0 < a.budget_fraction <= 1:
        raise ConfigError(f"--budget-fraction: expected a fraction in (0, 1], "
                          f"got {a.budget_fraction}")
    from .routing_eval import QUARTER, is_task_v2, run as run_eval
    fraction = a.budget_fraction
    if fraction is None and is_task_v2(a.data):
        fraction = QUARTER
    res = run_eval(a.model, a.routers, a.data, a.out, command_line(argv),
                   max_length=a.max_length, num_frames=a.frames, limit_videos=a.limit_videos,
                   answers=not a.no_answers, router_pool=a.router_pool, budget_fraction=fraction)
    print(json.dumps(res["targets"], indent=2))
    print(res["table_markdown"])


def _curves(a, argv) -> None:
    from .curves import plot_curves
    plot_curves(a.runs, a.out or os.path.join(a.runs, "training_curves.png"))


COMMANDS = {"synth": _synth, "stage": stage_command, "tiny": _tiny, "labeller": _labeller,
            "label-study": _label_study, "routing-eval": _routing_eval, "curves": _curves}


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    return run(COMMANDS[a.cmd], a, argv)


if __name__ == "__main__":
    sys.exit(main())
