r"""Retrain one stage of the shipped recipe at two commits and compare the weights bit for bit.

A refactor of the trainer must not change what the recipe trains: the shipped tiny weights stay
the ones a retrain with the same seed gives. The stage retrained is recipe v9's Stage 3f, the
shipped weights' last stage, with every part of the tiny curriculum its config turns on (dense
dialogues and captions, long plans, colour-first answers, route supervision, frozen input
embeddings) and the paper's Stage 3 around them. Its config is the recipe's own
(``_stage_config("3f", ..., task="v9")``) but for four things, the same at both commits:

- it starts from the shipped model and routers (``vr_runtime/assets/tiny``), as ``--from-model``
  starts a stage, since Stage 3e's model is not committed;
- the data is the wide task's first ``--train`` training and ``--heldout`` held-out videos
  (seed 0; the recipe's 960 and 85 would take an hour to write and encode on 2 cores);
- ``max_steps`` is ``--steps`` (the config's 400 take about 11 minutes a run there);
- ``eval_limit`` is the held-out questions' count, so ``metrics.json`` compares in full.

Each commit computes its own vision features (a cache of its own); the data is written once and
read by both: the video encoders do not write the same bytes twice (a few of 30 videos differ
between two writes with the same seed), so data written twice would train two different stages.

What is compared: each file's tensors bit for bit and its metadata, as one sha256 of the
tensors' names, dtypes, shapes and bytes and the metadata's keys and values (``content``). The
files' own sha256 are printed too, but a file's bytes also hold its metadata in the order the
safetensors writer put it, which can change from one process to the next (the routers' file has
four keys; the model's one). The held-out evaluation (``metrics.json``, the generated answers
included) is compared as well.

    python scripts/tiny/retrain_check.py --before e98f6c9 [--work runs/retrain_check] \
        [--steps 100] [--out studies/results/refactor_check.md]

The commit before is checked out once, as a git worktree in ``WORK/tree_REV`` (kept for the next
run; ``git worktree remove`` it when done). Prints the sha256 of each commit's
``model.safetensors`` and ``routers.safetensors``; exit status 1 when their contents or the
evaluations differ. ``--out`` also writes them, with the command, device, date and versions, as
a markdown file. One commit's run takes about 3 minutes on 2 CPU cores, up to 15 with other
jobs on them.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STAGE, TASK = "3f", "v9"
WEIGHTS = ("model.safetensors", "routers.safetensors")


def _recipe():
    """The module of the tiny recipe's stage configs: ``vr_tiny.recipe``, or at a commit from
    before the tiny curriculum had a package of its own, ``vr_runtime.training.tiny_demo``."""
    try:
        from vr_tiny import recipe
    except ImportError:
        from vr_runtime.training import tiny_demo as recipe
    return recipe


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def content_sha256(path: str) -> str:
    """The sha256 of a safetensors file's metadata (keys sorted) and tensors (by name: dtype,
    shape, bytes)."""
    import torch
    from safetensors import safe_open
    h = hashlib.sha256()
    with safe_open(path, "pt") as f:
        h.update(json.dumps(f.metadata() or {}, sort_keys=True).encode())
        for name in sorted(f.keys()):
            t = f.get_tensor(name).contiguous()
            h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def retrain(tree: str, data: str, out: str, steps: int, eval_limit: int) -> dict:
    """Stage 3f of recipe v9 with the code of ``tree`` (on ``sys.path`` first) into ``out``."""
    from vr_runtime.training.loop import train
    assets = os.path.join(tree, "vr_runtime", "assets", "tiny")
    routers = os.path.join(assets, "routers.safetensors")
    cfg = _recipe()._stage_config(STAGE, data, out, assets, routers, TASK, start=assets)
    cfg.max_steps, cfg.eval_limit = steps, eval_limit
    train(cfg, progress=False, cache_dir=os.path.join(out, "feature_cache"))
    with open(os.path.join(cfg.output_dir, "metrics.json")) as f:
        metrics = json.load(f)["metrics"]
    out = {w: os.path.join(cfg.output_dir, w) for w in WEIGHTS}
    return {"tree": tree, "output_dir": cfg.output_dir,
            "content": {w: content_sha256(p) for w, p in out.items()},
            "sha256": {w: sha256(p) for w, p in out.items()},
            "shipped_content": {w: content_sha256(os.path.join(assets, w)) for w in WEIGHTS},
            "answer_accuracy": metrics.get("answer_accuracy"), "metrics": metrics}


def _run_in(tree: str, args, data: str, out: str) -> dict:
    """``retrain`` in a fresh interpreter whose imports come from ``tree``, into a fresh ``out``
    (its outputs and its feature cache: each commit computes its own)."""
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=tree)
    env.pop("TRITON_INTERPRET", None)   # CPU training uses the vectorised PyTorch pool_pack
    cmd = [sys.executable, os.path.abspath(__file__), "--one", tree, "--data", data,
           "--one-out", out, "--steps", str(args.steps), "--heldout", str(args.heldout)]
    p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"retrain_check: the retrain in {tree} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _rev(rev: str) -> str:
    return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", rev], check=True,
                          capture_output=True, text=True).stdout.strip()


def _worktree(rev: str, path: str) -> str:
    if not os.path.isdir(path):
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", path, rev], check=True,
                       capture_output=True)
    return path


def _write_data(data: str, n_train: int, n_heldout: int) -> None:
    if os.path.isfile(os.path.join(data, "heldout_conversations.jsonl")):
        return
    subprocess.run([sys.executable, "-m", "vr_tiny", "synth", "--task", "v2", "--out", data,
                    "--train", str(n_train), "--heldout", str(n_heldout), "--seed", "0"],
                   cwd=ROOT, check=True, capture_output=True)


def _markdown(args, runs, same: dict, wall_s: float) -> str:
    import torch
    rows = "\n".join(f"| {label} | {w} | `{r['content'][w]}` | `{r['sha256'][w]}` |"
                     for label, r in runs.items() for w in WEIGHTS)
    return (f"# Retrain check: recipe v9's Stage 3f at two commits\n\n"
            f"Command: `python scripts/tiny/retrain_check.py --before {args.before} "
            f"--steps {args.steps} --train {args.train} --heldout {args.heldout}`\n\n"
            f"Device: CPU (2 cores, shared with other jobs). Date: "
            f"{datetime.date.today().isoformat()}. torch {torch.__version__}, Python "
            f"{platform.python_version()}. Wall time of both runs: {wall_s:.0f} s.\n\n"
            f"What runs: `scripts/tiny/retrain_check.py`'s docstring (the recipe's Stage 3f "
            f"config from the shipped model, {args.train} training videos, {args.steps} "
            f"steps); `content` is the sha256 of the tensors and the metadata, `file` the "
            f"file's own.\n\n"
            f"| commit | file | content sha256 | file sha256 |\n|---|---|---|---|\n{rows}\n\n"
            + _file_note(runs, same) +
            f"Weights bit-identical: **{'yes' if same['weights'] else 'NO'}**. Held-out "
            f"evaluation (`metrics.json`, the generated answers included) identical: "
            f"**{'yes' if same['metrics'] else 'NO'}** (answers right: "
            + ", ".join(f"{k} {r['answer_accuracy']:.4f}" for k, r in runs.items()) + ").\n")


def _file_note(runs, same: dict) -> str:
    """Why two files whose contents match may differ as files."""
    a, b = runs.values()
    differ = [w for w in WEIGHTS if a["sha256"][w] != b["sha256"][w]]
    if not differ or not same["weights"]:
        return ""
    return (f"{', '.join(differ)}: the same tensors and metadata in files that differ: "
            f"safetensors writes the metadata's keys in an order of its own, which changes from "
            f"one process to the next.\n\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default="HEAD", help="the commit to compare the checkout with")
    ap.add_argument("--work", default="runs/retrain_check")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--train", type=int, default=24)
    ap.add_argument("--heldout", type=int, default=6)
    ap.add_argument("--out", default=None, help="also write the results here (markdown)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--data", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--one-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:   # one tree's retrain, in the interpreter _run_in started
        print(json.dumps(retrain(args.one, args.data, args.one_out, args.steps,
                                 eval_limit=1000)))
        return 0
    import time
    t0 = time.time()
    work = os.path.abspath(args.work)
    data = os.path.join(work, "data")
    _write_data(data, args.train, args.heldout)
    before = _rev(args.before)
    trees = {f"before ({before})": _worktree(before, os.path.join(work, f"tree_{before}")),
             f"after ({_rev('HEAD')} + the checkout's changes)": ROOT}
    runs = {label: _run_in(tree, args, data, os.path.join(work, f"run{i}"))
            for i, (label, tree) in enumerate(trees.items())}
    a, b = runs.values()
    same = {"weights": a["content"] == b["content"], "metrics": a["metrics"] == b["metrics"]}
    print(json.dumps({k: {"content": r["content"], "file": r["sha256"]}
                      for k, r in runs.items()}, indent=2))
    print("bit-identical" if all(same.values()) else f"DIFFERENT: {same}")
    if args.out:
        with open(args.out, "w") as f:
            f.write(_markdown(args, runs, same, time.time() - t0))
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
