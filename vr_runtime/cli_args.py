"""Command-line helpers shared by ``videorouter`` (cli.py), ``videorouter eval`` (eval/cli.py)
and ``videorouter serve`` (serve/): one-line usage errors and exit statuses, argument types,
the ask/serve input checks, device choice and JSON output. It imports no subcommand, so every
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


def check_scorer_args(args) -> None:
    """``--scorer``/``--scorer-model``, checked before any model loads (one line each)."""
    from .errors import ModelFilesError
    from .routing.scorers import check_scorer
    try:
        check_scorer(args.scorer, getattr(args, "scorer_model", None))
    except ModelFilesError:
        raise
    except ValueError as e:
        raise UsageError(str(e)) from None


def check_inputs(args) -> None:
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
    from .planning.policies import policy_names
    if args.policy not in policy_names():
        from .errors import expected_one_of
        raise UsageError(f"--policy {args.policy!r}: "
                         f"{expected_one_of(args.policy, policy_names())}")
    if getattr(args, "scorer", None) is not None:
        check_scorer_args(args)
    from .backbones import resolve_model
    from .errors import ModelFilesError, RouterWeightsError
    try:
        resolve_model(args.model)   # a preset, a directory, or a Hub id in the local HF cache
    except ModelFilesError as e:
        raise ModelFilesError(f"--{e}") from None   # "model 'X': ..." -> "--model 'X': ..."
    if args.routers is not None:
        r = pathlib.Path(args.routers)
        if not r.is_file():
            raise RouterWeightsError(f"--routers {args.routers!r}: no such file")


def device_dtype(args):
    """Resolve --device/--dtype now: asking for CUDA on a machine without it fails fast."""
    import torch
    from .backbones.devices import resolve_device, resolve_dtype
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dev = resolve_device(device)
    dtype = resolve_dtype(args.dtype, dev)
    return dev, dtype


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
