"""Stage 0, tiny-only: teach the tiny model to *see* before the paper's three stages run.

A real InternVL3 / Qwen2.5-VL is pretrained: the words of a question already bind to what the
frames show in its early decoder layers, which is what the paper's Image Router (a copy of those
layers) builds on. The ``tiny`` preset starts from a deterministic random fill, so this stage
supplies that premise on the synthetic task's visual vocabulary. It is never run for a real
checkpoint, and the paper's Stages 1-3 then run on its output unchanged.

Two phases (three with phase T); the vision tower stays at its random fill (frozen, features
computed once) unless phase T trains it first.

Phase T (``tower_steps``, off in the shipped config): the tower and the projector train on fresh
frames with a ``CellReadout`` (every cell an object covers at least half names its color and
shape). Why: in the random tower an interior cell's token says nothing of its object's shape,
before or after any projector, so a color word's read of its color's cells cannot bind a shape
(``scripts/studies/shape_cells_tiny.py``). Measured (``scripts/studies/tower_cells_tiny.py``,
``studies/results/stage0/stage0_variants.json``): phase T carries the shape inward, and the LLM then
binds worse than without it; more caption steps (phase B) are what bind.

Phase A (``projector_steps``): the projector alone, with a linear ``ObjectReadout`` that names an
object's color and shape from the coverage-weighted mean of its projected tokens (or, with
``projector_readout`` "cells", the ``CellReadout`` of phase T), at a random
pooling window. A mean over an object's tokens is what an attention head of the LLM reads when a
color word attends to that color, so this hands the LLM a readout it can use. Without it the LLM
learned color presence but not shapes from the captions (docs/TRAINING_STUDIES.md, Stage 0).

Phase B: a *dense presence caption* per frame, projector frozen, in the Image Router's own layout
``[Z_t; text]`` (frame tokens first, then text, no chat template). The text names all six colors
in a random order, each followed by the shape of the object of that color, or ``no``::

    [Z_t] red no blue circle green no yellow no magenta no cyan no

and the LM loss covers the answer after every color word. Why this form: every color word is a
query against the frame (six per frame, balanced), which is what makes the binding learnable in
minutes on a CPU; one question per frame leaves the causal layers with a single weak query and
measured no better than chance on the two-target task. Frames are pooled with a random window
(1, 2 or 4: full resolution, the Image Router's ``router_pool`` and the Fragment policy's low
tier) so the binding holds at every scale the runtime feeds. Trained: LLM and LM head.

Options measured while looking for shape recognition, all off in the shipped config
(``scripts/studies/stage0_variant.py``, ``studies/results/stage0/stage0_variants.json``): ``shape_query_prob``
(``shape``-mode captions, "which color is the circle"), ``shape_weight`` (up-weight shape
answers) and ``train_vision`` (train the tower on fresh frames at ``vision_learning_rate``; no
phase A then).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import time
from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from vr_runtime.backbones.internvl3 import InternVL3Backbone
from vr_runtime.backbones.tiny import init_weights_
from vr_runtime.routing.routers import pool_frames
from vr_runtime.video.load import preprocess_frames

from vr_runtime.data.synthetic_videos import (BACKGROUNDS, COLORS, SHAPES, Shape, VideoSpec,
                                              render_frame, shape_mask)
from vr_runtime.training.config import ConfigError
from vr_runtime.training.loop import save_llm

from .config_files import load_named_config

READOUT_NAMES = ("coverage", "cells")   # phase A's readouts (``READOUTS``)


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
    two_shape_prob: float = 0.25  # two shapes of different colors (binds shape to color)
    empty_prob: float = 0.12
    big_prob: float = 0.55        # else small (distractor-sized)
    # Options measured while looking for shape recognition (docs/TRAINING_STUDIES.md, Stage 0); the
    # shipped weights use none of them (0.0 / 1.0 / False), only phase A below.
    shape_query_prob: float = 0.0  # batches captioned in ``shape`` mode (see ``caption``)
    shape_weight: float = 1.0     # loss weight of the positions whose answer is a shape
    train_vision: bool = False    # train the vision tower too (fresh frames rendered every step)
    vision_learning_rate: float = 1e-5  # the tower's own learning rate when it trains
    # Phase A (before the captions): train the projector alone so that the coverage-weighted
    # mean of an object's projected tokens names its color and shape through a linear readout;
    # phase B then keeps the projector frozen. 0: no phase A, the projector trains in phase B
    # (the recipe before shapes were learned; measured in studies/results/stage0/stage0_variants.json).
    projector_steps: int = 3000
    projector_learning_rate: float = 3e-3
    # Phase A's readout: "coverage" (``ObjectReadout``, shipped) or "cells" (``CellReadout``:
    # every cell an object covers at least half names it, so interior cells must carry shape).
    projector_readout: str = "coverage"
    # Phase T (before the bank): the tower and the projector train on ``CellReadout`` on fresh
    # frames; 0 (shipped): the tower stays at its random fill, whose interior cells carry no
    # shape at all (studies/results/stage0/shape_cells.json; phase T carries it inward, and
    # the LLM then binds worse: tower_cells.json and stage0_variants.json "tower_cells").
    tower_steps: int = 0
    tower_learning_rate: float = 5e-4
    tower_batch_size: int = 16
    seed: int = 0
    threads: int = 0              # torch threads (0: leave as is)
    output_dir: str = "runs/tiny/stage0"
    log_every: int = 50

    def __post_init__(self):
        if self.projector_readout not in READOUT_NAMES:
            raise ConfigError(f"projector_readout: expected one of {', '.join(READOUT_NAMES)}, "
                              f"got {self.projector_readout!r}")
        if self.tower_steps < 0 or self.tower_batch_size < 1:
            raise ConfigError(f"tower_steps, tower_batch_size: expected >= 0 and >= 1, got "
                              f"{self.tower_steps} and {self.tower_batch_size}")
        if self.tower_steps and self.train_vision:
            raise ConfigError("tower_steps trains the tower before the captions; it does not "
                              "combine with train_vision (set one)")

    @classmethod
    def load(cls, name_or_path: str = "tiny_stage0", **overrides) -> "PretrainConfig":
        """A JSON file, or a name in ``vr_tiny/configs`` (``tiny_stage0``); ``ConfigError`` on
        a missing file or an unknown key."""
        return load_named_config(cls, name_or_path, "stage 0 config", overrides)


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
        shape = rng.choice(SHAPES)
        if cfg.shape_query_prob > 0 and k == 1 and shape == spec.shapes[0].shape:
            # a shape query must name one object; the replacement draws nothing from rng, so
            # frames without shape queries stay the ones the shipped weights were trained on
            shape = SHAPES[(SHAPES.index(shape) + 1) % len(SHAPES)]
        spec.shapes.append(Shape(0, shape, color, rng.randint(x0, x1),
                                 rng.randint(r + 4, size - r - 5), r))
    return spec


CAPTION_MODES = ("color", "shape")


def caption(spec: VideoSpec, rng: random.Random, mode: str = "color") -> List[Tuple[str, str]]:
    """[(query word, answer word)] of one frame.

    ``color``: the six colors in a random order, each answered by its object's shape or ``no``.
    ``shape``: the three shapes in a random order, each answered by its object's color or ``no``;
    this asks the model to find an object by its outline, which color queries alone never
    require. The two modes are never mixed in one caption: the second half would copy its
    answers from the first half's text instead of reading the frame."""
    if mode == "color":
        shape_of = {s.color: s.shape for s in spec.shapes}
        return [(c, shape_of.get(c, "no")) for c in rng.sample(sorted(COLORS), len(COLORS))]
    if mode == "shape":
        color_of = {s.shape: s.color for s in spec.shapes}
        return [(sh, color_of.get(sh, "no")) for sh in rng.sample(SHAPES, len(SHAPES))]
    raise ValueError(f"caption mode {mode!r}: use one of {CAPTION_MODES}")


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


