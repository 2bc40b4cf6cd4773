"""The ``videorouter`` command (SPEC section 4).

    videorouter ask VIDEO QUESTION [--model PATH|tiny] [--routers PATH] [--frames 64]
                    [--max-length 12288] [--max-new-tokens 64] [--policy auto|...]
                    [--device cpu|cuda] [--dtype bf16|fp16|fp32] [--json] [--plot FILE.png]
    videorouter demo [--json] [--plot FILE.png] [--policy ...]

Order of work: arguments, question, device, model/router paths and the video are checked
first (the video is opened and its last sampled frame decoded), so bad input fails in well under
a second; then the frames decode on a background thread while the model loads.

Errors a user can fix print one line, ``videorouter: error: ...``, on stderr and exit with
status 2. Anything else prints one line with a hint to rerun with ``VIDEOROUTER_DEBUG=1``, which
shows the traceback, and exits with status 1.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pathlib
import sys
import warnings
from typing import Optional

PROG = "videorouter"
# Shown in --help; the accepted set is vr_runtime.policies.policy_names(), checked after
# parsing (importing the planners pulls in torch, which --help and a bad flag should not wait for).
POLICY_HELP = "auto|global|fragment|dense|budget|uniform"
DTYPES = ("bf16", "fp16", "fp32")
SAMPLE_VIDEO = pathlib.Path(__file__).resolve().parent / "assets" / "sample.mp4"
# The bundled clip's Fragment question (vr_runtime.training.synthetic.DEMO_QUESTIONS): its
# evidence, a red circle, is on screen in frames 5-7 (2.5-4.0 s) only.
DEMO_QUESTION = "What shape is the red object?"
# Demo settings: all 16 frames of the clip (dense = 16 x 256 = 4096 visual tokens) under a
# context that leaves the visual budget at roughly a quarter of that, so the routers' choice
# between Global and Fragment decides what the model sees.
DEMO_FRAMES = 16
DEMO_MAX_LENGTH = 1400
DEMO_MAX_NEW_TOKENS = 16

EXIT_USAGE = 2     # the user's input is wrong (SPEC section 4)
EXIT_INTERNAL = 1  # a bug or an environment failure


class UsageError(ValueError):
    """A bad command-line value found after parsing (empty question, bad --plot path...)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage block) and exit status 2."""

    def error(self, message):  # noqa: D401 - argparse API
        _fail(f"{message} (see '{self.prog} --help')")


def _fail(message: str, status: int = EXIT_USAGE):
    sys.stderr.write(f"{PROG}: error: {_one_line(message)}\n")
    sys.stderr.flush()
    raise SystemExit(status)


def _one_line(message: str) -> str:
    return " ".join(str(message).split()) or "unknown error"


def _positive_int(name):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
        if value < 1:
            raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
        return value
    parse.__name__ = name  # argparse names the type in its messages
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Query-adaptive budgeted visual-token compression "
                     "for long-video question answering on InternVL3 and Qwen2.5-VL.")
    sub = parser.add_subparsers(dest="command", metavar="{ask,demo,eval}", parser_class=_Parser)
    sub.required = True

    ask = sub.add_parser("ask", help="answer a question about a video",
                         description="Answer QUESTION about VIDEO under a context budget.")
    ask.add_argument("video", metavar="VIDEO", help="video file (anything decord/ffmpeg reads)")
    ask.add_argument("question", metavar="QUESTION", help="the question, in quotes")
    ask.add_argument("--model", default="tiny", metavar="PATH|tiny",
                     help="local InternVL3-*-hf or Qwen2.5-VL-*-Instruct directory, or a preset: "
                          "'tiny' (the embedded demo model), 'tiny-qwen2.5-vl' (default: tiny)")
    ask.add_argument("--routers", default=None, metavar="PATH",
                     help="router weights (.safetensors) trained for this model")
    ask.add_argument("--frames", type=_positive_int("--frames"), default=64,
                     help="frames to sample with InternVL's segment sampling (default: 64)")
    ask.add_argument("--max-length", type=_positive_int("--max-length"), default=12288,
                     help="context length L_max in tokens (default: 12288)")
    ask.add_argument("--max-new-tokens", type=_positive_int("--max-new-tokens"), default=64,
                     help="tokens to generate at most (default: 64)")
    ask.add_argument("--policy", default="auto", metavar=POLICY_HELP,
                     help="auto lets the Semantic Router choose global or fragment; dense, "
                          "budget and uniform are the baselines (default: auto)")
    _add_common(ask, device=True)

    demo = sub.add_parser("demo", help="ask the bundled sample video with the tiny model",
                          description=f"Run 'ask' on the bundled {DEMO_FRAMES}-frame sample "
                          f"video with the tiny model and the question {DEMO_QUESTION!r}.")
    demo.add_argument("--policy", default="auto", metavar=POLICY_HELP,
                      help="as for ask; 'fragment' shows the Image Router's frame scores even "
                           "when the routers are untrained (default: auto)")
    _add_common(demo, device=False)
    # `eval` has its own parser (vr_runtime.eval.cli); main() hands it the arguments.
    sub.add_parser("eval", help="accuracy of every method on a benchmark (see 'eval --help')",
                   add_help=False)
    return parser


def _add_common(p, device: bool):
    if device:
        p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                       help="default: cuda if available, else cpu")
        p.add_argument("--dtype", choices=DTYPES, default=None,
                       help="default: bf16 on cuda, fp32 on cpu")
    p.add_argument("--json", action="store_true",
                   help='print one JSON object {"answer": ..., "report": {...}} and nothing else')
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="write a PNG of tokens per frame over time with relevance scores")


# ----------------------------------------------------------------------------- checks

def _check_inputs(args) -> None:
    """Everything that can be checked without loading a model."""
    if not args.question.strip():
        raise UsageError("QUESTION is empty; ask something about the video")
    if args.plot is not None:
        plot = pathlib.Path(args.plot)
        if plot.suffix.lower() != ".png":
            raise UsageError(f"--plot {args.plot!r}: expected a file name ending in .png")
        parent = plot.parent if str(plot.parent) else pathlib.Path(".")
        if not parent.is_dir():
            raise UsageError(f"--plot {args.plot!r}: directory {str(parent)!r} does not exist")
    from .policies import policy_names
    if args.policy not in policy_names():
        raise UsageError(f"--policy {args.policy!r}: expected one of {', '.join(policy_names())}")
    from .backbones import PRESETS
    from .errors import ModelFilesError, RouterWeightsError
    if args.model not in PRESETS:
        m = pathlib.Path(args.model)
        where = (f"pass a local InternVL3-*-hf or Qwen2.5-VL-*-Instruct directory or a preset "
                 f"({', '.join(PRESETS)})")
        if not m.exists():
            raise ModelFilesError(f"--model {args.model!r}: no such directory; {where}")
        if not m.is_dir():
            raise ModelFilesError(f"--model {args.model!r}: not a directory; {where}")
    if args.routers is not None:
        r = pathlib.Path(args.routers)
        if not r.is_file():
            raise RouterWeightsError(f"--routers {args.routers!r}: no such file")


def _device_dtype(args):
    """Resolve --device/--dtype now: asking for CUDA on a machine without it fails fast."""
    import torch
    from .devices import resolve_device, resolve_dtype
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dev = resolve_device(device)
    dtype = resolve_dtype(args.dtype, dev)
    return dev, dtype


# ----------------------------------------------------------------------------- running

def run_ask(args) -> dict:
    """Check, load, answer. Returns {"answer": str, "report": dict}."""
    _check_inputs(args)
    device, dtype = _device_dtype(args)
    from .video import prefetch_video
    # Opens and validates the video now; decoding runs while the model loads below.
    future = prefetch_video(args.video, num_frames=args.frames,
                            progress=_stderr_is_tty() and not args.json)
    try:
        from .runtime import VideoRouter
        vr = VideoRouter.from_pretrained(args.model, routers=args.routers, device=device,
                                         dtype=dtype)
    except BaseException:
        # Report the model's problem, not a later one; let the decode thread finish first.
        with contextlib.suppress(Exception):
            future.result()
        raise
    clip = future.result()  # raises VideoError if the file breaks part-way through
    res = vr.answer(clip, args.question, num_frames=args.frames, max_length=args.max_length,
                    max_new_tokens=args.max_new_tokens, policy=args.policy)
    # answer() records clip.decode_s (which overlapped the model load) as the decode time.
    report = dict(res.report)
    return {"answer": res.text, "report": report}


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except Exception:
        return False


def _demo_args(args) -> argparse.Namespace:
    return argparse.Namespace(
        command="demo", video=str(SAMPLE_VIDEO), question=DEMO_QUESTION, model="tiny",
        routers=None, frames=DEMO_FRAMES, max_length=DEMO_MAX_LENGTH,
        max_new_tokens=DEMO_MAX_NEW_TOKENS, policy=args.policy, device="cpu", dtype="fp32",
        json=args.json, plot=args.plot)


# ----------------------------------------------------------------------------- output

def _jsonable(o):
    if hasattr(o, "tolist"):      # numpy arrays/scalars, torch tensors
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    if isinstance(o, pathlib.PurePath):
        return str(o)
    return str(o)


def _fmt_num(v, spec=".3f") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return "-"
    return format(v, spec) if isinstance(v, (int, float)) else str(v)


TIMING_ORDER = ("decode", "vision", "router", "compress", "prefill", "ttft", "generate")


def _summary_lines(report: dict) -> list:
    lines = []
    pol, p = report.get("policy"), report.get("policy_probability")
    head = f"policy: {pol}" + (f" (p={p:.2f})" if isinstance(p, (int, float)) else "")
    head += (f"   visual tokens: {report.get('visual_tokens', '?')} of budget "
             f"{report.get('budget', '?')} (dense {report.get('dense_visual_tokens', '?')})"
             f"   text tokens: {report.get('text_tokens', '?')}")
    lines.append(head)
    notes = report.get("notes") or []
    for note in [notes] if isinstance(notes, str) else notes:
        lines.append(f"note: {note}")
    return lines


def _timing_line(report: dict) -> str:
    t = report.get("timings_s") or {}
    keys = [k for k in TIMING_ORDER if k in t] + [k for k in t if k not in TIMING_ORDER]
    parts = [f"{k} {_fmt_num(t[k])}" for k in keys]
    line = "timings (s): " + ("  ".join(parts) if parts else "-")
    line += f"\ndevice: {report.get('device', '?')}"
    peak = report.get("peak_memory_bytes")
    if peak:
        line += f"   peak memory: {peak / 2**30:.2f} GiB"
    return line


def print_result(out: dict, stream=None) -> None:
    """The answer, the per-frame table and the timings, for people."""
    from .plot import frame_rows
    stream = stream or sys.stdout
    report = out["report"]
    rows = frame_rows(report)
    if _use_rich(stream):
        _print_rich(out, rows, stream)
        return
    w = stream.write
    w(f"Answer: {out['answer'].strip()}\n\n")
    for line in _summary_lines(report):
        w(line + "\n")
    w(f"\n{'frame':>7} {'time (s)':>9} {'score':>7} {'scale':>6} {'tokens':>7}\n")
    for r in rows:
        w(f"{r['frame']:>7} {_fmt_num(r['time_s'], '.2f'):>9} {_fmt_num(r['score'], '.3f'):>7} "
          f"{r['scale']:>6} {r['tokens']:>7}\n")
    total = sum(r["tokens"] for r in rows)
    w(f"{'total':>7} {'':>9} {'':>7} {'':>6} {total:>7}\n\n")
    w(_timing_line(report) + "\n")


def _use_rich(stream) -> bool:
    if os.environ.get("VIDEOROUTER_PLAIN") or not hasattr(stream, "isatty") or not stream.isatty():
        return False
    try:
        import rich  # noqa: F401  (optional: plain text is used without it)
    except ImportError:
        return False
    return True


def _print_rich(out, rows, stream) -> None:
    from rich.console import Console
    from rich.table import Table
    console = Console(file=stream)
    report = out["report"]
    console.print(f"[bold]Answer:[/bold] {out['answer'].strip()}\n", markup=True,
                  highlight=False)
    for line in _summary_lines(report):
        console.print(line, markup=False, highlight=False)
    table = Table(show_footer=True)
    for name, just in (("frame", "right"), ("time (s)", "right"), ("score", "right"),
                       ("scale", "right"), ("tokens", "right")):
        table.add_column(name, justify=just)
    table.columns[0].footer = "total"
    table.columns[4].footer = str(sum(r["tokens"] for r in rows))
    for r in rows:
        relevant = isinstance(r["score"], (int, float)) and r["score"] > 0.5
        table.add_row(str(r["frame"]), _fmt_num(r["time_s"], ".2f"), _fmt_num(r["score"]),
                      r["scale"], str(r["tokens"]), style="bold" if relevant else None)
    console.print(table)
    console.print(_timing_line(report), markup=False, highlight=False)


# ----------------------------------------------------------------------------- main

def _user_errors():
    from .errors import DeviceError, ModelFilesError, RouterWeightsError, VideoError
    errs = [UsageError, VideoError, ModelFilesError, RouterWeightsError, DeviceError,
            ValueError, OSError]
    try:
        import torch
        oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError")
        errs.append(oom)
    except Exception:  # pragma: no cover
        pass
    return tuple(errs)


def _quiet_libraries() -> None:
    """Keep library chatter (transformers' warnings, progress bars) off stderr, so a failure is
    exactly one line there; VIDEOROUTER_DEBUG=1 keeps everything."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore")


