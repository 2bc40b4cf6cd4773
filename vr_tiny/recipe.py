"""Train the ``tiny`` preset on the synthetic evidence task, end to end, and ship it.

synthetic data -> Stage 0 (tiny-only pretraining from the deterministic fill, ``pretrain.py``)
-> Stage 1 -> Stage 2 -> Stage 3 -> Stage 3b (Stage 3 continued with the plans
the runtime makes at inference; configs ``tiny_stage{1,2,3,3b}``, clearly *not* the paper's
values) [-> Stage 3c, tasks v3 to v5: Stage 3b continued with dense and long layouts,
``tiny_stage3c``, ``layouts.py``] [-> Stage 3d, task v4: route supervision (``route.py``)
over dense dialogues, ``tiny_stage3d``] [-> Stages 3e and 3f, tasks v5 and v6: Stage 3d's
settings on every training video, twice, ``tiny_stage3e``, ``tiny_stage3f``] [-> Stage 3g,
task v6: the same settings on three times the training videos, ``tiny_stage3g``] (task v8:
task v5's stages from a longer Stage 0, ``tiny_stage0b``; task v9: task v8's with its shape
answers color first, ``STAGE_SETTINGS``) -> held-out
metrics JSON + curves PNG -> optionally copy ``model.safetensors`` and
``routers.safetensors`` into ``vr_runtime/assets/tiny/``, where the runtime picks them up.

Task v3 is task v2's data and stages plus Stage 3c; task v4 is v3's plus Stage 3d; task v5
is v3's plus Stages 3e and 3f; task v6 is v5's plus Stage 3g; task v8 is v5's from Stage 0
``tiny_stage0b`` (from scratch only: every stage sits on Stage 0); task v9 is v8's with the
settings of ``STAGE_SETTINGS`` on top of its Stage 3 configs. ``from_model`` starts from a
finished model of the task before (a directory of ``config.json``, ``model.safetensors``,
``tokenizer.json``, ``routers.safetensors``, as the shipped weights of each task were): task
v3's Stage 3c from a v2 model, task v4's Stage 3d and task v5's Stage 3e from a v3 model, task
v6's Stage 3g from a v5 model.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from typing import Optional

from vr_runtime.backbones.tiny import ASSETS
from vr_runtime.data.synthetic_videos import write_dataset
from vr_runtime.training.checkpoints import write_json_atomic, write_lines_atomic
from vr_runtime.training.config import load_config
from vr_runtime.training.data import iter_jsonl, read_jsonl, write_jsonl
from vr_runtime.training.evaluate import eval_policy, eval_relevance
from vr_runtime.training.features import FeatureCache
from vr_runtime.training.loop import build, train

from . import set_option
from .pretrain import PretrainConfig, pretrain

# Task v2 trains Stage 3b's tight budgets as a fraction of each video's dense tokens (8 to 64
# frames) instead of tiny_stage3b's absolute train_max_length [1000, 2200], which is this same
# range of compression at 16 frames (a visual budget of ~750-1950 of 4,096 tokens).
V2_TRAIN_BUDGET_FRACTION = [0.18, 0.48]
# Stage 3c's 300 steps of 4 see about 1,200 examples: the conversations of the first 320
# training videos (about 1,290 lines), so that only their features are computed. Stage 3d
# kept them; Stages 3e and 3f read every video, since 320 were few enough to learn by heart.
V3_STAGE3C_VIDEOS = 320
FIRST_VIDEOS_STAGES = ("3c", "3d")
# Stage 3g reads 1,920 more training videos besides the 960 (another seed of the same train
# split, in WORK/data_more): with the 960 the dense answers still learned pairs by heart.
MORE_VIDEOS_STAGES = ("3g",)
MORE_TRAIN, MORE_SEED, MORE_DATA = 1920, 7, "data_more"
# The stages each task adds to task v2's (1, 2, 3, 3b); ``from_model`` starts at the first of
# the task's own (those after the task before's).
LATER_STAGES = {"v3": ("3c",), "v4": ("3c", "3d"), "v5": ("3c", "3e", "3f"),
                "v6": ("3c", "3e", "3f", "3g"), "v8": ("3c", "3e", "3f"),
                "v9": ("3c", "3e", "3f")}
# Stage 0's config per task (default ``tiny_stage0``). Task v8 is task v5 from a Stage 0 whose
# captions run eight times as long: at 800 steps the LLM names the shape of a colour in a frame
# of two different shapes 73% of the time, and that binding is what the dense answers lack.
# Trained, Stage 3 wrote over it and the dense answers stayed at 85%, so it is not shipped
# (docs/TRAINING_STUDIES.md, task v8; task v7 was a study with no recipe of its own).
STAGE0_CONFIGS = {"v8": "tiny_stage0b", "v9": "tiny_stage0b"}
# Settings a task sets on top of a stage's config. Task v9 is task v8 whose shape answers name
# their color first (" red circle", ``layouts.color_first``): the shape is then predicted from
# the color word's own row, the one hop Stage 0's captions train, and Stage 3 keeps that
# binding when it trains dense dialogues with captions from the first step (task v8's probes,
# v8_steps/stage3_dense_caption/ at commit cf1bde8); the captions stay in Stages 3e and 3f.
_CAPTIONS = {"dense_plan_dialogue": True, "caption_turn_prob": 0.5}
_DENSE_CAPTIONS = {"dense_plan_prob": 0.5, "dense_plan_frames": [6, 10],
                   "dense_plan_keep_relevant": True, **_CAPTIONS}
_COLOR_FIRST = {"color_first_answers": True}
STAGE_SETTINGS = {"v9": {3: {**_DENSE_CAPTIONS, **_COLOR_FIRST}, "3b": _COLOR_FIRST,
                         "3c": _COLOR_FIRST, "3e": {**_CAPTIONS, **_COLOR_FIRST},
                         "3f": {**_CAPTIONS, **_COLOR_FIRST}}}
FROM_TASK = {"v3": "v2", "v4": "v3", "v5": "v3", "v6": "v5"}   # whose model ``from_model`` is


def stage_settings(task: str, stage) -> dict:
    """What ``task`` sets on top of ``tiny_stage<stage>`` (``STAGE_SETTINGS``; {} for none)."""
    return STAGE_SETTINGS.get(task, {}).get(stage, {})


def prepare_data(data: str, n_train: int, n_heldout: int, seed: int = 0,
                 task: str = "v1") -> None:
    """Write both splits under ``data``. Every run calls ``write_dataset``: it draws the same specs
    from the seed, rewrites the lines (cheap) and encodes only the videos that are not there,
    so a video deleted or never finished is written again, and the videos that are there keep
    their files (and mtimes, which key the feature cache)."""
    for split, n in (("train", n_train), ("heldout", n_heldout)):
        write_dataset(data, n, seed=seed, split=split, task=task)


def _stage0(work: str, summary: dict, task: str = "v1") -> str:
    """Stage 0 (the task's config, ``STAGE0_CONFIGS``) into ``work/stage0`` (reused when
    finished); returns the model directory."""
    name = STAGE0_CONFIGS.get(task, "tiny_stage0")
    cfg = PretrainConfig.load(name, output_dir=os.path.join(work, "stage0"))
    hf = os.path.join(cfg.output_dir, "hf")
    done = os.path.join(cfg.output_dir, "metrics.json")
    if os.path.isfile(done) and os.path.isdir(hf):
        with open(done) as f:
            res = dict(json.load(f), reused=True)
    else:
        t0 = time.time()
        res = pretrain(cfg)
        res["wall_s"] = round(time.time() - t0, 1)
    summary["stages"]["stage0"] = dict(res, config=f"vr_tiny/configs/{name}.json")
    print(json.dumps({"stage0": res["metrics"]}, indent=2))
    return hf


def run_tiny(work: str = "runs/tiny", ship: bool = False, n_train: int = 160,
             n_heldout: int = 40, results: Optional[str] = None, seed: int = 0,
             task: str = "v1", from_model: Optional[str] = None) -> dict:
    """``task``: the synthetic task (``synthetic_videos.write_dataset``'s 'v1', the default, or
    'v2': the factors real footage varies; its lines carry their own frame counts, which every
    stage samples; 'v3': v2 plus Stage 3c; 'v4': v3 plus Stage 3d; 'v5': v3 plus Stages 3e and 3f;
    'v6': v5 plus Stage 3g; 'v8': v5 from Stage 0 ``tiny_stage0b``; 'v9': v8 with
    ``STAGE_SETTINGS``). ``from_model``: tasks v3 to v6, their own stages from that finished
    model of the task before (``FROM_TASK``) instead of the stages before them."""
    if from_model and task not in FROM_TASK:
        raise ValueError(f"from_model: a finished model of the task before, so task "
                         f"{' or '.join(FROM_TASK)} only")
    data = os.path.join(work, "data")
    prepare_data(data, n_train, n_heldout, seed=seed, task="v1" if task == "v1" else "v2")
    stages = (1, 2, 3, "3b") + LATER_STAGES.get(task, ())
    if any(s in MORE_VIDEOS_STAGES for s in stages):
        write_dataset(os.path.join(work, MORE_DATA), MORE_TRAIN, seed=MORE_SEED, task="v2")
    summary = {"work": work, "task": task, "train_videos": n_train, "heldout_videos": n_heldout,
               "stages": {}}
    if from_model:
        summary["from_model"] = from_model
        before = os.path.join(from_model, "training_metrics.json")
        if os.path.isfile(before):   # the record of the run that made the starting model,
            with open(before) as f:  # with the stages of the one that made its own start
                rec = json.load(f)
            summary["from_model_stages"] = {**(rec.get("from_model_stages") or {}),
                                            **(rec.get("stages") or {})}
        own = LATER_STAGES[task][len(LATER_STAGES.get(FROM_TASK[task], ())):]
        prev, stages, base = os.path.join(from_model, "routers.safetensors"), own, None
    else:
        base = _stage0(work, summary, task)   # every stage starts from Stage 0's model
        prev = None
    for stage in stages:
        start = from_model if from_model and stage == stages[0] else None
        cfg = _stage_config(stage, data, work, base, prev, task, start)
        prev = os.path.join(cfg.output_dir, "routers.safetensors")
        summary["stages"][f"stage{stage}"] = entry = _run_stage(cfg, stage, prev)
        if stage_settings(task, stage):
            entry["settings"] = stage_settings(task, stage)
    last = os.path.join(work, f"stage{stages[-1]}")
    summary["final_routers"] = _final_routers(last, data, prev)
    print(json.dumps(summary["final_routers"], indent=2))
    results = results or work   # the curves and metrics beside the run unless asked elsewhere
    os.makedirs(results, exist_ok=True)
    from .curves import plot_curves
    plot_curves(work, os.path.join(results, "training_curves.png"))
    with open(os.path.join(results, "training_metrics.json"), "w") as f:
        json.dump(summary, f, indent=2)
    if ship:
        os.makedirs(ASSETS, exist_ok=True)
        for name in ("model.safetensors", "routers.safetensors"):
            shutil.copyfile(os.path.join(last, name), os.path.join(ASSETS, name))
    return summary


# Each stage's training and held-out files: Stages 1 and 2 their own, Stage 3 and every
# continuation the conversations.
_DATA_NAMES = {1: "relevance", 2: "policy"}
# Each continued stage starts from the model of the stage before it (or ``from_model``).
_BEFORE = {"3b": "stage3", "3c": "stage3b", "3d": "stage3c", "3e": "stage3c", "3f": "stage3e",
           "3g": "stage3f"}


def _stage_config(stage, data: str, work: str, base: str, prev, task: str,
                  start: Optional[str] = None):
    """``tiny_stage<stage>`` on the data under ``data``, from Stage 0's model ``base`` (Stage 3b
    and later: from the stage before's, or ``start``, a finished model of the task before) and
    the previous stage's routers ``prev``, into ``work/stage<stage>``."""
    cfg = load_config(f"tiny_stage{stage}")
    name = _DATA_NAMES.get(stage, "conversations")
    cfg.train_data = os.path.join(data, f"train_{name}.jsonl")
    cfg.eval_data = os.path.join(data, f"heldout_{name}.jsonl")
    cfg.output_dir = os.path.join(work, f"stage{stage}")
    cfg.routers = prev
    cfg.model = base
    if task != "v1" and cfg.train_max_length:
        cfg.train_max_length, cfg.train_budget_fraction = [], list(V2_TRAIN_BUDGET_FRACTION)
    if stage in _BEFORE:   # a continued stage: from the stage before's model (3b: Stage 3's)
        cfg.model = start or os.path.join(work, _BEFORE[stage], "hf")
    settings = stage_settings(task, stage)
    for k, v in settings.items():
        set_option(cfg, k, v)
    if settings:
        cfg.validate()
    if stage in FIRST_VIDEOS_STAGES:
        cfg.train_data = first_videos(cfg.train_data, V3_STAGE3C_VIDEOS,
                                      os.path.join(data, "train_conversations_3c.jsonl"))
    if stage in MORE_VIDEOS_STAGES:
        cfg.train_data = combine_jsonl(
            [cfg.train_data, os.path.join(work, MORE_DATA, "train_conversations.jsonl")],
            os.path.join(data, "train_conversations_more.jsonl"))
    return cfg


