"""How every command (``videorouter`` ask/demo, serve, eval) talks to its terminal and exits:
one-line errors and exit statuses (docs/CONTRACT.md section 4), the terminal check, library
chatter kept off stderr, and JSON output. The flags are in cli_args, the input checks in the
stage each one checks. Standard library only at import: ``--help`` and a bad flag stay fast.
"""
from __future__ import annotations

import os
import pathlib
import sys
import warnings

PROG = "videorouter"
EXIT_USAGE = 2     # the user's input is wrong (docs/CONTRACT.md section 4)
EXIT_INTERNAL = 1  # a bug or an environment failure


class UsageError(ValueError):
    """A bad command-line value found after parsing (empty question, bad --plot path...)."""


def fail(message: str, status: int = EXIT_USAGE):
    sys.stderr.write(f"{PROG}: error: {one_line(message)}\n")
    sys.stderr.flush()
    raise SystemExit(status)


def one_line(message: str) -> str:
    return " ".join(str(message).split()) or "unknown error"


def message(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename and e.strerror:
        return f"{e.filename}: {e.strerror}"
    return str(e) or type(e).__name__


def user_errors():
    """The exception types that are the user's to fix: one line and status 2 (a 400 in serve)."""
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


def stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except Exception:
        return False


def quiet_libraries() -> None:
    """Keep library chatter (transformers' warnings, progress bars) off stderr, so a failure is
    exactly one line there; VIDEOROUTER_DEBUG=1 keeps everything."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore")


def jsonable(o):
    """``json.dumps(default=)``: arrays and tensors as lists, numbers as numbers, paths and
    anything else as strings."""
    if hasattr(o, "tolist"):      # numpy arrays/scalars, torch tensors
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    if isinstance(o, pathlib.PurePath):
        return str(o)
    return str(o)
