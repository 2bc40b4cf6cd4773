"""Command-line helpers shared by ``videorouter`` (cli.py), ``videorouter eval`` (eval/cli.py)
and ``videorouter serve`` (serve/): one-line usage errors and exit statuses, argument types,
the answer option flags every command shares (``add_answer_args``, each defined once) and the
options they make (``answer_options``), the ask/serve input checks, device choice and JSON
output. It imports no subcommand, so every
command can import it without an import circle; heavy modules (torch, the planners) are
imported inside the functions that need them, so ``--help`` and a bad flag stay fast.
"""
from __future__ import annotations

import argparse
import math
import os
import pathlib
import sys
import warnings

from .planning.scales import SCALES_HELP  # noqa: F401  (re-exported for the commands' --help; stdlib only)

PROG = "videorouter"
EXIT_USAGE = 2     # the user's input is wrong (docs/CONTRACT.md section 4)
EXIT_INTERNAL = 1  # a bug or an environment failure


class UsageError(ValueError):
    """A bad command-line value found after parsing (empty question, bad --plot path...)."""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage block) and exit status 2."""

    def error(self, message):  # noqa: D401 - argparse API
        fail(f"{message} (see '{self.prog} --help')")


def fail(message: str, status: int = EXIT_USAGE):
    sys.stderr.write(f"{PROG}: error: {one_line(message)}\n")
    sys.stderr.flush()
    raise SystemExit(status)


def one_line(message: str) -> str:
    return " ".join(str(message).split()) or "unknown error"


def _seconds(text: str) -> float:
    """Seconds as S, M:SS or H:MM:SS (fractions allowed in the last part)."""
    parts = text.strip().split(":")
    if not 1 <= len(parts) <= 3 or any(not p.strip() for p in parts):
        raise ValueError(text)
    v = 0.0
    for p in parts:
        v = v * 60 + float(p)
    if not math.isfinite(v) or v < 0:
        raise ValueError(text)
    return v


def time_window_arg(text: str) -> tuple:
    """``--time-window START,END``: seconds (or M:SS / H:MM:SS) from the start of the video."""
    try:
        start, end = (_seconds(x) for x in str(text).split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected START,END in seconds (or M:SS / H:MM:SS), e.g. 600,900 or 10:00,15:00; "
            f"got {text!r}") from None
    if start >= end:
        raise argparse.ArgumentTypeError(f"START must be before END, got {text!r}")
    return (start, end)


def arg_type(convert, ok, what: str, name: str = ""):
    """An argparse ``type=``: ``convert(text)`` that passes ``ok``, else one line saying what
    was expected (``name`` is how argparse's messages refer to it)."""
    def parse(text):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
        return value
    if name:
        parse.__name__ = name
    return parse


def scales_arg(text):
    """``--scales``: checked at parse time, one line for a bad value (vr_runtime.planning.scales)."""
    from .planning.scales import parse_scales
    try:
        return parse_scales(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).replace("--scales ", "", 1))


scales_arg.__name__ = "--scales"


# Shown in --help; the accepted set is vr_runtime.planning.policies.policy_names(), checked after
# parsing (importing the planners pulls in torch, which --help and a bad flag should not wait for).
POLICY_HELP = "auto|global|fragment|dense|budget|uniform"
DTYPES = ("bf16", "fp16", "fp32")
DECODERS = ("auto", "pyav", "decord", "torchcodec")  # vr_runtime.video.decoders.DECODERS (not imported: heavy)
SEEKS = ("exact", "keyframe")          # vr_runtime.video.decoders.SEEKS
MAX_FRAME_PIXELS = 7680 * 4320         # 8K UHD: --max-frame-pixels' default


def positive_int(name: str):
    """An argparse ``type=`` for an integer >= 1 (``name``: the flag, for its messages)."""
    return arg_type(int, lambda v: v >= 1, "an integer >= 1", name)


positive_seconds = arg_type(float, lambda v: 0 < v < float("inf"), "a number of seconds > 0",
                            "--ttft-budget")

