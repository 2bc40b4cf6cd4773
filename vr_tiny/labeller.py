"""Tiny-only: the labeller that rule (a) scores with on the synthetic task.

The paper builds frame labels with a pretrained VLM that answers from whatever frames it is shown
(Appendix A): a frame is evidence when removing it loses the answer. The shipped tiny model is
not such a model. It reads frames only under the plans its routers make (a few frames at full
resolution among pooled ones), so it cannot be asked "what if this frame were gone" at the
paper's reference, every frame at full resolution. This module trains one that can, from the
shipped weights (or any tiny checkpoint), and is never run for a real checkpoint.

Data: a fresh synthetic video for every example (``synthetic.sample_spec`` rendered, the frozen
tower's features computed on the fly), so nothing is seen twice and nothing is memorised; its
Fragment questions (each target's shape and, with ``all_absent_colors``, every absent color;
never a distractor's color, which the task does not ask about), training wordings only.

Plans: the ones rule (a) asks about with ``--mode drop``. A keep rate q ~ U(0, 1), so every
number of kept frames is about equally likely, from none to all; each kept frame gets a window
from ``windows`` (full resolution: the paper's reference). The answer is the one the kept frames
support: the target's shape when one of its frames is kept, ``none`` otherwise (nothing of that
color is on screen).

Sequences: with ``conversation`` (default) a video's questions are the turns of one chat under
one plan, so one forward pass supervises 3-5 answers; otherwise one sequence per question, each
with its own plan. The first turn is the runtime's own prompt for the plan
(``vr_runtime.training.stages.answer_sequence``): what is trained is exactly what
``option_logprobs`` scores.

Routing (``route_weight``, :class:`RouteSupervision`): plain fine-tuning on these plans learned
to answer from up to about four full-resolution frames and then said ``none`` to every shape
question at the reference (16 frames, 4,096 visual tokens; docs/TRAINING_STUDIES.md, "Rule (a)
on the synthetic task"). Attention maps of the shipped model show why
(``scripts/studies/attention_probe_tiny.py``): among all 16 frames its color words already
attend to their color's object (layer 0, about half of two heads' weight on the object's cells,
a few percent of the rows), but its answer row reads the frames directly and never the color
word, which only works when the plan highlights the evidence by resolution. So
one head of layer 1 is also trained to look from each answer row at the question's color word,
the one hop a pretrained VLM already makes.

Trained: the LLM (embeddings, decoder, LM head); the projector with ``train_projector`` (off:
Stage 0's phase A readout stays as it is); the vision tower is frozen.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import time
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

import vr_kernels
from vr_runtime import backbones
from vr_runtime.backbones.internvl3 import InternVL3Backbone
from vr_runtime.data import synthetic_videos
from vr_runtime.eval.option_scoring import option_logprobs
from vr_runtime.fingerprint import environment
from vr_runtime.runtime import VideoRouter
from vr_runtime.training.chat import chat_turns
from vr_runtime.training.config import ConfigError
from vr_runtime.training.labels import option_continuations
from vr_runtime.training.loop import save_llm
from vr_runtime.training.stages import answer_sequence
from vr_runtime.video.load import preprocess_frames

from .config_files import load_named_config
from .route import RouteSupervision

FRAGMENT_CATEGORIES = ("object_shape", "absent_color")


@dataclass
class LabellerConfig:
    init: str = "tiny"                 # the model to start from: "tiny" (shipped) or a folder
    steps: int = 600
    batch_size: int = 4                # videos per step; each brings its Fragment questions
    learning_rate: float = 3e-4
    warmup_steps: int = 30
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    windows: Tuple[int, ...] = (1,)    # window of a kept frame (1: full resolution)
    route_weight: float = 0.0          # RouteSupervision's weight (0: off)
    route_layer: int = 1
    route_head: int = 0
    train_projector: bool = False
    conversation: bool = True          # a video's questions as turns of one sequence (one plan)
    all_absent_colors: bool = True     # ask about every absent color, not only the task's one
    num_frames: int = 16
    heldout_videos: int = 40           # rendered from their own seed, never trained on
    eval_every: int = 0                # 0: evaluate at the end only
    seed: int = 0
    threads: int = 0                   # torch threads (0: leave as is)
    output_dir: str = "runs/tiny/labeller"
    log_every: int = 10

    @classmethod
    def load(cls, name_or_path: str = "tiny_labeller", **overrides) -> "LabellerConfig":
        """A JSON file, or a name in ``vr_tiny/configs``; ``ConfigError`` on a missing file,
        an unknown key or a bad value, before any model loads."""
        cfg = load_named_config(cls, name_or_path, "labeller config", overrides)
        cfg.check()
        return cfg

    def check(self) -> None:
        for name in ("steps", "batch_size", "num_frames", "log_every"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"labeller {name}: expected an int >= 1, got {v!r}")
        for name in ("warmup_steps", "heldout_videos", "eval_every", "threads"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ConfigError(f"labeller {name}: expected an int >= 0, got {v!r}")
        if not self.learning_rate > 0:
            raise ConfigError(f"labeller learning_rate: expected > 0, got {self.learning_rate}")
        if not self.windows or any(w not in (1, 2, 4, 8, 16) for w in self.windows):
            raise ConfigError(f"labeller windows: expected windows from 1, 2, 4, 8, 16, got "
                              f"{list(self.windows)}")
        need = 2 * 3 + 6   # sample_spec: two targets of up to 3 frames, up to 6 distractors
        if self.num_frames < need:
            raise ConfigError(f"labeller num_frames: the synthetic videos need >= {need}, got "
                              f"{self.num_frames}")


def video_features(bb, spec: synthetic_videos.VideoSpec) -> torch.Tensor:
    """A spec rendered frame by frame -> the frozen tower's pre-projector features [T, N, C]."""
    fs = bb.frame_spec
    frames = np.stack([synthetic_videos.render_frame(spec, t) for t in range(spec.num_frames)])
    px = preprocess_frames(frames, size=fs.size[0], mean=fs.mean, std=fs.std)
    with torch.no_grad():
        return torch.cat([f.float() for _, f in bb.vision_features(px, spec.num_frames)])