def frame_features(bb, specs: List[VideoSpec], chunk: int = 64) -> torch.Tensor:
    """Render one-frame specs -> pre-projector features [n, 256, 4C] (fp32; differentiable
    through the vision tower when grad is enabled and the tower trains)."""
    spec = bb.frame_spec
    out = []
    for i in range(0, len(specs), chunk):
        frames = np.stack([render_frame(s, 0) for s in specs[i:i + chunk]])
        px = preprocess_frames(frames, size=spec.size[0], mean=spec.mean, std=spec.std)
        # not features.vision_features: that one runs under no_grad, and train_vision needs
        # the tower's gradients
        out += [f.float() for _, f in bb.vision_features(px, chunk)]
    return torch.cat(out)


def render_bank(n: int, cfg: PretrainConfig, seed: int, bb, chunk: int = 64):
    """n random frames -> (pre-projector features fp16 [n, 256, 4C], specs)."""
    rng = random.Random(f"stage0-{seed}")
    specs = [random_frame_spec(rng, cfg) for _ in range(n)]
    with torch.no_grad():
        feats = [frame_features(bb, specs[i:i + chunk], chunk).half()
                 for i in range(0, n, chunk)]
    return torch.cat(feats), specs


def object_coverage(spec: VideoSpec, grid=(16, 16)) -> List[Tuple[torch.Tensor, int, int]]:
    """Per object of a one-frame spec: (fraction of each token's cell it covers [H*W], color
    index, shape index). Token (i, j) of the row-major grid covers pixels [i*c, (i+1)*c) x
    [j*c, (j+1)*c), c = size / grid (28 px at 448 and 16x16: patch 14, pixel shuffle 0.5)."""
    gh, gw = grid
    ch, cw = spec.size // gh, spec.size // gw
    out = []
    for s in spec.shapes:
        m = shape_mask(s.shape, s.cx, s.cy, s.r, spec.size)[:gh * ch, :gw * cw]
        cov = m.reshape(gh, ch, gw, cw).mean((1, 3)).reshape(-1)
        out.append((torch.from_numpy(cov).float(), sorted(COLORS).index(s.color),
                    SHAPES.index(s.shape)))
    return out


