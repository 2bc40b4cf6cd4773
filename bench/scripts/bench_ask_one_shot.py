"""One-shot ``videorouter ask`` on the bundled demo clip: the whole command's wall time in fresh
processes, and where it goes.

    python -m bench.scripts.bench_ask_one_shot                                    # this tree, 3 runs
    python -m bench.scripts.bench_ask_one_shot --trees /tmp/before /tmp/after --runs 3 \\
        --out bench/results/ask_one_shot_cpu.json [--append]        # before/after, interleaved

The command is the demo's second question (``--frames 16 --max-length 1400 --json``), run as
``python -m vr_runtime.cli`` with each tree as the working directory (so each tree's own
package is imported). Runs alternate between the trees (before, after, before, ...) so a busy
machine slows both alike; the figures are medians. Every run's answer and report (timings and
memory excluded) must equal the first tree's, or the script fails.

Where the time goes, each in fresh processes of the first tree:

* ``floors``: ``python -c pass``; importing torch and vr_kernels; that plus the transformers
  classes the tiny model is built from (``InternVLForConditionalGeneration``,
  ``PreTrainedTokenizerFast``). What no change to vr_runtime can remove.
* ``imports``: ``-X importtime`` of one ``ask``: the largest subtrees by the first import that
  pulled them in (cumulative seconds; the chain names the importer).
* ``load_steps``: after the imports, in one process, twice: each step of the tiny preset's load
  (config, construction with transformers' init skipped, the safetensors copy, ``.eval()``, the
  tokenizer, the NaN/inf check, the routers).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import resource
import statistics
import subprocess
import sys
import time

from bench.harness.env import environment
from bench.harness.results import add_append_flag, with_run, write_results

ROOT = pathlib.Path(__file__).resolve().parents[2]
QUESTION = "What shape is the blue object?"
ARGS = ["--frames", "16", "--max-length", "1400", "--json"]
# Report fields that measure the run rather than decide the answer.
VOLATILE = ("timings_s", "peak_memory_bytes", "peak_memory_source", "peak_activation_bytes",
            "peak_memory_nvml_bytes")
IMPORTS_OF_THE_MODEL = ("import torch, vr_kernels; from transformers import InternVLConfig, "
                        "InternVLForConditionalGeneration, PreTrainedTokenizerFast")

LOAD_STEPS = r'''
import json, sys, time, torch
from transformers import InternVLConfig, InternVLForConditionalGeneration
from vr_runtime.backbones.base import build_model
from vr_runtime.backbones.internvl3 import InternVL3Backbone
from vr_runtime.backbones.tiny import ASSETS, load_safetensors_into, load_tiny_tokenizer
from vr_runtime.backbones.weights import nonfinite
from vr_runtime.backbones import load_backbone
from vr_runtime.routing.routers import Routers
rows = []
for rep in range(2):
    T, t = {}, time.perf_counter()
    cfg = InternVLConfig.from_dict(InternVL3Backbone.preset_config()); T["config"] = time.perf_counter() - t
    t = time.perf_counter()
    m = build_model(InternVLForConditionalGeneration, cfg, torch.float32, "sdpa", False, torch.device("cpu"))
    T["construct"] = time.perf_counter() - t; t = time.perf_counter()
    load_safetensors_into(m, ASSETS / "model.safetensors"); T["safetensors"] = time.perf_counter() - t
    t = time.perf_counter(); m = m.to("cpu").eval(); T["to_eval"] = time.perf_counter() - t
    t = time.perf_counter(); load_tiny_tokenizer(); T["tokenizer"] = time.perf_counter() - t
    t = time.perf_counter(); assert nonfinite(m.named_parameters()) is None; T["nan_inf_check"] = time.perf_counter() - t
    lm = load_backbone("tiny")
    t = time.perf_counter(); Routers.load(ASSETS / "routers.safetensors", lm); T["routers"] = time.perf_counter() - t
    t = time.perf_counter(); load_backbone("tiny"); T["load_backbone"] = time.perf_counter() - t
    rows.append({k: round(v, 4) for k, v in T.items()})
print(json.dumps(rows))
'''


def _run(cmd, cwd, **kw):
    """(wall s, CPU s of the child, CompletedProcess)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, **kw)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode:
        raise SystemExit(f"{' '.join(map(str, cmd[:4]))} ... in {cwd} failed "
                         f"({proc.returncode}): {proc.stderr[-2000:]}")
    return wall, cpu, proc


def _env(tree):
    env = dict(os.environ, PYTHONPATH=str(tree))
    env.pop("VIDEOROUTER_DEBUG", None)
    return env


def ask_once(tree: pathlib.Path, extra=()):
    sample = tree / "vr_runtime" / "assets" / "sample.mp4"
    cmd = [sys.executable, *extra, "-m", "vr_runtime.cli", "ask", str(sample), QUESTION, *ARGS]
    return _run(cmd, tree, env=_env(tree))