# Every answer option flag of ask, demo, serve and eval, defined once: the flag's add_argument
# keywords, in --help order. A command takes the ones it has (``add_answer_args``'s ``flags``)
# and may change a default or a help text (``overrides``).
ANSWER_FLAGS = {
    "--frames": lambda: dict(
        type=positive_int("--frames"), default=64,
        help="frames to sample, spread evenly over the video (InternVL's segment sampling, the "
             "paper's; for every backbone) (default: 64)"),
    "--fps": lambda: dict(
        type=arg_type(float, lambda v: 0 < v < float("inf"), "frames a second > 0", "--fps"),
        default=None, metavar="F",
        help="sample by rate instead of --frames: F frames a second, evenly spread (Qwen2.5-VL "
             "and Qwen3-VL's sampling; their processors use 2), between --min-frames and "
             "--max-frames (default: off, the paper's --frames segment sampling)"),
    "--min-frames": lambda: dict(
        type=positive_int("--min-frames"), default=4, metavar="N",
        help="with --fps: sample at least N frames (default: 4)"),
    "--max-frames": lambda: dict(
        type=positive_int("--max-frames"), default=768, metavar="N",
        help="with --fps: sample at most N frames (default: 768)"),
    "--max-length": lambda: dict(
        type=positive_int("--max-length"), default=12288,
        help="context length L_max in tokens (default: 12288)"),
    "--max-new-tokens": lambda: dict(
        type=positive_int("--max-new-tokens"), default=64,
        help="tokens to generate at most (default: 64)"),
    "--ttft-budget": lambda: dict(
        type=positive_seconds, default=None, metavar="SECONDS",
        help="beyond the paper: the largest visual budget whose predicted time to first token "
             "on this device fits SECONDS (cost model corrected by measured stage times; the "
             "report gives the prediction)"),
    "--policy": lambda: dict(
        default="auto", metavar=POLICY_HELP,
        help="auto lets the Semantic Router choose global or fragment; dense, budget and "
             "uniform are the baselines (default: auto)"),
    "--scales": lambda: dict(type=scales_arg, default=None, metavar="S_G,S_1,S_0|auto",
                             help=SCALES_HELP),
    "--allow-over-length": lambda: dict(
        action="store_true",
        help="let an unbudgeted policy (dense) make a prompt longer than --max-length (refused "
             "by default; the model's own context is never exceeded)"),
    "--scorer": None,   # --scorer and --scorer-model: add_scorer_args
    "--max-frame-pixels": lambda: dict(
        type=positive_int("--max-frame-pixels"), default=MAX_FRAME_PIXELS, metavar="N",
        help="refuse a video whose frames (a GIF's logical screen) are larger than N pixels, "
             "before decoding (default: 33177600, 8K UHD)"),
    "--decoder": lambda: dict(
        choices=DECODERS, default="auto",
        help="video decoding library: auto uses decord where it handles the codec and PyAV "
             "(FFmpeg) for everything else and as the fallback; with several --decode-workers, "
             "PyAV; torchcodec: NVDEC on a GPU (when installed) (default: auto)"),
    "--seek": lambda: dict(
        choices=SEEKS, default="exact",
        help="exact decodes the sampled frames themselves (the paper's setting); keyframe takes "
             "the keyframe nearest each sampled time, decoding one frame a sample (much faster "
             "on long videos; each frame at most half a keyframe interval from the exact one; "
             "the report gives the true times) (default: exact)"),
    "--time-window": lambda: dict(
        type=time_window_arg, default=None, metavar="START,END",
        help="sample the frames from this part of the video only, in seconds (or M:SS / "
             "H:MM:SS) from its start, e.g. 600,900"),
    "--decode-workers": lambda: dict(
        type=positive_int("--decode-workers"), default=None, metavar="N",
        help="parallel exact decoders, each on its own share of the video's keyframe intervals "
             "(default: the cores this process may use, a cgroup CPU quota included)"),
    "--device": lambda: dict(choices=("cpu", "cuda"), default=None,
                             help="default: cuda if available, else cpu"),
    "--dtype": lambda: dict(choices=DTYPES, default=None,
                            help="default: bf16 on cuda, fp32 on cpu"),
}