def pooled_objects(objects, window: int, grid):
    """objects[i] = ``object_coverage`` of frame i -> every object's (frame [n_obj], coverage
    pooled with ``window`` [n_obj, cells], color [n_obj], shape [n_obj]), pooled in one call."""
    flat = [(f, cov, color, shape) for f, objs in enumerate(objects)
            for cov, color, shape in objs]
    frame, covs, colors, shapes = zip(*flat)
    C = torch.stack(covs)
    if window > 1:
        C = pool_frames(C[..., None], window, grid)[..., 0]
    return torch.tensor(frame), C, torch.tensor(colors), torch.tensor(shapes)


class _Readout(torch.nn.Module):
    """One linear map from a token (or a mean of tokens) to color and shape logits; the
    subclasses choose which rows of the tokens it reads (``READOUTS``)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.linear = torch.nn.Linear(hidden, len(COLORS) + len(SHAPES))


class ObjectReadout(_Readout):
    """Phase A's probe: color and shape logits from the coverage-weighted mean of an object's
    projected tokens. A mean over the object's tokens is what one attention head of the LLM
    reads when a color word attends to that color, and a mean of pooled tokens is a mean of
    means, so the readout that works here also works at every pooling window."""

    def forward(self, Z: torch.Tensor, objects, window: int, grid) -> torch.Tensor:
        """Z [b, n, D] (already pooled with ``window``), objects[i] = ``object_coverage`` of frame
        i -> (logits [n_obj, colors + shapes], color targets, shape targets)."""
        frame, C, colors, shapes = pooled_objects(objects, window, grid)
        rows = (Z[frame] * (C / C.sum(1, keepdim=True))[..., None]).sum(1)
        return self.linear(rows), colors, shapes


class CellReadout(_Readout):
    """Color and shape logits from each cell an object covers at least half, one cell at a
    time. Why: a color word's attention picks the cells of its color, the interior ones most;
    with this readout those cells name the shape too (``ObjectReadout``'s coverage-weighted mean
    leaves it in the boundary cells). A pooled cell is judged by its pooled coverage."""

    def forward(self, Z: torch.Tensor, objects, window: int, grid) -> torch.Tensor:
        """Z [b, n, D] (already pooled with ``window``), objects[i] = ``object_coverage`` of frame
        i -> (logits [cells, colors + shapes], color targets, shape targets)."""
        frame, C, colors, shapes = pooled_objects(objects, window, grid)
        obj, cell = torch.nonzero(C >= 0.5, as_tuple=True)
        if not len(obj):   # only objects too small to cover half a cell: the nearest cells
            obj, cell = torch.arange(len(C)), C.argmax(1)
        return self.linear(Z[frame[obj], cell]), colors[obj], shapes[obj]


READOUTS = {"coverage": ObjectReadout, "cells": CellReadout}


def _readout_loss(readout, bb, V, objects, window):
    """Phase A's loss and accuracies on a batch of pre-projector features ``V``."""
    Z = bb.project(V.float())
    if window > 1:
        Z = pool_frames(Z, window, tuple(bb.grid))
    logits, colors, shapes = readout(Z, objects, window, tuple(bb.grid))
    nc = len(COLORS)
    loss = F.cross_entropy(logits[:, :nc], colors) + F.cross_entropy(logits[:, nc:], shapes)
    return loss, {"color_accuracy": (logits[:, :nc].argmax(-1) == colors).float().mean().item(),
                  "shape_accuracy": (logits[:, nc:].argmax(-1) == shapes).float().mean().item()}


