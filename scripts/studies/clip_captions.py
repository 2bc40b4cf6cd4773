"""Study (tiny only, not shipped): Stage 0's presence captions over clips of several frames.

The dense probes (docs/TRAINING_STUDIES.md, recipe v3; their files at commit 507b324) found that the tiny answerer does not bind
a question's colour to one frame among several: under ``auto`` the Image Router does. Stage 0
made single-frame binding learnable with *presence captions*, six colour queries a frame
(training/pretrain.py). This study asks whether the same captions over clips of K full-resolution
frames, in the runtime's video prompt, teach the multi-frame binding that a dense prompt needs:

    <video prompt of K frames, "Name the shape of each color."> red no blue circle green square ...

Frames come from Stage 0's frame bank (0-2 objects a frame, random backgrounds); a clip never
holds one colour in two shapes. The caption answers each colour with its shape anywhere in the
clip, or ``no``; the loss covers the answers only. The LLM and LM head train; the vision tower
and projector stay as they are. Then evaluate with ``python -m vr_runtime.eval --methods
dense,auto`` on the synthetic Video-MME layout (the study's README has the commands).

    python scripts/studies/clip_captions.py MODEL_DIR ROUTERS OUT_DIR [--steps N] [--lr X]
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import shutil
import time

import torch

import vr_kernels
from vr_runtime.backbones.internvl3 import InternVL3Backbone
from vr_runtime.backbones.prompt import plan_dest
from vr_runtime.training.loop import save_llm
from vr_tiny.pretrain import (CaptionTokens, PretrainConfig, _loss, caption,
                                          render_bank)

QUESTION = "Name the shape of each color."


def draw_clip(rng: random.Random, specs, k: int):
    """k bank indices whose objects never give one colour two shapes."""
    shape_of, idx = {}, []
    while len(idx) < k:
        i = rng.randrange(len(specs))
        objs = {s.color: s.shape for s in specs[i].shapes}
        if i in idx or any(shape_of.get(c, sh) != sh for c, sh in objs.items()):
            continue
        shape_of.update(objs)
        idx.append(i)
    return idx


class _Union:
    """The clip's objects, as ``caption`` reads a spec."""

    def __init__(self, specs):
        self.shapes = [s for spec in specs for s in spec.shapes]


def clip_batch(bb, V, specs, toks, rng, k: int, batch: int):
    """(inputs_embeds [batch, L, D], targets over the caption) of ``batch`` clips of k frames."""
    ids, starts = bb.build_prompt(QUESTION, [bb.grid[0] * bb.grid[1]] * k)
    dest = plan_dest([bb.grid[0] * bb.grid[1]] * k, starts)
    xs, tgts = [], []
    for _ in range(batch):
        idx = draw_clip(rng, specs, k)
        cap_ids, cap_tgt = toks.encode(caption(_Union([specs[i] for i in idx]), rng))
        Z = bb.project(V[idx].float())                                   # [k, 256, D]
        emb = bb.model.get_input_embeddings()(torch.tensor(ids.tolist() + cap_ids))
        xs.append(vr_kernels.pool_pack(Z, [1] * k, tuple(bb.grid), out=emb, dest=dest,
                                       backend="torch"))
        tgts.append(cap_tgt)
    return torch.stack(xs), torch.tensor(tgts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("routers")
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--frames", type=int, default=2000, help="frame bank size")
    ap.add_argument("--clip-frames", default="2,4,8", help="K values drawn per step")
    ap.add_argument("--tokens-per-step", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args(argv)
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    bb = InternVL3Backbone.load(pathlib.Path(a.model), device="cpu", dtype=torch.float32)
    toks = CaptionTokens(bb.tokenizer)
    t0 = time.time()
    V, specs = render_bank(a.frames, PretrainConfig(), a.seed, bb)
    bank_s = time.time() - t0
    lm = list(bb.decoder().parameters()) + list(bb.lm_head().parameters())
    keep = {id(p) for p in lm}
    for p in bb.model.parameters():
        p.requires_grad_(id(p) in keep)
    opt = torch.optim.AdamW(lm, lr=a.lr, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * max(0.0, 1 - s / a.steps))
    ks = [int(k) for k in a.clip_frames.split(",")]
    os.makedirs(a.out, exist_ok=True)
    log = open(os.path.join(a.out, "log.jsonl"), "w")
    t1 = time.time()
    bb.model.train()
    for step in range(a.steps):
        k = rng.choice(ks)
        x, tgt = clip_batch(bb, V, specs, toks, rng, k, max(1, a.tokens_per_step // (256 * k)))
        loss, _ = _loss(bb, x, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm, 1.0)
        opt.step()
        sched.step()
        if step % 10 == 0 or step == a.steps - 1:
            log.write(json.dumps({"step": step, "k": k, "loss": round(loss.item(), 4),
                                  "elapsed_s": round(time.time() - t1, 1)}) + "\n")
            log.flush()
    log.close()
    bb.model.eval()
    save_llm(bb.model, bb.tokenizer, a.out)
    shutil.copyfile(a.routers, os.path.join(a.out, "routers.safetensors"))
    with open(os.path.join(a.out, "metrics.json"), "w") as f:
        json.dump({"args": vars(a), "bank_s": round(bank_s, 1),
                   "train_s": round(time.time() - t1, 1)}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
