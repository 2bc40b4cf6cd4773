"""The ``videorouter`` command (docs/CONTRACT.md section 4).

    videorouter ask VIDEO QUESTION [--model PATH|HUB_ID|tiny] [--routers PATH] [--frames 64]
                    [--max-length 12288] [--max-new-tokens 64] [--policy auto|...]
                    [--device cpu|cuda] [--dtype bf16|fp16|fp32] [--json] [--plot FILE.png]
    videorouter demo [--json] [--plot FILE.png] [--policy ...] [--print-sample-path]

Order of work: arguments, question, device, model/router paths and the video are checked
first (the video is opened and its last sampled frame decoded), so bad input fails in well under
a second; then the frames decode on a background thread while the model loads.

Errors a user can fix print one line, ``videorouter: error: ...``, on stderr and exit with
status 2. Anything else prints one line with a hint to rerun with ``VIDEOROUTER_DEBUG=1``, which
shows the traceback, and exits with status 1.

Ctrl-C (SIGINT), at any moment from the first line of ``main`` on (imports, decoding threads,
model load, prefill): one line, ``videorouter: interrupted``, and exit status 130 within a
moment, with no traceback; a second SIGINT does the same. A closed stdout (``| head -1``) ends
the program quietly with status 141 (128 + SIGPIPE, what the shell reports for ``cat`` and
friends).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pathlib
import signal
import sys
import threading
from typing import Optional

from .cli_args import (MAX_FRAME_PIXELS, Parser, add_answer_args, add_speed_args, answer_options,
                       model_help, sampling_of, speed_options)
from .cli_io import PROG, UsageError, fail_with, jsonable, quiet_libraries, stderr_is_tty
from .serve.command import add_serve_parser   # standard library only until serve runs

SAMPLE_VIDEO = pathlib.Path(__file__).resolve().parent / "assets" / "sample.mp4"
# The bundled clip's two Fragment questions (vr_runtime.data.synthetic_videos.DEMO_QUESTIONS): a
# red circle is on screen in frames 5-7 (2.5-4.0 s) only, a blue square in frames 11-12
# (5.5-6.5 s) only. The demo asks both: query-adaptive routing keeps different frames.
DEMO_QUESTIONS = ("What shape is the red object?", "What shape is the blue object?")
# Demo settings: all 16 frames of the clip (dense = 16 x 256 = 4096 visual tokens) under a
# context that leaves the visual budget at roughly a quarter of that, so the routers' choice
# between Global and Fragment decides what the model sees.
DEMO_FRAMES = 16
DEMO_MAX_LENGTH = 1400
DEMO_MAX_NEW_TOKENS = 16

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C'd program
# Frames ``ask`` decodes while the model loads (resized uint8: about 150 MB at 448x448).
PREFETCH_FRAMES = 256
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE


# ----------------------------------------------------------------------------- interrupts

_exiting = threading.Lock()
# A private copy of fd 2, taken when the handler is installed: while a decoder silences its
# C-level logging by pointing fd 2 at /dev/null, the "interrupted" line must still show.
_stderr_fd = 2


def _exit_interrupted(*_args) -> None:
    """Print one line and leave *now*, from whichever thread sees the signal first.

    ``os._exit`` skips interpreter shutdown on purpose: joining the decode threads, library
    atexit hooks and a second Ctrl-C during them were where SIGINT used to hang, be ignored or
    print "Exception ignored ... KeyboardInterrupt". Nothing the command writes needs cleanup:
    the plot is written to a temporary name and renamed."""
    if not _exiting.acquire(blocking=False):
        return  # another thread is already on its way out
    try:
        prefix = "\r\x1b[K" if os.isatty(_stderr_fd) else ""  # over a progress bar, if any
        os.write(_stderr_fd, f"{prefix}{PROG}: interrupted\n".encode())
    except OSError:
        pass
    os._exit(EXIT_INTERRUPTED)


def _watch_wakeup_fd(fd: int) -> None:
    # Python runs signal handlers in the main thread between bytecodes only; when that thread
    # sits in a long C call that released the GIL (a torch op, an FFmpeg decode), this thread
    # still wakes at once through the wakeup fd, which the C-level handler writes.
    while True:
        try:
            data = os.read(fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        if signal.SIGINT in data:
            _exit_interrupted()


def install_interrupt_handler() -> None:
    """Make SIGINT exit with one line and status 130 (see ``_exit_interrupted``). Called first
    thing in ``main``, before anything heavy is imported; main thread only."""
    global _stderr_fd
    try:
        _stderr_fd = os.dup(2)
    except OSError:  # pragma: no cover - no fd 2
        pass
    signal.signal(signal.SIGINT, _exit_interrupted)
    try:
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (OSError, ValueError, AttributeError):  # pragma: no cover - no pipes / not main
        return
    threading.Thread(target=_watch_wakeup_fd, args=(r,), name="vr-sigint", daemon=True).start()


def _write_stdout(text: str) -> None:
    """Write and flush; a reader that went away (``| head -1``) ends the program quietly."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        _broken_pipe()