def fragment_questions(spec: synthetic_videos.VideoSpec, rng: random.Random,
                       phrasing: str = "train"):
    """The video's Fragment questions: each target's shape and one absent color."""
    return [q for q in synthetic_videos.questions(spec, rng, phrasing)
            if q["category"] in FRAGMENT_CATEGORIES]


def video_questions(spec: synthetic_videos.VideoSpec, rng: random.Random,
                    all_absent: bool = True):
    """The training questions of one video in a random order: each target's shape and, with
    ``all_absent``, every absent color (else the task's one). Never a distractor's color: the
    task does not ask about it (its small shapes may differ from frame to frame)."""
    qs = fragment_questions(spec, rng)
    if all_absent:
        absent = next(q for q in qs if q["category"] == "absent_color")
        frag = synthetic_videos.phrasings("train")[0]
        for color in spec.absent_colors():
            if color != absent["color"]:
                qs.append(dict(absent, color=color,
                               question=rng.choice(frag).format(color=color)))
    rng.shuffle(qs)
    return qs


def drop_plan(rng: random.Random, T: int, windows) -> List[int]:
    """Keep rate q ~ U(0, 1), each frame kept with probability q at a window from ``windows``,
    else dropped (0)."""
    q = rng.random()
    return [rng.choice(windows) if rng.random() < q else 0 for _ in range(T)]


def visible_answer(q: dict, plan) -> str:
    """The answer the plan's kept frames support: the shape when a frame of the queried color is
    kept, ``none`` otherwise (an absent color's answer is ``none`` under every plan)."""
    rel = [t for t, y in enumerate(q["frame_labels"]) if y]
    return q["answer"] if any(plan[t] for t in rel) else synthetic_videos.ABSENT_ANSWER


def conversation_loss(bb, Z: torch.Tensor, turns, plan, route: Optional["RouteSupervision"] = None
                      ) -> Tuple[torch.Tensor, int, Optional[torch.Tensor]]:
    """Summed cross-entropy of every answer (+ end of turn) of a conversation about one video
    under one plan, the answer token count, and (with ``route``) the routing loss (mean over
    the turns whose cue word is in the question; None otherwise). ``turns`` = [(question,
    answer), ...] or [(question, answer, cue word), ...]: the first is the runtime's prompt for
    ``plan`` (``vr_runtime.training.stages.answer_sequence``, exactly what ``option_logprobs``
    scores), the others follow it as further turns of the chat template. One forward pass
    supervises every turn."""
    if not turns:
        raise ValueError("turns: expected at least one (question, answer)")
    tok = bb.tokenizer
    q0, a0 = turns[0][:2]
    ids, n_prompt, dest, _ = answer_sequence(bb, q0, a0, plan)
    target = [-100] * n_prompt + ids[n_prompt:]
    spans = [(0, n_prompt)]                    # each turn's prompt span: its question is in it
    end = ids[-1]
    for turn in turns[1:]:
        q, a = turn[:2]
        prompt = tok(chat_turns(tok).follow_up(q), add_special_tokens=False)["input_ids"]
        ans = tok(a, add_special_tokens=False)["input_ids"] + [end]
        spans.append((len(ids), len(ids) + len(prompt)))
        ids = ids + prompt + ans
        target += [-100] * len(prompt) + ans
    kept = [t for t, w in enumerate(plan) if w]
    pos = bb.position_ids(torch.tensor(ids), [plan[t] for t in kept], [dest[t] for t in kept])
    ids_t = torch.tensor(ids, device=Z.device)
    emb = bb.model.get_input_embeddings()(ids_t)
    if kept:
        emb = vr_kernels.pool_pack(Z.to(emb.dtype), list(plan), tuple(bb.grid), out=emb, dest=dest)
    kw = {} if pos is None else {"position_ids": pos.to(emb.device)}
    pairs = []                                 # (answer-predicting row, cue row) per turn
    if route is not None:
        for turn, (a, b) in zip(turns, spans):
            cue = route.cue_id(tok, turn[2]) if len(turn) > 2 else None   # once per turn
            rows = [r for r in range(a, b) if ids[r] == cue] if cue is not None else []
            if rows:
                pairs.append((b - 1, rows[-1]))
    with (route.watch(bb) if pairs else contextlib.nullcontext()) as captured:
        h = bb.decoder()(inputs_embeds=emb[None], use_cache=False, return_dict=True,
                         **kw).last_hidden_state[0]
    at = torch.tensor([i for i, y in enumerate(target) if y != -100], device=Z.device)
    logits = bb.lm_head()(h[at - 1])              # row i - 1 predicts token i
    ce = F.cross_entropy(logits.float(), ids_t[at], reduction="sum")
    r_loss = route.loss(bb, captured, pairs) if pairs else None
    return ce, int(at.numel()), r_loss


