"""Train the ``tiny`` preset on the synthetic evidence task, end to end, and ship it.

synthetic data -> Stage 1 -> Stage 2 -> Stage 3 (configs ``tiny_stage{1,2,3}``, clearly *not*
the paper's values) -> held-out metrics JSON + curves PNG -> optionally copy
``model.safetensors`` and ``routers.safetensors`` into ``vr_runtime/assets/tiny/``, where the
runtime picks them up.
"""
from __future__ import annotations

import json
import os
import shutil
import time

from .config import load_config
from .synthetic import generate

ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "tiny")


def run_tiny(work: str = "runs/tiny", ship: bool = False, n_train: int = 160,
             n_heldout: int = 40, results: str = "bench/results", seed: int = 0) -> dict:
    data = os.path.join(work, "data")
    if not os.path.isfile(os.path.join(data, "heldout_conversations.jsonl")):
        generate(data, n_train, seed=seed, split="train")
        generate(data, n_heldout, seed=seed, split="heldout")
    from .loop import train
    summary = {"work": work, "train_videos": n_train, "heldout_videos": n_heldout, "stages": {}}
    prev = None
    for stage in (1, 2, 3):
        cfg = load_config(f"tiny_stage{stage}")
        names = {1: "relevance", 2: "policy", 3: "conversations"}
        cfg.train_data = os.path.join(data, f"train_{names[stage]}.jsonl")
        cfg.eval_data = os.path.join(data, f"heldout_{names[stage]}.jsonl")
        cfg.output_dir = os.path.join(work, f"stage{stage}")
        cfg.routers = prev
        done = os.path.join(cfg.output_dir, "metrics.json")
        if stage < 3 and os.path.isfile(done) and \
                os.path.isfile(os.path.join(cfg.output_dir, "routers.safetensors")):
            # a finished stage is reused (delete its folder to retrain it)
            with open(done) as f:
                summary["stages"][f"stage{stage}"] = {"metrics": json.load(f)["metrics"],
                                                      "reused": True}
            prev = os.path.join(cfg.output_dir, "routers.safetensors")
            continue
        t0 = time.time()
        res = train(cfg)
        summary["stages"][f"stage{stage}"] = {
            "metrics": res["metrics"], "global_step": res["global_step"],
            "wall_s": round(time.time() - t0, 1), "trainable": cfg.trainable_groups,
            "config": f"vr_runtime/training/configs/tiny_stage{stage}.json"}
        print(json.dumps({f"stage{stage}": res["metrics"]}, indent=2))
        prev = os.path.join(cfg.output_dir, "routers.safetensors")
        if stage == 3:  # the shipped routers after joint fine-tuning, on the Stage 1/2 sets
            from .data import read_jsonl
            from .evaluate import eval_policy, eval_relevance
            tr = res["trainee"]
            tr.eval()
            rel = read_jsonl(os.path.join(data, "heldout_relevance.jsonl"), "relevance")
            pol = read_jsonl(os.path.join(data, "heldout_policy.jsonl"), "policy")
            from .features import FeatureCache
            cache = FeatureCache(tr.model, 16, os.path.join(data, ".vr_cache"))
            summary["final_routers"] = {"relevance": eval_relevance(tr, rel, cache),
                                        "policy": eval_policy(tr, pol)}
            print(json.dumps(summary["final_routers"], indent=2))
    os.makedirs(results, exist_ok=True)
    from .curves import plot_curves
    plot_curves(work, os.path.join(results, "training_curves.png"))
    with open(os.path.join(results, "training_metrics.json"), "w") as f:
        json.dump(summary, f, indent=2)
    if ship:
        os.makedirs(ASSETS, exist_ok=True)
        shutil.copyfile(os.path.join(work, "stage3", "model.safetensors"),
                        os.path.join(ASSETS, "model.safetensors"))
        shutil.copyfile(os.path.join(work, "stage3", "routers.safetensors"),
                        os.path.join(ASSETS, "routers.safetensors"))
    return summary