def _broken_pipe() -> None:
    # Point fd 1 at /dev/null so the interpreter's final flush of sys.stdout cannot raise
    # again ("Exception ignored ... BrokenPipeError"), then leave with SIGPIPE's status.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
    raise SystemExit(EXIT_BROKEN_PIPE)


def build_parser() -> argparse.ArgumentParser:
    from .backbones import FAMILY_NAMES
    parser = Parser(prog=PROG, description="Query-adaptive budgeted visual-token compression "
                    f"for long-video question answering on {', '.join(FAMILY_NAMES.values())} "
                    "checkpoints (see 'ask --help').")
    sub = parser.add_subparsers(dest="command", metavar="{ask,demo,serve,eval}",
                                parser_class=Parser)
    sub.required = True
    add_ask_parser(sub)
    add_demo_parser(sub)
    add_serve_parser(sub)
    # `eval` has its own parser (vr_runtime.eval.cli); main() hands it the arguments.
    sub.add_parser("eval", help="accuracy of every method on a benchmark (see 'eval --help')",
                   add_help=False)
    return parser


def add_ask_parser(sub) -> argparse.ArgumentParser:
    ask = sub.add_parser("ask", help="answer a question about a video",
                         description="Answer QUESTION about VIDEO under a context budget.")
    ask.add_argument("video", metavar="VIDEO", help="video file (anything decord/ffmpeg reads)")
    ask.add_argument("question", metavar="QUESTION", help="the question, in quotes")
    ask.add_argument("--model", default="tiny", metavar="PATH|HUB_ID|PRESET",
                     help=f"{model_help()} (default: tiny)")
    ask.add_argument("--routers", default=None, metavar="PATH",
                     help="router weights (.safetensors) trained for this model")
    add_answer_args(ask)
    add_speed_args(ask)
    _add_output_args(ask)
    return ask


def add_demo_parser(sub) -> argparse.ArgumentParser:
    demo = sub.add_parser("demo", help="ask the bundled sample video with the tiny model",
                          description=f"Run 'ask' on the bundled {DEMO_FRAMES}-frame sample "
                          f"video with the tiny model, once per question: "
                          f"{' and '.join(repr(q) for q in DEMO_QUESTIONS)}. --json prints one "
                          f"object: the first question's 'text' (its answer) and 'report', and "
                          f"'demo' with both; --plot draws one panel per question. The clip is "
                          f"{SAMPLE_VIDEO} (--print-sample-path prints just that, to ask "
                          f"your own questions about it).")
    demo.add_argument("--print-sample-path", action="store_true",
                      help="print where the bundled sample video is and exit")
    add_answer_args(demo, flags=("--policy",), overrides={"--policy": dict(
        help="as for ask; 'fragment' shows the Image Router's frame scores even when the "
             "routers are untrained (default: auto)")})
    _add_output_args(demo, demo=True)
    # What ask's flags would say: the bundled clip and the tiny model on the CPU. The demo's
    # small context is there to make the budget bite; dense shows what it would cost without.
    demo.set_defaults(video=str(SAMPLE_VIDEO), model="tiny", routers=None, frames=DEMO_FRAMES,
                      max_length=DEMO_MAX_LENGTH, max_new_tokens=DEMO_MAX_NEW_TOKENS,
                      device="cpu", dtype="fp32", decoder="auto", allow_over_length=True)
    return demo


