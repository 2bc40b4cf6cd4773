"""``videorouter eval`` / ``python -m vr_runtime.eval`` (docs/CONTRACT.md section 5).

    videorouter eval --benchmark videomme|longvideobench|mlvu|jsonl --data FILE_OR_DIR --videos DIR
                     [--methods dense,budget,uniform,global,fragment,auto,clip,no-image-router,
                      no-semantic-router,data-ft] [--budgets 4096,8192,12288,16384,24576]
                     [--frames 64[,128]] [--model PATH|HUB_ID|tiny] [--routers PATH] [--clip PATH]
                     [--data-ft-model PATH] [--limit N] [--out DIR] [--skip-missing]
                     [--answer-mode letter|option-text] [--pre-prompt S] [--post-prompt S]
                     [--batch-size N]
    videorouter eval --make-synthetic DIR [--videos-per-split N]
    videorouter eval --make-synthetic DIR --synthetic-task needle [--videos-per-split N]
                     [--needle-minutes 5,20]     # long clips, 2-second events
    videorouter eval compare DIR_A DIR_B [--json]   # two runs, question by question
    accelerate launch --num_processes N -m vr_runtime.eval ...      # data-parallel

Bad input (missing file or video, malformed row, unknown method) prints one line naming
file:line and the field, and exits with status 2. A video that cannot be decoded is recorded as
failed and the run goes on (runner.py); the last line says how many failed.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import List, Optional

from ..cli_args import Parser, add_answer_args, model_help
from ..cli_io import fail_with, quiet_libraries
from ..errors import ModelFilesError
from ..planning.scales import PAPER_SCALES
from .benchmarks import BenchmarkError
from .compare import main as compare_main
from .methods import DEFAULT_METHODS, METHODS
from .prompting import DEFAULT_POST_PROMPT, PromptConfig
from .runner import PAPER_BUDGETS, EvalConfig, run_eval
from .synthetic import (NEEDLE_MINUTES, make_needle, make_synthetic, needle_eval_argv,
                        quick_eval_answers, quick_eval_argv)
from .tables import markdown

PROG = "videorouter eval"


def _int_list(name):
    def parse(text):
        try:
            vals = [int(x) for x in str(text).split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
        if not vals or any(v < 1 for v in vals) or len(set(vals)) != len(vals):
            raise argparse.ArgumentTypeError(f"expected distinct integers >= 1, got {text!r}")
        return tuple(vals)
    parse.__name__ = name
    return parse


def _minutes(text):
    try:
        lo, hi = (float(x) for x in str(text).split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO,HI in minutes, got {text!r}")
    if not 0 < lo <= hi:
        raise argparse.ArgumentTypeError(f"expected 0 < LO <= HI, got {text!r}")
    return lo, hi


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description="Accuracy of every method of the paper on a benchmark "
                "read from local files.",
               epilog="videorouter eval compare DIR_A DIR_B [--json]: two runs question by "
                      "question (accuracy difference, McNemar's exact test, settings and "
                      "weights compared).")
    p.add_argument("--make-synthetic", metavar="DIR", default=None,
                   help="write a small benchmark in Video-MME layout from the synthetic task, "
                        "print the command that evaluates the tiny model on it, and exit")
    p.add_argument("--videos-per-split", type=int, default=4,
                   help="--make-synthetic: videos per duration group (default: 4); with "
                        "--synthetic-task needle, the number of clips")
    p.add_argument("--synthetic-task", choices=("videomme", "needle"), default="videomme",
                   help="--make-synthetic: videomme (short clips in Video-MME layout, default) "
                        "or needle (5-20 minute clips, three 2-second events each, jsonl)")
    p.add_argument("--needle-minutes", type=_minutes, default=NEEDLE_MINUTES, metavar="LO,HI",
                   help="--synthetic-task needle: clip lengths, drawn uniformly (default: 5,20)")
    _add_benchmark_args(p)
    _add_model_args(p)
    _add_prompt_args(p)
    # ask's answer flags that eval has; --frames is a sweep here, --max-new-tokens the paper's
    # short multiple-choice answer (checked >= 1 with the other settings, as before).
    add_answer_args(p, flags=("--frames", "--scales", "--max-new-tokens", "--scorer",
                              "--seek", "--time-window", "--device", "--dtype"),
                    overrides={"--frames": dict(
                                   type=_int_list("--frames"), default=(64,),
                                   help="frame counts to sweep (default: 64; the paper also "
                                        "uses 128)"),
                               "--max-new-tokens": dict(
                                   type=int, default=16,
                                   help="tokens to generate at most (default: 16)")})
    _add_run_args(p)
    return p


def _add_benchmark_args(p) -> None:
    """What to evaluate: the benchmark, its files, the methods and the budgets."""
    p.add_argument("--benchmark", choices=("videomme", "longvideobench", "mlvu", "jsonl"))
    p.add_argument("--data", metavar="FILE_OR_DIR", help="the benchmark's question file(s)")
    p.add_argument("--videos", metavar="DIR", help="the benchmark's video folder")
    p.add_argument("--methods", default=DEFAULT_METHODS,
                   help=f"comma-separated, from {', '.join(METHODS)} (default: {DEFAULT_METHODS})")
    p.add_argument("--budgets", type=_int_list("--budgets"), default=PAPER_BUDGETS,
                   help="visual-token budgets B_img, fixed as in the paper's controlled protocol "
                        "(default: 4096,8192,12288,16384,24576)")
    p.add_argument("--limit", type=int, default=None, help="first N questions only")
    p.add_argument("--skip-missing", action="store_true",
                   help="skip questions whose video is missing (counted in results.json)")


def _add_model_args(p) -> None:
    """The weights: the model and its routers, and those of the methods that need their own."""
    p.add_argument("--model", default="tiny", metavar="PATH|HUB_ID|PRESET",
                   help=f"{model_help()} (default: tiny)")
    p.add_argument("--routers", default=None, metavar="PATH")
    p.add_argument("--clip", default=None, metavar="PATH",
                   help="local CLIPModel / SiglipModel directory (method clip)")
    p.add_argument("--data-ft-model", default=None, metavar="PATH",
                   help="the Data FT checkpoint directory (method data-ft)")


def _add_prompt_args(p) -> None:
    """How a question becomes the LLM prompt, and how its answer is read."""
    p.add_argument("--answer-mode", default="letter", choices=("letter", "option-text"),
                   help="letter: lmms-eval's letter extraction (default); option-text: the "
                        "option whose text the answer names, then the letter")
    p.add_argument("--prompt-style", default="mc", choices=("mc", "bare"),
                   help="mc: question + lettered options + instruction (lmms-eval, default); "
                        "bare: the question alone, for models trained on open-ended answers "
                        "(use with --answer-mode option-text)")
    p.add_argument("--pre-prompt", default="", help="text before the question in the LLM prompt")
    p.add_argument("--post-prompt", default=None,
                   help="the instruction after the options (default: lmms-eval's \"Answer with "
                        "the option's letter from the given choices directly.\")")


def _add_run_args(p) -> None:
    """Where the results go and how the run shows and batches its work."""
    p.add_argument("--out", default="eval_out", metavar="DIR")
    p.add_argument("--title", default="", help="title of the markdown table and the plot")
    p.add_argument("--html", default=None, metavar="FILE.html",
                   help="also write a self-contained page of the predictions, filterable by "
                        "method, budget and correctness, each with the window its method gave "
                        "every sampled frame (a rerun into the same --out rewrites it without "
                        "answering again)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--batch-size", type=int, default=1, metavar="N",
                   help="prefill and decode up to N questions of one video, method and budget "
                        "together (VideoRouter.answer_batch): the same predictions, faster; "
                        "each row's ttft_s then holds the batch's prefill, so keep the default "
                        "1 for the paper's per-sample TTFT")


def _config(a, argv: List[str]):
    for flag in ("benchmark", "data", "videos"):
        if getattr(a, flag) is None:
            raise BenchmarkError(f"--{flag}: required (or use --make-synthetic DIR)")
    if a.limit is not None and a.limit < 1:
        raise BenchmarkError(f"--limit: expected >= 1, got {a.limit}")
    if a.batch_size < 1:
        raise BenchmarkError(f"--batch-size: expected >= 1, got {a.batch_size}")
    if a.max_new_tokens < 1:
        raise BenchmarkError(f"--max-new-tokens: expected >= 1, got {a.max_new_tokens}")
    if a.html is not None:
        from ..html import check_html_file
        check_html_file(a.html)     # before the run, not after its hours
    from ..backbones import resolve_model   # torch
    for flag in ("model", "data_ft_model"):   # a preset, a directory or a cached Hub id
        v = getattr(a, flag)
        try:
            if v is not None:
                resolve_model(v)
        except ModelFilesError as e:
            raise BenchmarkError(f"--{flag.replace('_', '-')} {v!r}: "
                                 f"{str(e).split(': ', 1)[1]}") from None
    for flag in ("routers",):
        v = getattr(a, flag)
        if v is not None and not os.path.isfile(v):
            raise BenchmarkError(f"--{flag} {v!r}: no such file")
    for flag in ("clip",):
        v = getattr(a, flag)
        if v is not None and not os.path.isdir(v):
            raise BenchmarkError(f"--{flag.replace('_', '-')} {v!r}: no such directory")
    from ..routing.scorers import check_scorer   # torch
    try:
        check_scorer(a.scorer, a.scorer_model)
    except ValueError as e:
        raise BenchmarkError(str(e)) from None
    import torch
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    prompt = PromptConfig(a.pre_prompt, DEFAULT_POST_PROMPT if a.post_prompt is None
                          else a.post_prompt, a.answer_mode, a.prompt_style)
    return EvalConfig(benchmark=a.benchmark, data=a.data, videos=a.videos, out=a.out,
                      methods=a.methods, budgets=a.budgets, frames=a.frames, model=a.model,
                      routers=a.routers, clip=a.clip, data_ft_model=a.data_ft_model,
                      limit=a.limit, skip_missing=a.skip_missing, prompt=prompt,
                      max_new_tokens=a.max_new_tokens, device=device, dtype=a.dtype,
                      progress=not a.no_progress, title=a.title,
                      scales=a.scales if a.scales is not None else PAPER_SCALES,
                      batch_size=a.batch_size, scorer=a.scorer, scorer_model=a.scorer_model,
                      seek=a.seek, time_window=a.time_window,
                      command=" ".join(["videorouter eval"] + [shlex.quote(x) for x in argv]))


def _write_html(a, results: dict) -> None:
    """``--html``: every prediction of the run's predictions.jsonl (failed ones included) and
    the results table's rows, on one page."""
    import json
    from ..html import write_eval
    path = os.path.join(a.out, "predictions.jsonl")
    with open(path, encoding="utf-8") as f:
        preds = [json.loads(line) for line in f if line.strip()]
    write_eval(a.html, preds, results["rows"], a.title)