def add_answer_args(p, flags=tuple(ANSWER_FLAGS), overrides=None) -> None:
    """Add the answer option flags ``flags`` (all of ``ANSWER_FLAGS``, ask's set, by default) to
    parser ``p``; ``overrides`` maps a flag to the add_argument keywords that differ for this
    command (serve's defaults are those of a request that gives none, so its help says so)."""
    overrides = overrides or {}
    unknown = set(flags) - set(ANSWER_FLAGS)
    if unknown:
        raise ValueError(f"add_answer_args: unknown flags {sorted(unknown)}")
    for flag in ANSWER_FLAGS:   # ANSWER_FLAGS' order, whatever the order of ``flags``
        if flag not in flags:
            continue
        if flag == "--scorer":
            add_scorer_args(p)
            continue
        p.add_argument(flag, **{**ANSWER_FLAGS[flag](), **overrides.get(flag, {})})


def answer_options(args, **extra):
    """The :class:`~vr_runtime.request.AnswerOptions` of parsed ask/demo arguments (a flag the
    command lacks takes AnswerOptions' default; no --scales, the paper's); ``extra``: fields set
    apart (the scorer, which needs the model's device). --scales auto is resolved per request,
    from its visual budget."""
    from .planning.scales import parse_scales
    from .request import AnswerOptions
    return AnswerOptions(num_frames=args.frames, max_length=args.max_length,
                         scales=getattr(args, "scales", None) or parse_scales(None),
                         max_new_tokens=args.max_new_tokens, policy=args.policy,
                         ttft_budget_s=getattr(args, "ttft_budget", None) or None,
                         time_window=getattr(args, "time_window", None),
                         fps=getattr(args, "fps", None),
                         min_frames=getattr(args, "min_frames", 4),
                         max_frames=getattr(args, "max_frames", 768),
                         seek=getattr(args, "seek", "exact"),
                         decoder=getattr(args, "decoder", "auto"),
                         allow_over_length=bool(getattr(args, "allow_over_length", False)),
                         **extra)


def add_scorer_args(p) -> None:
    """``--scorer NAME`` and ``--scorer-model DIR`` (ask, serve, eval): which registered frame
    scorer the relevance policies use (vr_runtime.routing.scorers.register_scorer)."""
    p.add_argument("--scorer", default="image-router", metavar="NAME",
                   help="frame scorer of the relevance policies (fragment, auto's Fragment): "
                        "image-router (the paper's Image Router), clip (CLIP relevance pooling, "
                        "token-matched), clip-fill, or a registered one (default: image-router)")
    p.add_argument("--scorer-model", default=None, metavar="DIR",
                   help="the scorer's model directory, for scorers that load one (clip, "
                        "clip-fill: a local CLIPModel or SiglipModel directory)")


def check_scorer_args(scorer, scorer_model=None) -> None:
    """``--scorer``/``--scorer-model``, checked before any model loads (one line each).
    ``check_scorer_args(args)`` with a parsed namespace is the deprecated form."""
    if not isinstance(scorer, str) and hasattr(scorer, "scorer"):
        warnings.warn("check_scorer_args(args) is deprecated; pass the values: "
                      "check_scorer_args(scorer, scorer_model)", DeprecationWarning,
                      stacklevel=2)
        scorer, scorer_model = scorer.scorer, getattr(scorer, "scorer_model", None)
    from .errors import ModelFilesError
    from .routing.scorers import check_scorer
    try:
        check_scorer(scorer, scorer_model)
    except ModelFilesError:
        raise
    except ValueError as e:
        raise UsageError(str(e)) from None