def _add_output_args(p, demo: bool = False) -> None:
    p.add_argument("--json", action="store_true",
                   help='print one JSON object {"text": ..., "report": {...}} and nothing else')
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="write a PNG of tokens per frame over time with relevance scores")
    p.add_argument("--html", metavar="DIR" if demo else "FILE.html", default=None,
                   help="write a page per question and an index page (index.html) into DIR"
                   if demo else "write a self-contained HTML page that opens offline: the "
                   "answer, every sampled frame's thumbnail on the timeline with its score, "
                   "window and tokens, the budget, the stage timings and the notes")


# ----------------------------------------------------------------------------- running

def run_ask(args, thumbnails=None) -> dict:
    """Check, load, answer. Returns {"text": str (the generated answer), "report": dict}."""
    return run_questions(args, [args.question], thumbnails)[0]


def run_questions(args, questions, thumbnails=None) -> list:
    """``run_ask`` for several questions about one video: the model is loaded and the video
    decoded once (the demo's two questions); one {"text", "report"} per question.
    ``thumbnails``: a ThumbnailSink (vr_runtime.video.thumbnails) the decoded frames also go
    to, for the pages of --html."""
    check_inputs(args, questions[0])
    from .backbones.devices import device_dtype
    device, dtype = device_dtype(args.device, args.dtype)
    source = _open_video(args, device, dtype, thumbnails)   # a bad file fails before the load
    vr = _load_model(args, device, dtype)
    from .routing.scorers import DEFAULT_SCORER, build_scorer
    scorer = build_scorer(getattr(args, "scorer", DEFAULT_SCORER),
                          getattr(args, "scorer_model", None), device=device, dtype=dtype,
                          cache_visual=False)
    opts = answer_options(args, scorer=scorer)
    # Each answer streams the frames through the vision tower (decoded and resized on every
    # core while the tower encodes the chunk before): no clip is held between questions.
    return [_answer_question(vr, args, opts, question, source) for question in questions]


def check_inputs(args, question: str) -> None:
    """Everything about a question that can be checked without loading a model, one line each,
    each by the stage it concerns: the question, --plot, --policy, --scorer, --model, --routers."""
    if not question.strip():
        raise UsageError("QUESTION is empty; ask something about the video")
    if args.plot is not None:
        check_plot_path(args.plot)
    if getattr(args, "html", None) is not None:
        from .html import check_html_dir, check_html_file
        (check_html_dir if args.command == "demo" else check_html_file)(args.html)
    from .backbones import check_model_arg
    from .planning.policies import check_policy
    from .routing.routers import check_router_file
    from .routing.scorers import check_scorer
    check_policy(args.policy)
    if getattr(args, "scorer", None) is not None:
        check_scorer(args.scorer, getattr(args, "scorer_model", None))
    check_model_arg(args.model)
    check_router_file(args.routers)


def check_plot_path(plot: str) -> None:
    """``--plot``: a .png name in a directory that exists, checked before the model loads (the
    plot is written by ``_write_plot``, after every answer)."""
    path = pathlib.Path(plot)
    if path.suffix.lower() != ".png":
        raise UsageError(f"--plot {plot!r}: expected a file name ending in .png")
    parent = path.parent if str(path.parent) else pathlib.Path(".")
    if not parent.is_dir():
        raise UsageError(f"--plot {plot!r}: directory {str(parent)!r} does not exist")


def _open_video(args, device, dtype, thumbnails=None):
    """Open and check the video now (its index, the sampled frames, the memory check): a
    missing, corrupt or unsupported file fails in a second, before the model loads. Its frames
    are decoded later, streamed through the vision tower (vr_runtime.video.frames), and with
    ``thumbnails`` shrunk into it on the way."""
    from .backbones import frame_spec_for
    from .video import decoders
    from .video.frames import open_frames
    decoders.set_limits(max_frame_pixels=getattr(args, "max_frame_pixels", MAX_FRAME_PIXELS))
    spec = frame_spec_for(args.model)   # from config.json: no model needed to check the video
    source = open_frames(args.video, sampling_of(args), spec,
                         memory_limit=_memory_for_video(args, device),
                         decode_workers=getattr(args, "decode_workers", None))
    from .video.thumbnails import watch
    watch(source, thumbnails)   # before the first frame decodes
    # Decode the first frames on the cores the model load leaves idle (its imports run on
    # one): they wait as resized uint8, at most PREFETCH_FRAMES of them (0.6 MB each at 448).
    source.prefetch(PREFETCH_FRAMES, wait=False)
    if stderr_is_tty() and not args.json:
        # A real checkpoint takes seconds to minutes to load, silently: say what is happening.
        # Terminals only: captured stderr stays one line per error.
        print(f"loading model {args.model} on {device} ({str(dtype).replace('torch.', '')})...",
              file=sys.stderr, flush=True)
    return source


