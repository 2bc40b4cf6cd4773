"""Train the ``tiny`` preset on the synthetic evidence task, end to end, and ship it.

synthetic data -> Stage 0 (tiny-only pretraining from the deterministic fill, ``pretrain.py``)
-> Stage 1 -> Stage 2 -> Stage 3 -> Stage 3b (Stage 3 continued with the plans
the runtime makes at inference; configs ``tiny_stage{1,2,3,3b}``, clearly *not* the paper's
values) -> held-out metrics JSON + curves PNG -> optionally copy
``model.safetensors`` and ``routers.safetensors`` into ``vr_runtime/assets/tiny/``, where the
runtime picks them up.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from typing import Optional

from ..data.synthetic_videos import generate
from .checkpoints import write_json_atomic
from .config import load_config
from .data import read_jsonl
from .evaluate import eval_policy, eval_relevance
from .features import FeatureCache
from .loop import build, train
from .pretrain import PretrainConfig, pretrain

# Task v2 trains Stage 3b's tight budgets as a fraction of each video's dense tokens (8 to 64
# frames) instead of tiny_stage3b's absolute train_max_length [1000, 2200], which is this same
# range of compression at 16 frames (a visual budget of ~750-1950 of 4,096 tokens).
V2_TRAIN_BUDGET_FRACTION = [0.18, 0.48]

ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "tiny")


def prepare_data(data: str, n_train: int, n_heldout: int, seed: int = 0,
                 task: str = "v1") -> None:
    """Write both splits under ``data``. Every run calls ``generate``: it draws the same specs
    from the seed, rewrites the lines (cheap) and encodes only the videos that are not there,
    so a video deleted or never finished is written again, and the videos that are there keep
    their files (and mtimes, which key the feature cache)."""
    for split, n in (("train", n_train), ("heldout", n_heldout)):
        generate(data, n, seed=seed, split=split, task=task)


def _stage0(work: str, summary: dict) -> str:
    """Stage 0 into ``work/stage0`` (reused when finished); returns the model directory."""
    cfg = PretrainConfig.load("tiny_stage0", output_dir=os.path.join(work, "stage0"))
    hf = os.path.join(cfg.output_dir, "hf")
    done = os.path.join(cfg.output_dir, "metrics.json")
    if os.path.isfile(done) and os.path.isdir(hf):
        with open(done) as f:
            res = dict(json.load(f), reused=True)
    else:
        t0 = time.time()
        res = pretrain(cfg)
        res["wall_s"] = round(time.time() - t0, 1)
    summary["stages"]["stage0"] = dict(res, config="vr_runtime/configs/tiny_stage0.json")
    print(json.dumps({"stage0": res["metrics"]}, indent=2))
    return hf


def run_tiny(work: str = "runs/tiny", ship: bool = False, n_train: int = 160,
             n_heldout: int = 40, results: Optional[str] = None, seed: int = 0,
             task: str = "v1") -> dict:
    """``task``: the synthetic task (``synthetic.generate``'s 'v1', the default, or 'v2': the
    factors real footage varies; its lines carry their own frame counts, which every stage
    samples)."""
    data = os.path.join(work, "data")
    prepare_data(data, n_train, n_heldout, seed=seed, task=task)
    summary = {"work": work, "task": task, "train_videos": n_train, "heldout_videos": n_heldout,
               "stages": {}}
    base = _stage0(work, summary)   # every stage starts from Stage 0's model, never the shipped one
    prev = None
    for stage in (1, 2, 3, "3b"):
        cfg = _stage_config(stage, data, work, base, prev, task)
        prev = os.path.join(cfg.output_dir, "routers.safetensors")
        summary["stages"][f"stage{stage}"] = _run_stage(cfg, stage, prev)
    summary["final_routers"] = _final_routers(work, data, prev)
    print(json.dumps(summary["final_routers"], indent=2))
    results = results or work   # the curves and metrics beside the run unless asked elsewhere
    os.makedirs(results, exist_ok=True)
    from .curves import plot_curves
    plot_curves(work, os.path.join(results, "training_curves.png"))
    with open(os.path.join(results, "training_metrics.json"), "w") as f:
        json.dump(summary, f, indent=2)
    if ship:
        os.makedirs(ASSETS, exist_ok=True)
        shutil.copyfile(os.path.join(work, "stage3b", "model.safetensors"),
                        os.path.join(ASSETS, "model.safetensors"))
        shutil.copyfile(os.path.join(work, "stage3b", "routers.safetensors"),
                        os.path.join(ASSETS, "routers.safetensors"))
    return summary


_DATA_NAMES = {1: "relevance", 2: "policy", 3: "conversations", "3b": "conversations"}


def _stage_config(stage, data: str, work: str, base: str, prev, task: str):
    """``tiny_stage<stage>`` on the data under ``data``, from Stage 0's model ``base`` (Stage 3b:
    from Stage 3's) and the previous stage's routers ``prev``, into ``work/stage<stage>``."""
    cfg = load_config(f"tiny_stage{stage}")
    cfg.train_data = os.path.join(data, f"train_{_DATA_NAMES[stage]}.jsonl")
    cfg.eval_data = os.path.join(data, f"heldout_{_DATA_NAMES[stage]}.jsonl")
    cfg.output_dir = os.path.join(work, f"stage{stage}")
    cfg.routers = prev
    cfg.model = base
    if task == "v2" and cfg.train_max_length:
        cfg.train_max_length, cfg.train_budget_fraction = [], list(V2_TRAIN_BUDGET_FRACTION)
    if stage == "3b":  # Stage 3 continued from Stage 3's model, inference-matched plans
        cfg.model = os.path.join(work, "stage3", "hf")
    return cfg


def _run_stage(cfg, stage, routers: str) -> dict:
    """Train one stage, or reuse it when its folder holds a finished run (delete the folder to
    retrain it); returns its entry of ``training_metrics.json``."""
    done = os.path.join(cfg.output_dir, "metrics.json")
    reused = os.path.isfile(done) and os.path.isfile(routers) and (
        stage in (1, 2) or os.path.isfile(os.path.join(cfg.output_dir, "model.safetensors")))
    if reused:
        with open(done) as f:
            m = json.load(f)
    else:
        t0 = time.time()
        train(cfg)
        with open(done) as f:
            m = json.load(f)
        # the stage's own record keeps its time, so a later run that reuses it reports it
        m["wall_s"] = round(time.time() - t0, 1)
        write_json_atomic(done, m, indent=2)
        print(json.dumps({f"stage{stage}": m["metrics"]}, indent=2))
    entry = {"metrics": m["metrics"], "global_step": m.get("global_step")}
    if reused:
        entry["reused"] = True
    if "wall_s" in m:
        entry["wall_s"] = m["wall_s"]
    entry.update(trainable=cfg.trainable_groups,
                 config=f"vr_runtime/configs/tiny_stage{stage}.json")
    if cfg.train_budget_fraction:
        entry["train_budget_fraction"] = cfg.train_budget_fraction
    return entry


def _final_routers(work: str, data: str, routers: str) -> dict:
    """The shipped routers (after Stage 3b) on the Stage 1/2 held-out sets."""
    cfg = load_config("tiny_stage3b", routers=routers)
    cfg.model = os.path.join(work, "stage3b", "hf")
    _, _, tr, _ = build(cfg)
    tr.eval()
    rel = read_jsonl(os.path.join(data, "heldout_relevance.jsonl"), "relevance")
    pol = read_jsonl(os.path.join(data, "heldout_policy.jsonl"), "policy")
    cache = FeatureCache(tr.bb, 16, os.path.join(data, ".vr_cache"))
    return {"relevance": eval_relevance(tr, rel, cache), "policy": eval_policy(tr, pol)}