def check_inputs(_args=None, /, *, question: str = "", policy: str = "auto", model: str = "tiny",
                 routers=None, plot=None, scorer=None, scorer_model=None) -> None:
    """Everything about a question that can be checked without loading a model: the question,
    the --plot path, --policy, --scorer, --model and --routers (one line each).

    ``check_inputs(args)`` with a parsed namespace is the deprecated form of the keywords."""
    if _args is not None:
        warnings.warn("check_inputs(args) is deprecated; pass the values as keywords: "
                      "check_inputs(question=..., policy=..., model=..., routers=..., plot=..., "
                      "scorer=..., scorer_model=...)", DeprecationWarning, stacklevel=2)
        return check_inputs(question=_args.question, policy=_args.policy, model=_args.model,
                            routers=_args.routers, plot=getattr(_args, "plot", None),
                            scorer=getattr(_args, "scorer", None),
                            scorer_model=getattr(_args, "scorer_model", None))
    if not question.strip():
        raise UsageError("QUESTION is empty; ask something about the video")
    if plot is not None:
        _check_plot(plot)
    from .planning.policies import policy_names
    if policy not in policy_names():
        from .errors import expected_one_of
        raise UsageError(f"--policy {policy!r}: {expected_one_of(policy, policy_names())}")
    if scorer is not None:
        check_scorer_args(scorer, scorer_model)
    _check_model_files(model, routers)


def _check_plot(plot: str) -> None:
    path = pathlib.Path(plot)
    if path.suffix.lower() != ".png":
        raise UsageError(f"--plot {plot!r}: expected a file name ending in .png")
    parent = path.parent if str(path.parent) else pathlib.Path(".")
    if not parent.is_dir():
        raise UsageError(f"--plot {plot!r}: directory {str(parent)!r} does not exist")


def _check_model_files(model: str, routers) -> None:
    from .backbones import resolve_model
    from .errors import ModelFilesError, RouterWeightsError
    try:
        resolve_model(model)   # a preset, a directory, or a Hub id in the local HF cache
    except ModelFilesError as e:
        raise ModelFilesError(f"--{e}") from None   # "model 'X': ..." -> "--model 'X': ..."
    if routers is not None and not pathlib.Path(routers).is_file():
        raise RouterWeightsError(f"--routers {routers!r}: no such file")


def device_dtype(device=None, dtype=None):
    """Resolve --device/--dtype now: asking for CUDA on a machine without it fails fast. None:
    CUDA when there is one, else the CPU; the device's default dtype.

    ``device_dtype(args)`` with a parsed namespace is the deprecated form."""
    if device is not None and not isinstance(device, str) and hasattr(device, "dtype"):
        warnings.warn("device_dtype(args) is deprecated; pass the values: "
                      "device_dtype(device, dtype)", DeprecationWarning, stacklevel=2)
        device, dtype = device.device, device.dtype
    import torch
    from .backbones.devices import resolve_device, resolve_dtype
    dev = resolve_device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return dev, resolve_dtype(dtype, dev)


def stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except Exception:
        return False


def jsonable(o):
    if hasattr(o, "tolist"):      # numpy arrays/scalars, torch tensors
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    if isinstance(o, pathlib.PurePath):
        return str(o)
    return str(o)


def user_errors():
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


def quiet_libraries() -> None:
    """Keep library chatter (transformers' warnings, progress bars) off stderr, so a failure is
    exactly one line there; VIDEOROUTER_DEBUG=1 keeps everything."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore")


def fail_with(e: Exception, debug: bool):
    """Exit on an exception as every subcommand does: the user's mistakes (``user_errors``)
    one line and status 2, anything else one line with a hint and status 1; with
    VIDEOROUTER_DEBUG set, the traceback instead."""
    if debug:
        raise e
    if isinstance(e, user_errors()):
        fail(message(e), EXIT_USAGE)
    fail(f"internal error: {type(e).__name__}: {message(e)} (rerun with "
          f"VIDEOROUTER_DEBUG=1 for the traceback)", EXIT_INTERNAL)


def message(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename and e.strerror:
        return f"{e.filename}: {e.strerror}"
    return str(e) or type(e).__name__