def _load_model(args, device, dtype):
    """The VideoRouter."""
    from .runtime import VideoRouter
    speed = speed_options(args, device)
    vr = VideoRouter.from_pretrained(args.model, routers=args.routers, device=device,
                                     dtype=dtype, **speed)
    from .runtime.loading import compiled_stages, warmup_line
    if compiled_stages(vr) and stderr_is_tty() and not getattr(args, "json", False):
        # the compile is paid here, at load: say so, as serve does at start-up
        print(f"{PROG}: {warmup_line(vr)}", file=sys.stderr, flush=True)
    return vr


def _answer_question(vr, args, opts, question: str, clip) -> dict:
    """One {"text", "report"}, with the running stage shown on a terminal (vision, router,
    prefill...: seconds of silence otherwise at many frames)."""
    from .telemetry.progress import stage_status
    with stage_status(_show_progress(args)):
        res = vr.answer(clip, question, options=opts)
    return {"text": res.text, "report": dict(res.report)}


def _show_progress(args) -> bool:
    """Bars and stage status: on a terminal, never with --json or --no-progress."""
    return stderr_is_tty() and not getattr(args, "json", False) \
        and not getattr(args, "no_progress", False)


def _demo_title(question: str, out: dict) -> str:
    """One line per demo question: what the model kept at full resolution, and its answer."""
    from .report import frame_rows
    full = [r["frame"] for r in frame_rows(out["report"]) if r["window"] == "1x1"]
    kept = ", ".join(map(str, full)) if full else "none"
    return f"{question} -> {out['text'].strip()!r}; frames at full resolution: {kept}"


def _memory_for_video(args, device) -> Optional[int]:
    """Bytes the decoded frames may take: the machine's free memory less the model's weights
    when they will load into host memory (a CPU run)."""
    from .backbones import PRESETS
    from .video.load import available_memory
    avail = available_memory()
    if avail is None or args.model in PRESETS or str(device) != "cpu":
        return avail
    weights = 0
    from .backbones import resolve_model
    for f in pathlib.Path(resolve_model(args.model)).iterdir():
        if f.suffix in (".safetensors", ".bin") and f.is_file():
            weights += f.stat().st_size
    return max(avail - weights, 0)


# ----------------------------------------------------------------------------- output

def _fmt_num(v, spec=".3f") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return "-"
    return format(v, spec) if isinstance(v, (int, float)) else str(v)


TIMING_ORDER = ("frames", "frames_wait", "vision", "router", "compress", "prefill", "ttft",
                "first_token", "generate")


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
        where = " (CPU, process resident)" if str(report.get("peak_memory_source") or "") \
            .startswith("CPU") else ""
        line += f"   peak memory{where}: {peak / 2**30:.2f} GiB"
    return line


def print_result(out: dict, stream=None) -> None:
    """The answer, the per-frame table and the timings, for people."""
    from .report import frame_rows
    stream = stream or sys.stdout
    report = out["report"]
    rows = frame_rows(report)
    if _use_rich(stream):
        _print_rich(out, rows, stream)
        return
    w = stream.write
    w(f"Answer: {out['text'].strip()}\n\n")
    for line in _summary_lines(report):
        w(line + "\n")
    w(f"\n{'frame':>7} {'time (s)':>9} {'score':>7} {'window':>6} {'tokens':>7}\n")
    for r in rows:
        w(f"{r['frame']:>7} {_fmt_num(r['time_s'], '.2f'):>9} {_fmt_num(r['score'], '.3f'):>7} "
          f"{r['window']:>6} {r['tokens']:>7}\n")
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
    console.print(f"[bold]Answer:[/bold] {out['text'].strip()}\n", markup=True,
                  highlight=False)
    for line in _summary_lines(report):
        console.print(line, markup=False, highlight=False)
    table = Table(show_footer=True)
    for name, just in (("frame", "right"), ("time (s)", "right"), ("score", "right"),
                       ("window", "right"), ("tokens", "right")):
        table.add_column(name, justify=just)
    table.columns[0].footer = "total"
    table.columns[4].footer = str(sum(r["tokens"] for r in rows))
    for r in rows:
        relevant = isinstance(r["score"], (int, float)) and r["score"] > 0.5
        table.add_row(str(r["frame"]), _fmt_num(r["time_s"], ".2f"), _fmt_num(r["score"]),
                      r["window"], str(r["tokens"]), style="bold" if relevant else None)
    console.print(table)
    console.print(_timing_line(report), markup=False, highlight=False)


