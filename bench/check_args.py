"""Check a benchmark's command line as the GPU run will parse it, without running anything.

    python3 -m bench.check_args bench.scripts.bench_e2e --runs 3 --decoding graph ...

Device time is scarce: a typo in a flag must fail here, on CPU, not in the first minute on a
GPU. Each script is imported and its own argument parsing runs on the exact arguments
(validation after argparse included); the benchmark itself never starts. CUDA is reported as
available while parsing, so the defaults and checks are those of the GPU run (bench_decode
refuses graph modes on a CPU). Exit 0 and one line ``ok SCRIPT``, or argparse's exit 2 and its
one-line message.

    python3 -m bench.check_args --stages WORK

checks every stage bench/gpu_run.sh --dry-run queued (``WORK/logs/<stage>.cmd``, its argv
NUL-separated) in one process, the pytest stages by collecting their tests, and writes
``WORK/check.tsv`` (stage, ok or bad, message); exit 2 if any is bad.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import os
import subprocess
import sys
from typing import Callable, Dict, List

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
PACKAGE = "bench.scripts"


class _Parsed(Exception):
    """Raised where a script's parsing ends and its work would begin."""


def _stop(*_a, **_k):
    raise _Parsed()


def _call(name: str) -> Callable:
    """A script whose parsing is one function of its own: call it."""
    return lambda mod, argv: getattr(mod, name)(argv)


def _main_until(*stops: str) -> Callable:
    """A script that parses inside ``main``: the functions it calls once the arguments are
    checked are replaced by a stop, then ``main`` runs."""
    def run(mod, argv):
        for s in stops:
            setattr(mod, s, _stop)
        mod.main(argv)
    return run


# How each benchmark the GPU run starts is parsed without running (a script missing here is
# refused: a new stage must say how its arguments are checked).
PARSERS: Dict[str, Callable] = {
    "bench_e2e": _call("parse_args"),
    "bench_cold_start": _call("parse_args"),
    "bench_decode": _call("parse"),
    "bench_pool_pack": _main_until("in_processes", "cpu_vs_compile", "has_cuda"),
    "bench_video": _call("parse_any"),
    "bench_fast_path": _call("parse"),
    "bench_train": _call("parse"),
}


def script_name(script: str) -> str:
    """The benchmark's name from its module (``bench.scripts.bench_e2e``) or its file
    (``bench/scripts/bench_e2e.py``)."""
    return script.rsplit(".", 1)[-1] if script.startswith(PACKAGE + ".") else \
        os.path.basename(script).removesuffix(".py")


def check(script: str, argv: List[str]) -> None:
    """Parse ``argv`` as ``script`` would; raises SystemExit(2) with argparse's message."""
    name = script_name(script)
    if name not in PARSERS:
        sys.exit(f"check_args: no argument check for {script}; add it to PARSERS in "
                 f"bench/check_args.py")
    if not os.path.isfile(os.path.join(SCRIPTS, name + ".py")):
        sys.exit(f"check_args: {script}: no such benchmark in bench/scripts/")
    import torch
    real = torch.cuda.is_available
    # Parse as on the GPU (defaults, graph modes); put back after, so that a test process
    # that checked a command still sees its own device.
    torch.cuda.is_available = lambda: True
    try:
        PARSERS[name](importlib.import_module(f"{PACKAGE}.{name}"), list(argv))
    except _Parsed:
        pass
    finally:
        torch.cuda.is_available = real


def check_command(argv: List[str]) -> str:
    """'' when ``argv`` (a stage's command, ``python3 -m bench.scripts.X ...`` or ``python3 -m
    pytest ...``) parses, else the one-line reason."""
    if argv[:3] == ["python3", "-m", "pytest"]:
        # collected in a process of its own: the tests must see the real CUDA answer
        r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", *argv[3:]],
                           capture_output=True, text=True)
        if r.returncode == 0:
            return ""
        lines = (r.stdout + r.stderr).strip().splitlines()
        return "pytest cannot collect: " + (lines[-1] if lines else f"rc={r.returncode}")
    if len(argv) < 3 or argv[:2] != ["python3", "-m"] or not argv[2].startswith(PACKAGE + "."):
        return f"not a 'python3 -m {PACKAGE}.SCRIPT ...' command: {' '.join(argv)[:120]}"
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            check(argv[2], argv[3:])
    except SystemExit as e:
        if e.code not in (0, None):
            lines = err.getvalue().strip().splitlines() or [str(e.code)]
            return lines[-1]
    return ""


def check_stages(work: str) -> int:
    """Every ``WORK/logs/<stage>.cmd`` in stages.tsv's order; ``WORK/check.tsv`` written."""
    with open(os.path.join(work, "stages.tsv")) as f:
        names = [line.split("\t", 1)[0] for line in f if line.strip()]
    bad = 0
    rows = []
    for name in names:
        with open(os.path.join(work, "logs", f"{name}.cmd")) as f:
            argv = [a for a in f.read().split("\0") if a]
        why = check_command(argv)
        bad += bool(why)
        rows.append(f"{name}\t{'bad' if why else 'ok'}\t{why}")
        print(f"{name}: {'BAD ARGUMENTS: ' + why if why else 'arguments ok'}", flush=True)
    with open(os.path.join(work, "check.tsv"), "w") as f:
        f.write("\n".join(rows) + "\n")
    return 2 if bad else 0


def main(argv: List[str] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--stages"] and len(argv) == 2:
        return check_stages(argv[1])
    if not argv or argv[0].startswith("-"):
        sys.exit("usage: python3 -m bench.check_args bench.scripts.SCRIPT [ARGS ...]  |  "
                 "--stages WORK")
    check(argv[0], argv[1:])
    print(f"ok {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
