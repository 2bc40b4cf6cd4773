"""The flags of ``videorouter`` (cli.py), ``videorouter eval`` (eval/cli.py) and ``videorouter
serve`` (serve/), as vLLM's ``entrypoints/openai/cli_args.py`` keeps them: the parser class,
argument types, the answer option flags every command shares (``add_answer_args``, each defined
once), ``--model``'s help, and the options they make (``answer_options``). Nothing here checks
input past what argparse does: each check lives in the stage it checks (backbones, planning,
routing), the one-line errors and exits in cli_io.

The lists in the help (families, presets, policies, scorers) come from the registries' light
names, read when a parser is built: ``--help`` and a bad flag import no torch.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import textwrap

from .cli_io import fail
from .planning.scales import SCALES_HELP
from .video.sampling import MAX_FRAMES, MIN_FRAMES, NUM_FRAMES, Sampling


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's, but a line never breaks inside a hyphenated name (``tiny-qwen3.5-moe``)."""

    def _split_lines(self, text, width):
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage block) and exit status 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):  # noqa: D401 - argparse API
        fail(f"{message} (see '{self.prog} --help')")


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


DTYPES = ("bf16", "fp16", "fp32")
# vr_runtime.video.decoders.DECODERS and SEEKS, which import PyAV and numpy (a third of a second
# before a bad flag could be refused); tests/runtime/test_cli_help.py holds them equal.
DECODERS = ("auto", "pyav", "decord", "torchcodec")
SEEKS = ("exact", "keyframe")
MAX_FRAME_PIXELS = 7680 * 4320         # 8K UHD: --max-frame-pixels' default


def model_help() -> str:
    """``--model``'s help: the registered families and presets (vr_runtime.backbones, whose
    tables import no torch), so a new one shows without editing the help."""
    from .backbones import PRESETS, families
    presets = ", ".join(f"'{p}'" for p in PRESETS)
    return (f"a local checkpoint directory of a supported family -- config.json's model_type "
            f"one of {families()} -- or a Hugging Face id already in the local cache "
            f"(OpenGVLab/InternVL3-1B-hf; nothing is downloaded), or a preset: {presets} ('tiny' "
            f"is the embedded demo model with trained weights, the others random weights)")


def _policy_help() -> str:
    """``--policy``'s help: every name it accepts (vr_runtime.planning.names)."""
    from .planning.names import MORE_POLICIES, PAPER_POLICIES
    return (f"one of {', '.join(PAPER_POLICIES)}: auto lets the Semantic Router choose global or "
            f"fragment; dense, budget and uniform are the paper's baselines; beyond the paper: "
            f"{', '.join(MORE_POLICIES)} (default: auto)")


def positive_int(name: str):
    """An argparse ``type=`` for an integer >= 1 (``name``: the flag, for its messages)."""
    return arg_type(int, lambda v: v >= 1, "an integer >= 1", name)


def long_prompt_arg(text: str):
    """``--long-prompt``: ``auto`` or a frame count >= 1."""
    if text == "auto":
        return text
    return positive_int("--long-prompt")(text)


positive_seconds = arg_type(float, lambda v: 0 < v < float("inf"), "a number of seconds > 0",
                            "--ttft-budget")

