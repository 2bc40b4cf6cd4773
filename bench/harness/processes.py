"""The same benchmark in fresh processes, one after another.

A process's caches, allocator, compiled kernels and clocks are its own, so the spread of a
figure across fresh processes is its real uncertainty (two processes of one session once timed
the same kernel at 0.057 and 0.175 ms). A benchmark states the command line of each process;
here they are run, their results read back, and their rows merged.
"""
from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List, Sequence, Tuple

from bench.harness.timing import spread

ROOT = pathlib.Path(__file__).resolve().parents[2]


def child_command(module: str, argv: Sequence[str]) -> List[str]:
    """One fresh process's command: this interpreter running ``module`` with ``argv``."""
    return [sys.executable, "-m", module, *argv]


def run_child(cmd: List[str]) -> int:
    """Run one fresh process from the repository root (where ``-m bench...`` resolves); its
    exit status."""
    return subprocess.run(cmd, cwd=ROOT).returncode


def run_processes(module: str, children: Sequence[Tuple[str, Sequence[str]]], *,
                  out_flag: str = "--out") -> List[Dict]:
    """Run ``python -m module ARGV OUT_FLAG FILE`` for each ``(label, ARGV)`` of ``children`` in
    turn, each in a fresh process; the JSON each wrote, in order. A process that fails stops
    the run with one line naming it (``label``)."""
    name = module.rsplit(".", 1)[-1]
    payloads = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, argv) in enumerate(children, 1):
            path = os.path.join(tmp, f"process{i}.json")
            cmd = child_command(module, [*argv, out_flag, path])
            print(f"== {label}: {' '.join(cmd)}", flush=True)
            rc = run_child(cmd)
            if rc != 0:
                raise SystemExit(f"{name}: {label} failed (exit {rc}); see its output above")
            with open(path) as f:
                payloads.append(json.load(f))
    return payloads


def merge_rows(rows: Sequence[Dict], key: Sequence[str], *, value: str = "median_ms",
               per_process: str = "per_process_ms", medians: Sequence[str] = (),
               drop: Sequence[str] = ()) -> List[Dict]:
    """One row per ``key`` over the rows of several processes (in process order): the first
    process's row less ``drop``, with ``value`` the median of the processes' figures, each
    figure in ``per_process``, their ``spread`` (max/min - 1) and ``processes``; each field of
    ``medians`` is the median of the processes that have it."""
    keyed: Dict[tuple, List[Dict]] = {}
    for r in rows:
        keyed.setdefault(tuple(r[k] for k in key), []).append(r)
    merged = []
    for rs in keyed.values():
        per = [r[value] for r in rs]
        row = {k: v for k, v in rs[0].items() if k not in drop}
        row.update({value: statistics.median(per), per_process: per, "processes": len(rs),
                    "spread": spread(per)})
        for m in medians:
            got = [r[m] for r in rs if r.get(m) is not None]
            row[m] = statistics.median(got) if got else None
        merged.append(row)
    return merged