# ----------------------------------------------------------------------------- main

def main(argv: Optional[list] = None) -> int:
    if argv is None:  # the real command (not a test calling main() in its own process)
        install_interrupt_handler()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["eval"]:
        from .eval.cli import main as eval_main   # its parser imports the eval package
        return eval_main(argv[1:])
    debug = os.environ.get("VIDEOROUTER_DEBUG", "") not in ("", "0")
    if not debug:
        quiet_libraries()
    args = build_parser().parse_args(argv)
    if args.command == "demo" and args.print_sample_path:
        _write_stdout(f"{SAMPLE_VIDEO}\n")
        return 0
    if args.command == "serve":
        from .serve.command import run_serve
        return run_serve(args)
    questions = [args.question] if args.command == "ask" else list(DEMO_QUESTIONS)
    try:
        # With --json stdout carries the JSON object only: anything a library prints goes to
        # stderr instead.
        redirect = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
        with redirect:
            thumbs = _thumbnail_sink(args)
            outs = [run_ask(args, thumbs)] if args.command == "ask" else \
                run_questions(args, questions, thumbs)
            if args.plot:
                _write_plot(args.plot, questions, outs)
            if args.html:
                _write_html(args, questions, outs, thumbs)
    except KeyboardInterrupt:  # main() called in-process, without the handler
        sys.stderr.write(f"{PROG}: interrupted\n")
        return EXIT_INTERRUPTED
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 - the one place that turns errors into exit codes
        fail_with(e, debug)
    if args.json:
        out = outs[0]
        if args.command == "demo":
            out = dict(out, demo=[dict(o, question=q) for q, o in zip(questions, outs)])
        _write_stdout(json.dumps(out, default=jsonable) + "\n")
    else:
        _print_outputs(args, questions, outs)
    return 0


def _write_plot(path: str, questions, outs) -> None:
    """The PNG of ``--plot``, one panel per question. Written under a temporary name and
    renamed: an interrupt never leaves a half-written PNG at the user's path."""
    from .report import plot_reports
    plot = pathlib.Path(path)
    tmp = plot.with_name(f".{plot.stem}.{os.getpid()}.tmp.png")
    titles = None if len(outs) == 1 else [_demo_title(q, o) for q, o in zip(questions, outs)]
    try:
        plot_reports([o["report"] for o in outs], str(tmp), titles=titles)
        os.replace(tmp, plot)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _thumbnail_sink(args):
    """Where --html's thumbnails go: the frames the answers decode, handed over by the
    decoding workers and shrunk when the page is written (None without --html: nothing is
    kept)."""
    if not args.html:
        return None
    from .video.thumbnails import ThumbnailStore
    return ThumbnailStore(max_bytes=None).sink()


def _write_html(args, questions, outs, thumbs) -> None:
    """ask: the one page at --html; demo: a page per question and the index in --html DIR."""
    from .html import write_answer, write_demo
    if args.command == "demo":
        write_demo(args.html, questions, outs, thumbs)
    else:
        write_answer(args.html, questions[0], outs[0], thumbs)


def _print_outputs(args, questions, outs) -> None:
    """The answers for people: each question's table, then (the demo) one line per question."""
    try:
        for i, (q, o) in enumerate(zip(questions, outs)):
            if len(outs) > 1:
                sys.stdout.write(f"{'' if i == 0 else chr(10)}Question: {q}\n")
            print_result(o)
        if len(outs) > 1:
            sys.stdout.write("\n" + "\n".join(_demo_title(q, o)
                                                for q, o in zip(questions, outs)) + "\n")
        if args.plot:
            sys.stdout.write(f"plot: {args.plot}\n")
        if args.html:
            page = os.path.join(args.html, "index.html") if args.command == "demo" else args.html
            sys.stdout.write(f"html: {page}\n")
    except BrokenPipeError:
        _broken_pipe()
    _write_stdout("")


if __name__ == "__main__":
    sys.exit(main())