@torch.no_grad()
def evaluate(bb, cfg: LabellerConfig, videos: int, seed: int) -> dict:
    """Accuracy of the option rule (a) picks (the most likely of the three shapes and ``none``,
    scored by ``option_logprobs`` as the label study scores) on ``videos`` held-out rendered
    videos: at the reference (every frame kept at the finest window) and under one random drop
    plan per question; by category, by question wording (training / held-out) and, for the
    random plans, by number of kept frames."""
    bb.model.eval()
    vr = VideoRouter(bb, warmup_frames=0)
    options = list(synthetic_videos.SHAPES) + [synthetic_videos.ABSENT_ANSWER]
    conts = option_continuations(bb.tokenizer, options, "option-text")
    rng = random.Random(f"labeller-heldout-{seed}")
    counts: dict = {}
    for _ in range(videos):
        spec = synthetic_videos.sample_spec(rng, num_frames=cfg.num_frames)
        Z = bb.project(video_features(bb, spec))
        for q in fragment_questions(spec, rng, "mixed"):
            ref = [min(cfg.windows)] * cfg.num_frames
            rand = drop_plan(rng, cfg.num_frames, cfg.windows)
            lp = option_logprobs(vr.lm, Z, q["question"], [ref, rand], conts)
            kept = sum(w > 0 for w in rand)
            bucket = f"random_drop/kept_{4 * ((kept - 1) // 4) + 1}-{4 * ((kept - 1) // 4) + 4}" \
                if kept else "random_drop/kept_0"
            for plan_name, plan, row in (("reference", ref, lp[0]), ("random_drop", rand, lp[1])):
                ok = options[int(row.argmax())] == visible_answer(q, plan)
                keys = [f"{plan_name}/{q['category']}", f"{plan_name}/phrasing_{q['phrasing']}",
                        plan_name] + ([bucket] if plan is rand else [])
                for key in keys:
                    c = counts.setdefault(key, [0, 0])
                    c[0] += int(ok)
                    c[1] += 1
    return {k: {"accuracy": round(a / n, 4), "questions": n} for k, (a, n) in sorted(counts.items())}


def train_labeller(cfg: LabellerConfig, progress: bool = True, results: Optional[str] = None,
                   command: str = "") -> dict:
    """Train from ``cfg.init``; writes ``output_dir/hf`` (the model ``label-study --model``
    loads), ``model.safetensors``, ``log.jsonl`` and ``metrics.json``; with ``results``, the same
    metrics with device, date, versions and ``command`` (a committed results file)."""
    cfg.check()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    bb, params = _labeller_model(cfg)
    t0 = time.time()
    history = _train_steps(bb, params, cfg, progress, t0)
    train_s = time.time() - t0
    metrics = evaluate(bb, cfg, cfg.heldout_videos, cfg.seed) if cfg.heldout_videos else {}
    save_llm(bb.model, bb.tokenizer, cfg.output_dir)
    result = {"metrics": metrics, "history": history, "global_step": cfg.steps,
              "train_s": round(train_s, 1), "config": dataclasses.asdict(cfg)}
    with open(os.path.join(cfg.output_dir, "metrics.json"), "w") as f:
        json.dump(result, f, indent=2)
    if results:
        _write_results(results, command, result)
    return result