def decision(out: dict) -> dict:
    """The generated text and the report without what measures the run."""
    return {"text": out["text"],
            "report": {k: v for k, v in out["report"].items() if k not in VOLATILE}}


def compare_trees(trees, runs: int) -> dict:
    walls = {str(t): [] for t in trees}
    cpus = {str(t): [] for t in trees}
    ttft = {str(t): [] for t in trees}
    reference = None
    for _ in range(runs):
        for tree in trees:
            wall, cpu, proc = ask_once(tree)
            out = json.loads(proc.stdout)
            if reference is None:
                reference = decision(out)
            elif decision(out) != reference:
                raise SystemExit(f"{tree}: the answer or report differs from the first run's")
            walls[str(tree)].append(round(wall, 3))
            cpus[str(tree)].append(round(cpu, 3))
            ttft[str(tree)].append(out["report"]["timings_s"].get("ttft"))
    return {"text": reference["text"], "walls_s": walls, "cpu_s": cpus, "ttft_s": ttft,
            "median_wall_s": {t: statistics.median(v) for t, v in walls.items()},
            "median_cpu_s": {t: statistics.median(v) for t, v in cpus.items()}}


def floors(tree: pathlib.Path, runs: int) -> dict:
    rows = {"python -c pass": "pass", "import torch, vr_kernels": "import torch, vr_kernels",
            "+ transformers InternVL classes": IMPORTS_OF_THE_MODEL}
    out = {}
    for name, code in rows.items():
        walls = [_run([sys.executable, "-c", code], tree, env=_env(tree))[0] for _ in range(runs)]
        out[name] = round(statistics.median(walls), 3)
    return out


# Subtrees worth naming: the heavy packages and what pulls them in. Cumulative, so a nested one
# (sympy inside torch._dynamo's) is also counted in its importer's figure.
WATCH = ("torch", "numpy", "triton", "av", "PIL", "transformers", "transformers.models",
         "huggingface_hub", "jinja2", "accelerate", "boto3", "torch.distributed.tensor", "sympy",
         "torch._dynamo", "scipy.optimize", "transformers.masking_utils",
         "transformers.modeling_utils", "transformers.models.internvl.modeling_internvl",
         "vr_runtime.runtime")


def import_tree(tree: pathlib.Path) -> list:
    """Cumulative import seconds of the ``WATCH`` modules in one ``ask`` (-X importtime), in
    the order they finished, and the chain of importers that pulled each in."""
    _, _, proc = ask_once(tree, extra=("-X", "importtime"))
    rows = []
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if m:
            rows.append((int(m.group(2)) / 1e6, len(m.group(3)), m.group(4)))
    out = []
    for i, (cum, depth, name) in enumerate(rows):
        if name not in WATCH:
            continue
        chain, d = [], depth
        for _, depth2, name2 in rows[i + 1:]:   # importtime prints a module after its imports
            if depth2 < d:
                chain.append(name2)
                d = depth2
        out.append({"module": name, "cumulative_s": round(cum, 3),
                    "imported_by": " <- ".join(chain[:8])})
    return out


def load_steps(tree: pathlib.Path) -> list:
    _, _, proc = _run([sys.executable, "-c", LOAD_STEPS], tree, env=_env(tree))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trees", nargs="+", default=[str(ROOT)],
                    help="source trees to time (default: this one); the first is the reference")
    ap.add_argument("--runs", type=int, default=3, help="runs of the command per tree")
    ap.add_argument("--no-profile", action="store_true", help="the timings only")
    ap.add_argument("--out", default=None, help="results .json")
    add_append_flag(ap)
    a = ap.parse_args(argv)
    trees = [pathlib.Path(t).resolve() for t in a.trees]
    import torch
    res = {"environment": environment(torch.device("cpu")),
           "command": f"videorouter ask SAMPLE {QUESTION!r} {' '.join(ARGS)}",
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
           "cpus": os.cpu_count(), "python": sys.version.split()[0],
           "load_average_before": os.getloadavg()[0]}
    import transformers
    res["transformers"] = transformers.__version__
    res["ask"] = compare_trees(trees, a.runs)
    if not a.no_profile:
        for t in trees:
            res.setdefault("load_steps", {})[str(t)] = load_steps(t)
        res["floors_s"] = floors(trees[0], a.runs)
        res["imports"] = import_tree(trees[0])
    res["load_average_after"] = os.getloadavg()[0]
    text = json.dumps(res, indent=1)
    print(text)
    if a.out:   # whole or not at all: a killed run leaves the previous results
        write_results(a.out, with_run(a.out, res) if a.append else res)


if __name__ == "__main__":
    main()