# Every answer option flag of ask, demo, serve and eval, defined once: the flag's add_argument
# keywords, in --help order. A command takes the ones it has (``add_answer_args``'s ``flags``)
# and may change a default or a help text (``overrides``).
ANSWER_FLAGS = {
    "--frames": lambda: dict(
        type=positive_int("--frames"), default=NUM_FRAMES, metavar="N",
        help="frames to sample: the middle frame of each of N equal segments of the video (the "
             "paper's sampling, used for every backbone; --fps samples by rate instead) "
             f"(default: {NUM_FRAMES})"),
    "--fps": lambda: dict(
        type=arg_type(float, lambda v: 0 < v < float("inf"), "frames a second > 0", "--fps"),
        default=None, metavar="F",
        help="sample by rate instead of --frames: F frames a second, evenly spread (Qwen2.5-VL "
             "and Qwen3-VL's sampling; their processors use 2), between --min-frames and "
             "--max-frames (default: off, the paper's --frames segment sampling)"),
    "--min-frames": lambda: dict(
        type=positive_int("--min-frames"), default=MIN_FRAMES, metavar="N",
        help=f"with --fps: sample at least N frames (default: {MIN_FRAMES})"),
    "--max-frames": lambda: dict(
        type=positive_int("--max-frames"), default=MAX_FRAMES, metavar="N",
        help=f"with --fps: sample at most N frames (default: {MAX_FRAMES})"),
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
    # The accepted set is checked after parsing (planning.policies.check_policy): the planners
    # import torch, which --help and a bad flag should not wait for.
    "--policy": lambda: dict(default="auto", metavar="POLICY", help=_policy_help()),
    "--scales": lambda: dict(type=scales_arg, default=None, metavar="S_G,S_1,S_0|auto",
                             help=SCALES_HELP),
    "--long-prompt": lambda: dict(
        default=None, metavar="auto|N", type=long_prompt_arg,
        help="beyond the paper: with more frames than the backbone was trained on, keep the "
             "relevant frames at full resolution plus a coverage set spread in time, at most "
             "that many frames in the prompt (auto: the backbone's own figure) (default: off)"),
    "--neighbour-window": lambda: dict(
        type=positive_int("--neighbour-window"), default=None, metavar="S",
        help="with --long-prompt: pool the relevant frames' neighbours SxS (default: none)"),
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


def sampling_of(args) -> Sampling:
    """Which frames parsed ask/demo arguments read (a flag the command lacks: the default)."""
    d = Sampling()
    return Sampling(args.frames, getattr(args, "time_window", None), getattr(args, "fps", None),
                    getattr(args, "min_frames", d.min_frames),
                    getattr(args, "max_frames", d.max_frames),
                    getattr(args, "decoder", d.decoder), getattr(args, "seek", d.seek))


def answer_options(args, **extra):
    """The :class:`~vr_runtime.request.AnswerOptions` of parsed ask/demo arguments (a flag the
    command lacks takes AnswerOptions' default; no --scales, the paper's); ``extra``: fields set
    apart (the scorer, which needs the model's device). --scales auto is resolved per request,
    from its visual budget."""
    from .planning.scales import parse_scales
    from .request import AnswerOptions
    return AnswerOptions(**dataclasses.asdict(sampling_of(args)), max_length=args.max_length,
                         scales=getattr(args, "scales", None) or parse_scales(None),
                         max_new_tokens=args.max_new_tokens, policy=args.policy,
                         ttft_budget_s=getattr(args, "ttft_budget", None) or None,
                         allow_over_length=bool(getattr(args, "allow_over_length", False)),
                         long_prompt=getattr(args, "long_prompt", None),
                         neighbour_window=getattr(args, "neighbour_window", None),
                         **extra)


def add_scorer_args(p) -> None:
    """``--scorer NAME`` and ``--scorer-model DIR`` (ask, serve, eval): which registered frame
    scorer the relevance policies use (vr_runtime.routing.scorers.register_scorer)."""
    from .routing.names import DEFAULT_SCORER, SCORER_NAMES
    named = ", ".join(f"{name} ({what})" for name, what in SCORER_NAMES.items())
    p.add_argument("--scorer", default=DEFAULT_SCORER, metavar="NAME",
                   help=f"frame scorer of the relevance policies (fragment, auto's Fragment): "
                        f"{named}, or a registered one (default: {DEFAULT_SCORER})")
    p.add_argument("--scorer-model", default=None, metavar="DIR",
                   help="the scorer's model directory, for scorers that load one (clip, "
                        "clip-fill: a local CLIPModel or SiglipModel directory)")


# Load-time speed options of ask and serve (written out here: --help must not import torch;
# tests/runtime/test_cli.py checks them against vr_runtime.generate and backbones.compiled).
DECODING_CHOICES = ("auto", "dynamic", "static", "compiled", "graph")
COMPILE_CHOICES = ("auto", "off", "inductor", "max-autotune", "cudagraphs")


def add_speed_args(p) -> None:
    """``--decoding``, ``--vision-compile``, ``--router-compile`` and ``--compile-cache``: how
    the model's stages run (the same answers; docs/options.md). Compiled stages are compiled at
    load, before the first request."""
    p.add_argument("--decoding", choices=DECODING_CHOICES, default="auto",
                   help="decode steps after the first token: dynamic (eager, growing cache), "
                        "static (eager, preallocated cache), compiled (static, inductor), graph "
                        "(compiled + CUDA graphs; CUDA only); auto: the device's measured "
                        "default (default: auto)")
    for stage, what in (("vision", "the vision tower and projector, on fixed chunks of frames"),
                        ("router", "the Image Router's shadow stack, on fixed chunks of frames "
                                   "and question lengths")):
        p.add_argument(f"--{stage}-compile", choices=COMPILE_CHOICES, default="auto",
                       help=f"run {what}: off (eager), inductor, max-autotune, cudagraphs "
                            f"(inductor + CUDA graphs; CUDA only); auto: the device's measured "
                            f"default (default: auto)")
    p.add_argument("--compile-cache", default=None, metavar="DIR",
                   help="keep torch.compile's caches in DIR, so that a later process starts "
                        "warm (default: ~/.cache/videorouter/compile, used only when a stage "
                        "is compiled)")


def speed_options(args, device) -> dict:
    """``VideoRouter`` keywords of the speed flags (a command without them: the defaults),
    checked against ``device`` before the model loads (CUDA graphs on a CPU: one line)."""
    from .backbones.compiled import CompileOptions, resolve_compile
    from .generate import resolve_decoding
    resolve_decoding(getattr(args, "decoding", "auto"), device)
    for stage in ("vision", "router"):
        resolve_compile(getattr(args, f"{stage}_compile", "auto"), device, f"--{stage}-compile")
    return {"decoding": getattr(args, "decoding", "auto"),
            "compile": CompileOptions(vision=getattr(args, "vision_compile", "auto"),
                                      router=getattr(args, "router_compile", "auto"),
                                      cache_dir=getattr(args, "compile_cache", None))}