def _labeller_model(cfg: LabellerConfig):
    """The tiny InternVL3 backbone ``cfg.init`` and its trained parameters (everything but the
    vision tower, and the projector unless ``train_projector``)."""
    bb = backbones.load_backbone(cfg.init, device="cpu", dtype=torch.float32)
    if not isinstance(bb, InternVL3Backbone):
        raise ConfigError(f"labeller init {cfg.init!r}: the synthetic labeller is tiny-InternVL3 "
                          f"only (got {type(bb).__name__})")
    frozen = set(id(p) for p in bb.vision_tower().parameters())
    if not cfg.train_projector:
        frozen |= set(id(p) for p in bb.projector().parameters())
    params = []
    for p in bb.model.parameters():
        p.requires_grad_(id(p) not in frozen)
        if id(p) not in frozen:
            params.append(p)
    return bb, params


def _train_steps(bb, params, cfg: LabellerConfig, progress: bool, t0: float) -> List[dict]:
    """``cfg.steps`` optimizer steps on freshly drawn videos, logged to ``log.jsonl``, with a
    held-out evaluation every ``eval_every`` steps; returns those evaluations."""
    from transformers import get_cosine_schedule_with_warmup
    opt = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    sched = get_cosine_schedule_with_warmup(opt, cfg.warmup_steps, cfg.steps)
    route = RouteSupervision(cfg.route_layer, cfg.route_head, cfg.route_weight) \
        if cfg.route_weight else None
    os.makedirs(cfg.output_dir, exist_ok=True)
    rng = random.Random(f"labeller-train-{cfg.seed}")
    history = []
    with open(os.path.join(cfg.output_dir, "log.jsonl"), "w") as log:
        for step in range(cfg.steps):
            bb.model.train()
            opt.zero_grad(set_to_none=True)
            total, n_tok, r_total, r_n = _accumulate_batch(bb, cfg, rng, route)
            for p in params:          # the mean over the step's answer tokens
                if p.grad is not None:
                    p.grad.div_(max(n_tok, 1))
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()
            sched.step()
            if step % cfg.log_every == 0 or step == cfg.steps - 1:
                rec = {"step": step, "loss": round(total / max(n_tok, 1), 4),
                       **({"route_loss": round(r_total / r_n, 4)} if r_n else {}),
                       "lr": sched.get_last_lr()[0], "elapsed_s": round(time.time() - t0, 1)}
                log.write(json.dumps(rec) + "\n")
                log.flush()
                if progress:
                    print(json.dumps({"labeller": rec}), flush=True)
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
                ev = evaluate(bb, cfg, cfg.heldout_videos, cfg.seed)
                history.append({"step": step + 1, **{k: v["accuracy"] for k, v in ev.items()}})
                log.write(json.dumps({"eval": history[-1]}) + "\n")
                if progress:
                    print(json.dumps({"labeller_eval": history[-1]}), flush=True)
    return history


def _accumulate_batch(bb, cfg: LabellerConfig, rng: random.Random, route):
    """Gradients of one step's ``batch_size`` videos, one sequence at a time (one graph alive
    at a time); returns (answer-token loss sum, answer tokens, route loss sum, route terms)."""
    total, n_tok, r_total, r_n = 0.0, 0, 0.0, 0
    for _ in range(cfg.batch_size):
        spec = synthetic_videos.sample_spec(rng, num_frames=cfg.num_frames)
        V = video_features(bb, spec)
        with torch.set_grad_enabled(cfg.train_projector):
            Z = bb.project(V)
        qs = video_questions(spec, rng, cfg.all_absent_colors)
        convs = [qs] if cfg.conversation else [[q] for q in qs]
        for conv in convs:
            plan = drop_plan(rng, cfg.num_frames, cfg.windows)
            turns = [(q["question"], visible_answer(q, plan), q["color"]) for q in conv]
            ce, n, r_loss = conversation_loss(bb, Z, turns, plan, route)
            loss = ce             # divided by the step's answer tokens by the caller
            if r_loss is not None:   # weighted like its sequence's answer tokens
                loss = loss + route.weight * n * r_loss
                r_total += r_loss.item()
                r_n += 1
            loss.backward()
            total += ce.item()
            n_tok += n
    return total, n_tok, r_total, r_n


def _write_results(results: str, command: str, result: dict) -> None:
    """The committed results file: the metrics with device, date, versions and command."""
    os.makedirs(os.path.dirname(os.path.abspath(results)), exist_ok=True)
    tmp = results + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"what": "the synthetic task's labeller (vr_tiny/labeller.py): "
                           "option accuracy on held-out rendered videos, at the reference "
                           "(every frame at full resolution) and under random drop plans",
                   "command": command, **environment(),
                   "torch_threads": torch.get_num_threads(), **result}, f, indent=2)
    os.replace(tmp, results)


__all__ = ["LabellerConfig", "train_labeller", "evaluate", "drop_plan", "visible_answer",
           "conversation_loss", "video_questions", "video_features", "fragment_questions"]
