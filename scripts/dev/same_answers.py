"""Same answers before and after a refactor: ``demo --json`` and ``ask --json`` at two policies,
run from two commits of this repository in fresh processes, compared field by field.

    python scripts/dev/same_answers.py BEFORE [AFTER] [--out FILE.md]

BEFORE and AFTER are git revisions (AFTER defaults to HEAD); each is checked out in a temporary
``git worktree`` and imported from there (``PYTHONPATH``), so the editable install of the
working tree plays no part. Both trees answer with BEFORE's shipped tiny weights (AFTER's are
replaced by BEFORE's in its worktree): the check is about the code, not the weights.

A report is "the same" when, after the documented renames of docs/CONTRACT.md ("Renamed names":
``RENAMES`` below), the answer text, every report value but wall times, and the set of timing
stages are equal. Timing stages may only be renamed; the values of ``timings_s``, other wall
times and peak memory differ from run to run and are not compared. Exit 0 when every command is
the same, 1 otherwise; ``--out`` writes the table as markdown.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Tuple

# docs/CONTRACT.md's renamed keys of the JSON output: old -> new.
TOP_RENAMES = {"answer": "text"}
REPORT_RENAMES = {"scales": "windows"}
TIMING_RENAMES = {"decode": "frames"}
# Timing stages that AFTER may add (documented with their renames), and measurements that differ
# from run to run (wall times, the process's peak memory).
NEW_TIMINGS = {"frames_wait", "first_token"}
MEASURED = {"timings_s", "ttft_s", "wall_s", "tokens_per_s", "peak_memory_bytes",
            "peak_activation_bytes"}
NEW_REPORT_KEYS = {"frames_dropped"}

RED = "What shape is the red object?"
COMMANDS: List[Tuple[str, List[str]]] = [
    ("demo --json", ["demo", "--json"]),
    ("ask fragment", ["ask", "{sample}", RED, "--policy", "fragment", "--json"]),
    ("ask global", ["ask", "{sample}", RED, "--policy", "global", "--json"]),
]
WEIGHTS = ("vr_runtime/assets/tiny/model.safetensors", "vr_runtime/assets/tiny/routers.safetensors")


def git(*args: str, cwd: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


def worktree(repo: str, rev: str, root: str, weights_from: str) -> str:
    """``rev`` checked out under ``root`` with ``weights_from``'s tiny weights."""
    path = os.path.join(root, rev.replace("/", "_"))
    git("worktree", "add", "--detach", path, rev, cwd=repo)
    for name in WEIGHTS:
        blob = subprocess.run(["git", "show", f"{weights_from}:{name}"], cwd=repo, check=True,
                              capture_output=True).stdout
        with open(os.path.join(path, name), "wb") as f:
            f.write(blob)
    return path


def run_cli(tree: str, argv: List[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=tree, VIDEOROUTER_DEBUG="0")
    env.pop("TRITON_INTERPRET", None)
    p = subprocess.run([sys.executable, "-m", "vr_runtime.cli", *argv], cwd=tree, env=env,
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{tree}: vr_runtime.cli {' '.join(argv)} exited {p.returncode}: "
                           f"{p.stderr.strip().splitlines()[-1:]}")
    return json.loads(p.stdout)


def sample_path(tree: str) -> str:
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run([sys.executable, "-m", "vr_runtime.cli", "demo", "--print-sample-path"],
                         cwd=tree, env=env, check=True, capture_output=True, text=True).stdout
    return out.strip()


def renamed(out: dict) -> dict:
    """BEFORE's output under AFTER's names."""
    out = {TOP_RENAMES.get(k, k): v for k, v in out.items()}
    rep = {REPORT_RENAMES.get(k, k): v for k, v in out.get("report", {}).items()}
    if isinstance(rep.get("timings_s"), dict):
        rep["timings_s"] = {TIMING_RENAMES.get(k, k): v for k, v in rep["timings_s"].items()}
    out["report"] = rep
    if "demo" in out:
        out["demo"] = [renamed(o) for o in out["demo"]]
    return out


def differences(before: dict, after: dict, where: str = "") -> List[str]:
    """Every field that differs, wall times aside (their stage names are compared)."""
    diffs = []
    for k in sorted(set(before) | set(after)):
        path = f"{where}.{k}" if where else k
        a, b = before.get(k, "<absent>"), after.get(k, "<absent>")
        if k == "timings_s" and isinstance(a, dict) and isinstance(b, dict):
            # AFTER keeps every stage and may add only NEW_TIMINGS (BEFORE may have them too)
            if not set(a) <= set(b) or not set(b) - set(a) <= NEW_TIMINGS:
                diffs.append(f"{path} stages: {sorted(a)} vs {sorted(b)}")
        elif k in MEASURED:
            continue
        elif a == "<absent>" and k in NEW_REPORT_KEYS:
            continue
        elif isinstance(a, dict) and isinstance(b, dict):
            diffs += differences(a, b, path)
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and \
                all(isinstance(x, dict) for x in a + b):
            for i, (x, y) in enumerate(zip(a, b)):
                diffs += differences(x, y, f"{path}[{i}]")
        elif a != b:
            diffs.append(f"{path}: {json.dumps(a)[:80]} vs {json.dumps(b)[:80]}")
    return diffs


def compare(repo: str, before: str, after: str) -> Dict[str, List[str]]:
    with tempfile.TemporaryDirectory(prefix="same_answers_") as root:
        trees = {}
        try:
            for rev in (before, after):
                trees[rev] = worktree(repo, rev, root, weights_from=before)
            result = {}
            for name, argv in COMMANDS:
                outs = []
                for rev in (before, after):
                    args = [a.replace("{sample}", sample_path(trees[rev])) for a in argv]
                    outs.append(run_cli(trees[rev], args))
                result[name] = differences(renamed(outs[0]), outs[1])
            return result
        finally:
            for path in trees.values():
                git("worktree", "remove", "--force", path, cwd=repo)


def markdown(before: str, after: str, result: Dict[str, List[str]]) -> str:
    import datetime
    import platform

    import torch
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# Same answers: {before} -> {after}", "",
             f"Run {when} on {platform.machine()} CPU ({os.cpu_count()} cores), Python "
             f"{platform.python_version()}, torch {torch.__version__}.", "",
             f"Command: `python scripts/dev/same_answers.py {before} {after}` (both trees with "
             f"{before}'s tiny weights; renames as in docs/CONTRACT.md; wall times and peak memory "
             f"not compared)",
             "", "| command | same | differences |", "|---|---|---|"]
    for name, diffs in result.items():
        lines.append(f"| `{name}` | {'yes' if not diffs else 'NO'} | "
                     f"{'; '.join(diffs) if diffs else '-'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("after", nargs="?", default="HEAD")
    ap.add_argument("--out", default=None, help="write the table as markdown here")
    a = ap.parse_args(argv)
    repo = git("rev-parse", "--show-toplevel", cwd=os.getcwd()).strip()
    before, after = (git("rev-parse", "--short", r, cwd=repo).strip() for r in (a.before, a.after))
    result = compare(repo, before, after)
    text = markdown(before, after, result)
    sys.stdout.write(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0 if all(not d for d in result.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