def _log_record(log, rec: dict, progress: bool) -> None:
    """One line of a Stage 0 phase's log (flushed: a killed run keeps what it logged), echoed
    to stdout with ``progress``."""
    log.write(json.dumps(rec) + "\n")
    log.flush()
    if progress:
        print(json.dumps({"stage0": rec}), flush=True)


def pretrain_projector(bb, V, specs, cfg: "PretrainConfig", rng: random.Random, log=None,
                       progress: bool = False) -> torch.nn.Module:
    """Phase A: ``cfg.projector_steps`` AdamW steps on the projector and the readout named by
    ``cfg.projector_readout`` (``READOUTS``; discarded afterwards), frames from the bank, a
    random window per step."""
    objects = [object_coverage(s, tuple(bb.grid)) for s in specs]
    with_objects = [i for i, o in enumerate(objects) if o]
    readout = READOUTS[cfg.projector_readout](bb.model.config.text_config.hidden_size)
    for p in bb.model.parameters():   # the projector alone: the tower's features are a bank
        p.requires_grad_(False)
    for p in bb.projector().parameters():
        p.requires_grad_(True)
    params = list(bb.projector().parameters()) + list(readout.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.projector_learning_rate,
                            weight_decay=cfg.weight_decay)
    t0 = time.time()
    for step in range(cfg.projector_steps):
        idx = rng.sample(with_objects, min(cfg.batch_size, len(with_objects)))
        loss, acc = _readout_loss(readout, bb, V[idx], [objects[i] for i in idx],
                                  rng.choice(cfg.windows))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if log is not None and (step % (cfg.log_every * 4) == 0
                                or step == cfg.projector_steps - 1):
            _log_record(log, {"projector_step": step, "loss": round(loss.item(), 4),
                              "elapsed_s": round(time.time() - t0, 1)}, progress)
    return readout