def main(argv: Optional[list] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["eval"]:
        from .eval.cli import main as eval_main
        return eval_main(argv[1:])
    debug = os.environ.get("VIDEOROUTER_DEBUG", "") not in ("", "0")
    if not debug:
        _quiet_libraries()
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        args = _demo_args(args)
    try:
        # With --json stdout carries the JSON object only: anything a library prints goes to
        # stderr instead.
        redirect = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
        with redirect:
            out = run_ask(args)
            if args.plot:
                from .plot import plot_report
                plot_report(out["report"], args.plot)
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted\n")
        return 130
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 - the one place that turns errors into exit codes
        if debug:
            raise
        if isinstance(e, _user_errors()):
            _fail(_message(e), EXIT_USAGE)
        _fail(f"internal error: {type(e).__name__}: {_message(e)} (rerun with "
              f"VIDEOROUTER_DEBUG=1 for the traceback)", EXIT_INTERNAL)
    if args.json:
        sys.stdout.write(json.dumps(out, default=_jsonable) + "\n")
    else:
        print_result(out)
        if args.plot:
            sys.stdout.write(f"plot: {args.plot}\n")
    sys.stdout.flush()
    return 0


def _message(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename and e.strerror:
        return f"{e.filename}: {e.strerror}"
    return str(e) or type(e).__name__


if __name__ == "__main__":
    sys.exit(main())
