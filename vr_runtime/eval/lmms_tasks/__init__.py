"""lmms-eval tasks shipped with the package: Video-MME read from local files.

lmms-eval 0.7.3 finds tasks outside its own tree through ``--include_path DIR`` only (its
``LMMS_EVAL_PLUGINS`` variable is read after the task index is built), and a task's YAML names
its data files literally. So the task is written once per local copy of the benchmark::

    python -m vr_runtime.eval.lmms_tasks --data Video-MME/videomme --videos Video-MME/data \\
        --out videomme_task
    python -m lmms_eval --model videorouter --model_args pretrained=PATH,routers=PATH \\
        --tasks videorouter_videomme --include_path videomme_task --batch_size 1

The first command reads the questions with ``videorouter eval``'s reader (parquet as published
on the Hub, or JSON rows; every video found up front, or ``--skip-missing``), and writes
``videomme_task/``: the task's YAML and hooks (``videomme/`` here) and ``videomme.jsonl``, one
line per question with its video's absolute path. Prompt and scoring are ``videorouter
eval``'s (:mod:`vr_runtime.eval.prompting`); ``--answer-mode option-text`` is for models that
answer with the option's text (the tiny model). Nothing is downloaded and OpenCV is not needed
(lmms-eval's own ``videomme`` task downloads the data and imports ``cv2``).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
from typing import List, Optional

TASK = "videorouter_videomme"
TEMPLATE = pathlib.Path(__file__).resolve().parent / "videomme"
DATA_FILE = "videomme.jsonl"


def _write(path: pathlib.Path, text: str) -> None:
    """Whole or not at all: a temporary file beside it, fsync, rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def videomme_docs(data, videos, answer_mode: str = "letter", skip_missing: bool = False,
                  limit: Optional[int] = None):
    """(documents, skipped) of the task: one dict per question, its video's path resolved."""
    from ..benchmarks import load_benchmark
    from ..prompting import ANSWER_MODES
    if answer_mode not in ANSWER_MODES:
        from ..benchmarks import BenchmarkError
        raise BenchmarkError(f"--answer-mode {answer_mode!r}: expected one of "
                             f"{', '.join(ANSWER_MODES)}")
    bench = load_benchmark("videomme", data, videos, skip_missing=skip_missing, limit=limit)
    docs = [{"question_id": q.id, "video": str(pathlib.Path(q.video).resolve()),
             "question": q.question, "options": list(q.options), "answer": q.answer,
             "answer_mode": answer_mode, "duration": q.duration,
             "domain": str(q.extra.get("domain", "")), "task_type": q.category}
            for q in bench.questions]
    return docs, bench.skipped


def write_videomme_task(out, data, videos, answer_mode: str = "letter",
                        skip_missing: bool = False, limit: Optional[int] = None) -> dict:
    """Write the ``videorouter_videomme`` task folder ``out`` for the local Video-MME copy at
    ``data`` / ``videos``; returns {"out", "questions", "skipped"}. Bad input raises
    ``BenchmarkError`` (one line naming file:row/field) before anything is written."""
    docs, skipped = videomme_docs(data, videos, answer_mode, skip_missing, limit)
    out = pathlib.Path(out)
    if out.exists() and not out.is_dir():
        from ..benchmarks import BenchmarkError
        raise BenchmarkError(f"--out {str(out)!r}: exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    _write(out / DATA_FILE, "".join(json.dumps(d) + "\n" for d in docs))
    for name in ("utils.py", f"{TASK}.yaml"):
        _write(out / name, (TEMPLATE / name).read_text(encoding="utf-8"))
    return {"out": str(out), "questions": len(docs), "skipped": len(skipped)}


def lmms_eval_command(out, model_args: str = "pretrained=tiny") -> str:
    """The shell command that runs the task folder ``out`` (paths quoted for the shell)."""
    from shlex import quote
    return (f"python -m lmms_eval --model videorouter --model_args {quote(model_args)} "
            f"--tasks {TASK} --include_path {quote(str(out))} --batch_size 1 "
            f"--output_path {quote(str(pathlib.Path(out) / 'results'))}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m vr_runtime.eval.lmms_tasks",
        description=f"Write the lmms-eval task {TASK!r} (Video-MME from local files, for "
                    f"`python -m lmms_eval --model videorouter`) and print the command that "
                    f"runs it.")
    p.add_argument("--data", required=True, metavar="FILE_OR_DIR",
                   help="Video-MME questions: the Hub's videomme/test-*.parquet (a file or the "
                        "folder holding it) or JSON rows, as for `videorouter eval`")
    p.add_argument("--videos", required=True, metavar="DIR",
                   help="the folder with the videos (VIDEO_ID.mp4, or data/VIDEO_ID.mp4)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="the task folder to write (lmms-eval's --include_path)")
    p.add_argument("--answer-mode", default="letter", choices=("letter", "option-text"),
                   help="scoring: the option letter (default, real models) or the option's "
                        "text (the tiny model)")
    p.add_argument("--skip-missing", action="store_true",
                   help="leave out questions whose video is missing (default: an error)")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="the first N questions only")
    p.add_argument("--model-args", default="pretrained=tiny", metavar="ARGS",
                   help="the --model_args of the printed lmms-eval command "
                        "(default: pretrained=tiny)")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from ..benchmarks import BenchmarkError
    if args.limit is not None and args.limit < 1:
        print(f"{build_parser().prog}: error: --limit: expected >= 1, got {args.limit}",
              file=sys.stderr)
        return 2
    try:
        res = write_videomme_task(args.out, args.data, args.videos, args.answer_mode,
                                  args.skip_missing, args.limit)
    except BenchmarkError as e:
        print(f"{build_parser().prog}: error: {e}", file=sys.stderr)
        return 2
    skipped = f", {res['skipped']} skipped (missing video)" if res["skipped"] else ""
    print(f"wrote {res['out']}: task {TASK}, {res['questions']} questions{skipped}",
          file=sys.stderr)
    import importlib.util
    if importlib.util.find_spec("lmms_eval") is None:
        print("lmms-eval is not installed: pip install --no-deps lmms-eval==0.7.3 && "
              "pip install 'videorouter[lmms]'", file=sys.stderr)
    print(lmms_eval_command(res["out"], args.model_args))
    return 0


__all__ = ["TASK", "write_videomme_task", "videomme_docs", "lmms_eval_command", "main"]