def parser_note(meta: dict) -> Optional[str]:
    """One line when the answer parser found no option in more than a quarter of the answers:
    such a table measures the prompt format, not the model."""
    n, u = meta.get("answers") or 0, meta.get("unanswered") or 0
    if not n or 4 * u <= n:
        return None
    mode = meta.get("answer_mode")
    hint = ("a model that answers with the option's text needs --answer-mode option-text"
            if mode == "letter" else "check that the model answers with one of the options")
    return (f"note: the answer parser found no option in {u} of {n} answers "
            f"({100 * u / n:.0f}%; --answer-mode {mode}), counted wrong; see 'response' in "
            f"predictions.jsonl ({hint})")


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("VIDEOROUTER_DEBUG", "") not in ("", "0")
    if not debug:
        quiet_libraries()
    if argv[:1] == ["compare"]:   # two finished runs, question by question (eval/compare.py)
        try:
            return compare_main(argv[1:])
        except Exception as e:  # noqa: BLE001 - as below
            fail_with(e, debug)
    a = build_parser().parse_args(argv)
    try:
        if a.make_synthetic and a.synthetic_task == "needle":
            info = make_needle(a.make_synthetic, a.videos_per_split, minutes=a.needle_minutes)
            print(f"wrote {info['questions']} questions on {info['num_videos']} needle clips; "
                  f"this evaluates the tiny model on them:\n  " + " ".join(
                      ["videorouter eval"] + [shlex.quote(str(x)) for x in
                                              needle_eval_argv(info, a.make_synthetic)]))
            return 0
        if a.make_synthetic:
            info = make_synthetic(a.make_synthetic, a.videos_per_split)
            n_answers = quick_eval_answers(info["questions"])
            # 0.12-0.19 s an answer on 2 CPU cores (studies/results/eval_synthetic_quick)
            print(f"wrote {info['questions']} questions on {info['num_videos']} videos; this "
                  f"evaluates the tiny model on them ({n_answers} answers, about "
                  f"{max(1, round(n_answers * 0.15 / 60))} minute(s) on 2 CPU cores):\n  "
                  + " ".join(["videorouter eval"] + [shlex.quote(str(x)) for x in
                                                     quick_eval_argv(info, a.make_synthetic)]))
            return 0
        results = run_eval(_config(a, argv))
        if results is not None:
            sys.stdout.write(markdown(results["rows"], results["meta"]))
            sk = results["meta"]["skipped"]
            if sk:
                sys.stdout.write(f"\nskipped {sk} question(s) with missing videos "
                                 f"(see results.json: meta.skipped_questions)\n")
            sys.stdout.write(f"\nwrote {a.out}/predictions.jsonl, results.json, results.md, "
                             f"results.csv, accuracy_vs_tokens.png\n")
            if a.html is not None:
                _write_html(a, results)
                sys.stdout.write(f"wrote {a.html}\n")
            note = parser_note(results["meta"])
            if note:
                sys.stderr.write(note + "\n")
            failed = results["meta"].get("failed_questions") or []
            if failed:   # the last line: how many failed
                videos = len({f["video"] for f in failed})
                sys.stdout.write(f"failed: {len(failed)} question(s) on {videos} video(s) that "
                                 f"could not be decoded, not scored (reasons in results.json: "
                                 f"meta.failed_questions); rerun the same command to retry "
                                 f"them\n")
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted (rerun the same command to resume)\n")
        return 130
    except Exception as e:  # noqa: BLE001 - the one place that turns errors into exit codes
        fail_with(e, debug)
    return 0


__all__ = ["main", "build_parser"]