def pretrain_tower(bb, cfg: "PretrainConfig", rng: random.Random, log=None,
                   progress: bool = False) -> CellReadout:
    """Phase T: ``cfg.tower_steps`` AdamW steps on the tower (at ``tower_learning_rate``), the
    projector and a ``CellReadout`` (discarded afterwards), fresh frames every step, full
    resolution. Leaves every weight frozen."""
    readout = CellReadout(bb.model.config.text_config.hidden_size)
    tower, proj = bb.vision_tower(), bb.projector()
    for p in bb.model.parameters():
        p.requires_grad_(False)
    for p in list(tower.parameters()) + list(proj.parameters()):
        p.requires_grad_(True)
    opt = torch.optim.AdamW([{"params": list(tower.parameters()), "lr": cfg.tower_learning_rate},
                             {"params": list(proj.parameters()) + list(readout.parameters())}],
                            lr=cfg.projector_learning_rate, weight_decay=cfg.weight_decay)
    t0 = time.time()
    for step in range(cfg.tower_steps):
        specs = [random_frame_spec(rng, cfg) for _ in range(cfg.tower_batch_size)]
        objects = [object_coverage(s, tuple(bb.grid)) for s in specs]
        keep = [i for i, o in enumerate(objects) if o]
        if not keep:
            continue
        V = frame_features(bb, [specs[i] for i in keep], chunk=len(keep))
        loss, _ = _readout_loss(readout, bb, V, [objects[i] for i in keep], 1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for g in opt.param_groups:   # per group, as the captions clip theirs
            torch.nn.utils.clip_grad_norm_(g["params"], 1.0)
        opt.step()
        if log is not None and (step % cfg.log_every == 0 or step == cfg.tower_steps - 1):
            _log_record(log, {"tower_step": step, "loss": round(loss.item(), 4),
                              "elapsed_s": round(time.time() - t0, 1)}, progress)
    for p in bb.model.parameters():
        p.requires_grad_(False)
    return readout


@torch.no_grad()
def evaluate_readout(readout, bb, V, specs, windows) -> dict:
    """Phase A's held-out color and shape accuracy of the readout per window."""
    objects = [object_coverage(s, tuple(bb.grid)) for s in specs]
    keep = [i for i, o in enumerate(objects) if o]
    return {f"window_{w}": _readout_loss(readout, bb, V[keep], [objects[i] for i in keep], w)[1]
            for w in windows}


def _batch(bb, V, specs, window, toks, rng, mode="color"):
    """Features ``V`` [b, 256, 4C] of frames ``specs`` -> (inputs_embeds [Z_t; caption], targets
    over the caption positions)."""
    Z = bb.project(V.float())
    if window > 1:
        Z = pool_frames(Z, window, tuple(bb.grid))
    ids, tgt = zip(*(toks.encode(caption(s, rng, mode)) for s in specs))
    ids = torch.tensor(ids)
    x = torch.cat([Z, bb.model.get_input_embeddings()(ids)], 1)
    return x, torch.tensor(tgt)


def _loss(bb, x, tgt, weight=None):
    """Mean cross-entropy over the caption's answer positions (``tgt`` covers the text, the last
    ``tgt.shape[1]`` positions of ``x``), each weighted by ``weight`` (default 1)."""
    L = tgt.shape[1]
    logits = bb.forward(inputs_embeds=x, logits_to_keep=L).logits
    ce = F.cross_entropy(logits[:, -L:].float().reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                         ignore_index=-100, reduction="none")
    m = (tgt.reshape(-1) != -100).float()
    w = m if weight is None else m * weight.reshape(-1)
    return (ce * w).sum() / w.sum(), logits[:, -L:]


def shape_answer_weight(tgt: torch.Tensor, toks: "CaptionTokens", weight: float):
    """Per-position loss weights: ``weight`` where the answer is a shape word, else 1."""
    shape_ids = torch.tensor([toks.ids[s] for s in SHAPES])
    return torch.where(torch.isin(tgt, shape_ids), weight, 1.0)


@torch.no_grad()
def evaluate(bb, V, specs, toks, windows, seed: int = 1, batch: int = 50) -> dict:
    """Held-out caption accuracy per window, split by what each query asks:

    - ``presence_accuracy``: ``color`` captions, "is this color there" (answer != ``no``);
    - ``shape_accuracy``: ``color`` captions, the exact shape of each present color;
    - ``binding_accuracy``: the same, on frames whose two objects differ in shape (a shape
      named without its color's binding is a coin there);
    - ``locate_accuracy``: ``shape`` captions, the exact color (or ``no``) of each shape;
    - ``locate_present_accuracy``: the same, over the shapes that are there.
    """
    bb.model.eval()
    no = toks.ids["no"]
    out = {}
    for w in windows:
        rng = random.Random(seed)
        c = dict.fromkeys(("pres", "pres_n", "shape", "shape_n", "bind", "bind_n", "loc",
                           "loc_n", "locp", "locp_n"), 0)
        for mode in CAPTION_MODES:
            for i in range(0, len(specs), batch):
                sl = slice(i, min(i + batch, len(specs)))
                x, tgt = _batch(bb, V[sl], specs[sl], w, toks, rng, mode)
                _, logits = _loss(bb, x, tgt)
                pred, m = logits.argmax(-1), tgt != -100
                ok, present = pred == tgt, m & (tgt != no)
                if mode == "color":
                    c["pres"] += int(((pred != no) == (tgt != no))[m].sum())
                    c["pres_n"] += int(m.sum())
                    c["shape"] += int(ok[present].sum())
                    c["shape_n"] += int(present.sum())
                    two = torch.tensor([len({o.shape for o in sp.shapes}) == 2
                                        for sp in specs[sl]])[:, None] & present
                    c["bind"] += int(ok[two].sum())
                    c["bind_n"] += int(two.sum())
                else:
                    c["loc"] += int(ok[m].sum())
                    c["loc_n"] += int(m.sum())
                    c["locp"] += int(ok[present].sum())
                    c["locp_n"] += int(present.sum())
        out[f"window_{w}"] = {
            "presence_accuracy": c["pres"] / max(1, c["pres_n"]),
            "shape_accuracy": c["shape"] / max(1, c["shape_n"]),
            "binding_accuracy": c["bind"] / max(1, c["bind_n"]),
            "binding_queries": c["bind_n"],
            "locate_accuracy": c["loc"] / max(1, c["loc_n"]),
            "locate_present_accuracy": c["locp"] / max(1, c["locp_n"]),
            "queries": c["pres_n"] + c["loc_n"]}
    return out


def pretrain(cfg: PretrainConfig, progress: bool = True) -> dict:
    """Run Stage 0 from the tiny preset's deterministic fill; writes ``output_dir/hf`` (the model
    Stage 1 starts from), ``model.safetensors``, ``log.jsonl`` and ``metrics.json``."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    bb = InternVL3Backbone.tiny(device="cpu", dtype=torch.float32)
    init_weights_(bb.model, 0)   # from scratch: never the shipped weights
    toks = CaptionTokens(bb.tokenizer)
    os.makedirs(cfg.output_dir, exist_ok=True)
    log = open(os.path.join(cfg.output_dir, "log.jsonl"), "w")
    t0 = time.time()
    if cfg.tower_steps:   # phase T: the tower learns before its features are banked
        pretrain_tower(bb, cfg, random.Random(f"stage0-tower-{cfg.seed}"), log, progress)
    tower_s = time.time() - t0
    t0 = time.time()
    V = specs = None
    if not cfg.train_vision:   # the tower is fixed: encode a bank of frames once
        V, specs = render_bank(cfg.frames, cfg, cfg.seed, bb)
    bank_s = time.time() - t0
    readout, projector_s = None, 0.0
    if cfg.projector_steps:
        if cfg.train_vision:
            raise ValueError("stage 0: projector_steps needs the frame bank; it does not combine "
                             "with train_vision")
        t = time.time()
        readout = pretrain_projector(bb, V, specs, cfg, random.Random(f"stage0-proj-{cfg.seed}"),
                                     log, progress)
        projector_s = time.time() - t
    optim = _caption_optimizer(bb, cfg)
    t1 = time.time()

    def record(rec: dict) -> None:
        _log_record(log, {**rec, "elapsed_s": round(time.time() - t1, 1)}, progress)

    _caption_steps(bb, cfg, V, specs, toks, optim, record)
    log.close()
    bb.model.eval()
    train_s = time.time() - t1
    Vh, specs_h = render_bank(cfg.heldout_frames, cfg, cfg.seed + 1000, bb)  # the final tower
    metrics = evaluate(bb, Vh, specs_h, toks, cfg.windows)
    if readout is not None:
        metrics["projector_readout"] = evaluate_readout(readout, bb, Vh, specs_h, cfg.windows)
    save_llm(bb.model, bb.tokenizer, cfg.output_dir)
    result = {"metrics": metrics, "global_step": cfg.steps, "bank_s": round(bank_s, 1),
              **({"tower_s": round(tower_s, 1)} if cfg.tower_steps else {}),
              "projector_s": round(projector_s, 1), "train_s": round(train_s, 1),
              "trainable": (["vision"] if cfg.train_vision or cfg.tower_steps else [])
              + ["projector", "language"],
              "projector_frozen_in_captions": bool(cfg.projector_steps),
              "config": dataclasses.asdict(cfg)}
    with open(os.path.join(cfg.output_dir, "metrics.json"), "w") as f:
        json.dump(result, f, indent=2)
    return result


def _caption_optimizer(bb, cfg: PretrainConfig):
    """AdamW over the captioning phase's trainable weights (the tower at its own learning rate
    when ``train_vision``; the projector frozen after a projector phase), with warm-up + cosine."""
    vision = set(id(p) for p in bb.vision_tower().parameters())
    frozen = set() if cfg.train_vision else vision
    if cfg.projector_steps:   # phase A trained it; phase B keeps what it learned
        frozen = frozen | set(id(p) for p in bb.projector().parameters())
    params = [p for p in bb.model.parameters() if id(p) not in frozen]
    trainable = set(id(p) for p in params)
    for p in bb.model.parameters():
        p.requires_grad_(id(p) in trainable)
    groups = [{"params": [p for p in params if id(p) not in vision]},
              {"params": [p for p in params if id(p) in vision], "lr": cfg.vision_learning_rate}]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.learning_rate,
                            weight_decay=cfg.weight_decay)

    def lr_at(step):
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        p = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * p))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_at)


def _caption_steps(bb, cfg: PretrainConfig, V, specs, toks, optim, record) -> None:
    """The captioning phase: ``cfg.steps`` steps on batches from the frame bank (or fresh
    frames every step when ``train_vision``) with ``optim`` (``_caption_optimizer``'s optimizer
    and schedule), each logged step passed to ``record``."""
    opt, sched = optim
    rng = random.Random(cfg.seed)
    frame_rng = random.Random(f"stage0-{cfg.seed}")   # the fresh frames of train_vision
    for step in range(cfg.steps):
        bb.model.train()
        if cfg.train_vision:   # fresh frames every step: the tower sees no frame twice
            bspecs = [random_frame_spec(frame_rng, cfg) for _ in range(cfg.batch_size)]
            Vb = frame_features(bb, bspecs)
        else:
            idx = rng.sample(range(len(specs)), cfg.batch_size)
            Vb, bspecs = V[idx], [specs[i] for i in idx]
        # no draw without shape queries: the shipped run's random sequence is unchanged
        mode = "shape" if cfg.shape_query_prob and rng.random() < cfg.shape_query_prob else "color"
        x, tgt = _batch(bb, Vb, bspecs, rng.choice(cfg.windows), toks, rng, mode)
        loss, _ = _loss(bb, x, tgt, shape_answer_weight(tgt, toks, cfg.shape_weight))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for g in opt.param_groups:   # per group: the tower's large gradients must not
            torch.nn.utils.clip_grad_norm_(g["params"], 1.0)   # scale the LLM's to nothing
        opt.step()
        sched.step()
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            record({"step": step, "loss": round(loss.item(), 4), "lr": sched.get_last_lr()[0]})


__all__ = ["PretrainConfig", "pretrain", "random_frame_spec", "caption", "CaptionTokens",
           "render_bank", "frame_features", "evaluate", "shape_answer_weight", "CAPTION_MODES",
           "object_coverage", "pooled_objects", "ObjectReadout", "CellReadout", "READOUTS",
           "pretrain_projector", "pretrain_tower", "evaluate_readout"]