def first_videos(path: str, n: int, out: str) -> str:
    """The lines of ``path`` whose video is among its first ``n`` distinct videos (file order),
    written to ``out``; returns ``out``."""
    keep, lines = set(), []
    with open(path) as f:
        for line in f:
            video = json.loads(line)["video"]
            if video not in keep and len(keep) >= n:
                continue
            keep.add(video)
            lines.append(line)
    write_lines_atomic(out, lines)
    return out


def combine_jsonl(paths, out: str) -> str:
    """The lines of every file of ``paths`` in one file ``out``: each video path made relative
    to ``out``'s folder (the paths of a line are relative to its file's), and each id of the
    second file on prefixed with its folder's name, so that ids stay unique; returns ``out``."""
    root, records = os.path.dirname(os.path.abspath(out)), []
    for k, path in enumerate(paths):
        src = os.path.dirname(os.path.abspath(path))
        for _, rec in iter_jsonl(path, "training data"):
            if not os.path.isabs(rec["video"]):
                rec["video"] = os.path.relpath(os.path.join(src, rec["video"]), root)
            if k and "id" in rec:
                rec["id"] = f"{os.path.basename(src)}/{rec['id']}"
            records.append(rec)
    write_jsonl(out, records, atomic=True)
    return out


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
                 config=f"vr_tiny/configs/tiny_stage{stage}.json")
    if cfg.train_budget_fraction:
        entry["train_budget_fraction"] = cfg.train_budget_fraction
    return entry


def _final_routers(stage_dir: str, data: str, routers: str) -> dict:
    """The shipped routers (after the last stage, in ``stage_dir``) on the Stage 1/2 held-out
    sets."""
    cfg = load_config("tiny_stage3b", routers=routers)
    cfg.model = os.path.join(stage_dir, "hf")
    _, _, tr, _ = build(cfg)
    tr.eval()
    rel = read_jsonl(os.path.join(data, "heldout_relevance.jsonl"), "relevance")
    pol = read_jsonl(os.path.join(data, "heldout_policy.jsonl"), "policy")
    cache = FeatureCache(tr.bb, 16, os.path.join(data, ".vr_cache"))
    return {"relevance": eval_relevance(tr, rel, cache), "policy": eval_policy(tr, pol)}
