"""Stage 0, tiny-only: teach the tiny model to *see* before the paper's three stages run.

A real InternVL3 / Qwen2.5-VL is pretrained: the words of a question already bind to what the
frames show in its early decoder layers, which is what the paper's Image Router (a copy of those
layers) builds on. The ``tiny`` preset starts from a deterministic random fill, so this stage
supplies that premise on the synthetic task's visual vocabulary. It is never run for a real
checkpoint, and the paper's Stages 1-3 then run on its output unchanged.

Objective: a *dense presence caption* per frame, in the Image Router's own layout ``[Z_t; text]``
(frame tokens first, then text, no chat template). The text names all six colors in a random
order, each followed by the shape of the object of that color, or ``no``::

    [Z_t] red no blue circle green no yellow no magenta no cyan no

and the LM loss covers the answer after every color word. Why this form: every color word is a
query against the frame (six per frame, balanced), which is what makes the binding learnable in
minutes on a CPU; one question per frame leaves the causal layers with a single weak query and
measured no better than chance on the two-target task. Frames are pooled with a random window
(1, 2 or 4: full resolution, the Image Router's ``router_pool`` and the Fragment policy's low
tier) so the binding holds at every scale the runtime feeds. Trained: projector, LLM and LM
head; the vision tower stays at its random fill (frozen, features computed once).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from .synthetic import BACKGROUNDS, COLORS, SHAPES, Shape, VideoSpec, render_frame

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


@dataclass
class PretrainConfig:
    frames: int = 6000           # training frames rendered (and encoded) once
    heldout_frames: int = 400
    steps: int = 800
    batch_size: int = 32
    learning_rate: float = 1e-3
    warmup_steps: int = 40
    weight_decay: float = 0.0
    windows: Tuple[int, ...] = (1, 2, 4)
    two_shape_prob: float = 0.25  # frames with two shapes of different colors (binds shape to color)
    empty_prob: float = 0.12
    big_prob: float = 0.55        # else small (distractor-sized)
    seed: int = 0
    threads: int = 0              # torch threads (0: leave as is)
    output_dir: str = "runs/tiny/stage0"
    log_every: int = 50

    @classmethod
    def load(cls, name_or_path: str = "tiny_stage0", **overrides) -> "PretrainConfig":
        path = name_or_path if os.path.isfile(name_or_path) else os.path.join(
            CONFIG_DIR, f"{name_or_path}.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"stage 0 config {name_or_path!r}: no such file")
        with open(path) as f:
            d = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
        d.update(overrides)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"stage 0 config {path}: unknown fields {unknown}")
        if "windows" in d:
            d["windows"] = tuple(int(w) for w in d["windows"])
        return cls(**d)


def random_frame_spec(rng: random.Random, cfg: PretrainConfig, size: int = 448) -> VideoSpec:
    """One frame in the task's visual vocabulary: empty, one shape, or two of different colors."""
    spec = VideoSpec(num_frames=1, size=size, background=rng.choice(sorted(BACKGROUNDS)))
    u = rng.random()
    if u < cfg.empty_prob:
        return spec
    n = 2 if rng.random() < cfg.two_shape_prob else 1
    colors = rng.sample(sorted(COLORS), n)
    halves = rng.sample([(0, size // 2), (size // 2, size)], 2)  # two shapes: side by side
    for k, color in enumerate(colors):
        big = n == 1 and rng.random() < cfg.big_prob
        frac = rng.uniform(0.25, 0.29) if big else rng.uniform(0.08, 0.125)
        r = int(frac * size)
        if n == 1:
            x0, x1 = r + 4, size - r - 5
        else:
            x0, x1 = halves[k][0] + r + 2, halves[k][1] - r - 3
        spec.shapes.append(Shape(0, rng.choice(SHAPES), color, rng.randint(x0, x1),
                                 rng.randint(r + 4, size - r - 5), r))
    return spec


def caption(spec: VideoSpec, rng: random.Random) -> List[Tuple[str, str]]:
    """[(color word, answer word)] for all six colors in a random order."""
    shape_of = {s.color: s.shape for s in spec.shapes}
    order = rng.sample(sorted(COLORS), len(COLORS))
    return [(c, shape_of.get(c, "no")) for c in order]


class CaptionTokens:
    """Token ids of the caption words (each a single token of the tiny BPE with a leading space)."""

    def __init__(self, tokenizer):
        words = list(COLORS) + list(SHAPES) + ["no"]
        self.ids: Dict[str, int] = {}
        for w in words:
            ids = tokenizer(" " + w, add_special_tokens=False)["input_ids"]
            if len(ids) != 1:
                raise ValueError(f"stage 0: ' {w}' is {len(ids)} tokens in this tokenizer; "
                                 f"the dense caption needs one token per word (tiny preset only)")
            self.ids[w] = ids[0]

    def encode(self, pairs) -> Tuple[List[int], List[int]]:
        """(input ids, target ids with -100 where no loss) of one caption."""
        ids, tgt = [], []
        for color, ans in pairs:
            ids += [self.ids[color], self.ids[ans]]
            tgt += [self.ids[ans], -100]   # position of the color word predicts the answer
        return ids, tgt


def render_bank(n: int, cfg: PretrainConfig, seed: int, bb, chunk: int = 64):
    """n random frames -> (pre-projector features fp16 [n, 256, 4C], specs)."""
    from vr_runtime.video import preprocess_frames
    from .features import vision_features
    rng = random.Random(f"stage0-{seed}")
    specs = [random_frame_spec(rng, cfg) for _ in range(n)]
    spec = bb.frame_spec
    feats = []
    for i in range(0, n, chunk):
        frames = np.stack([render_frame(s, 0) for s in specs[i:i + chunk]])
        px = preprocess_frames(frames, size=spec.size[0], mean=spec.mean, std=spec.std)
        feats.append(vision_features(bb, px, chunk_size=chunk).half())
    return torch.cat(feats), specs


def _batch(bb, V, specs, idx, window, toks, rng):
    from vr_runtime.routers import pool_frames
    Z = bb.project(V[idx].float())
    if window > 1:
        Z = pool_frames(Z, window, tuple(bb.grid))
    ids, tgt = zip(*(toks.encode(caption(specs[i], rng)) for i in idx))
    ids = torch.tensor(ids)
    x = torch.cat([Z, bb.model.get_input_embeddings()(ids)], 1)
    tgt = torch.cat([torch.full((len(idx), Z.shape[1]), -100), torch.tensor(tgt)], 1)
    return x, tgt


def _loss(bb, x, tgt):
    logits = bb.forward(inputs_embeds=x, logits_to_keep=0).logits
    L = tgt.shape[1]
    return F.cross_entropy(logits[:, -L:].float().reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                           ignore_index=-100), logits[:, -L:]


@torch.no_grad()
def evaluate(bb, V, specs, toks, windows, seed: int = 1, batch: int = 50) -> dict:
    """Held-out caption accuracy per window: color-presence (answer != no) and exact answers."""
    bb.model.eval()
    out = {}
    for w in windows:
        rng = random.Random(seed)
        pres_ok = ans_ok = n = 0
        for i in range(0, len(specs), batch):
            idx = list(range(i, min(i + batch, len(specs))))
            x, tgt = _batch(bb, V, specs, idx, w, toks, rng)
            _, logits = _loss(bb, x, tgt)
            m = tgt != -100
            pred, gold = logits.argmax(-1)[m], tgt[m]
            no = toks.ids["no"]
            pres_ok += int(((pred != no) == (gold != no)).sum())
            ans_ok += int((pred == gold).sum())
            n += int(m.sum())
        out[f"window_{w}"] = {"presence_accuracy": pres_ok / n, "answer_accuracy": ans_ok / n,
                              "queries": n}
    return out


def pretrain(cfg: PretrainConfig, progress: bool = True) -> dict:
    """Run Stage 0 from the tiny preset's deterministic fill; writes ``output_dir/hf`` (the model
    Stage 1 starts from), ``model.safetensors``, ``log.jsonl`` and ``metrics.json``."""
    from vr_runtime.backbones.internvl3 import InternVL3Backbone
    from vr_runtime.tiny import init_weights_
    from .loop import save_llm
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    bb = InternVL3Backbone.tiny(device="cpu", dtype=torch.float32)
    init_weights_(bb.model, 0)   # from scratch: never the shipped weights
    toks = CaptionTokens(bb.tokenizer)
    t0 = time.time()
    V, specs = render_bank(cfg.frames, cfg, cfg.seed, bb)
    Vh, specs_h = render_bank(cfg.heldout_frames, cfg, cfg.seed + 1000, bb)
    bank_s = time.time() - t0
    vision = set(id(p) for p in bb.vision_tower().parameters())
    params = [p for p in bb.model.parameters() if id(p) not in vision]
    for p in bb.model.parameters():
        p.requires_grad_(id(p) not in vision)
    opt = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)

    def lr_at(step):
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        p = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * p))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    os.makedirs(cfg.output_dir, exist_ok=True)
    rng = random.Random(cfg.seed)
    log = open(os.path.join(cfg.output_dir, "log.jsonl"), "w")
    t1 = time.time()
    for step in range(cfg.steps):
        bb.model.train()
        idx = rng.sample(range(len(specs)), cfg.batch_size)
        x, tgt = _batch(bb, V, specs, idx, rng.choice(cfg.windows), toks, rng)
        loss, _ = _loss(bb, x, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            rec = {"step": step, "loss": round(loss.item(), 4), "lr": sched.get_last_lr()[0],
                   "elapsed_s": round(time.time() - t1, 1)}
            log.write(json.dumps(rec) + "\n")
            log.flush()
            if progress:
                print(json.dumps({"stage0": rec}), flush=True)
    log.close()
    bb.model.eval()
    metrics = evaluate(bb, Vh, specs_h, toks, cfg.windows)
    for p in bb.model.parameters():
        p.requires_grad_(True)
    save_llm(bb.model, bb.tokenizer, cfg.output_dir)
    result = {"metrics": metrics, "global_step": cfg.steps, "bank_s": round(bank_s, 1),
              "train_s": round(time.time() - t1, 1), "trainable": ["projector", "language"],
              "config": dataclasses.asdict(cfg)}
    with open(os.path.join(cfg.output_dir, "metrics.json"), "w") as f:
        json.dump(result, f, indent=2)
    return result


__all__ = ["PretrainConfig", "pretrain", "random_frame_spec", "caption", "CaptionTokens",
           "render_bank", "evaluate"]
