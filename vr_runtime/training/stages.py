"""The three stages as one module: freezing per the paper's table and each stage's loss.

``Trainee`` holds the InternVL model and the routers, so one ``nn.Module`` goes through
accelerate (DDP / FSDP / DeepSpeed). ``forward(batch)`` returns the stage's loss and parts.

- Stage 1: L_img = mean over frames of BCE(frame logit, y_t)    (shadow stack + Image Router)
- Stage 2: L_sem = CE(policy logits, y_s)                         (Semantic Router)
- Stage 3: L_LM + lambda_s L_sem + lambda_v L_img with the compressed visual sequence built by
  ``vr_kernels.pool_pack`` straight into the placeholder rows of ``inputs_embeds``; the plan
  (which frame gets which window) is decided under ``no_grad`` from the routers' outputs (or the
  labels), so re-running the forward under activation checkpointing yields the same plan.

A curriculum beyond the paper's changes how a Stage 3 example is laid out and adds terms to its
loss through the two seams of ``curriculum.py``; the paper's is the default.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

import vr_kernels
from vr_kernels import pooled_counts
from vr_runtime.backbones.base import deepstack_kwargs
from vr_runtime.backbones.prompt import plan_dest
from vr_runtime.planning.policies import Windows, get_planner, plan_fitted, relevant_from_logits

from .chat import chat_turns
from .curriculum import LaidSequence, Layout, curriculum_for

GROUPS = ("vision", "projector", "language", "extractor", "semantic", "image")


def param_groups(bb, routers: nn.Module) -> Dict[str, List[nn.Parameter]]:
    """Every parameter of the backbone's model + routers in exactly one named group."""
    model = bb.model
    proj = list(bb.projector().parameters())
    in_proj = {id(p) for p in proj}  # (Qwen's merger is a submodule of its vision tower)
    groups = {
        "vision": [p for p in bb.vision_tower().parameters() if id(p) not in in_proj],
        "projector": proj,
        "language": list(bb.decoder().parameters()) + list(bb.lm_head().parameters()),
        "extractor": list(routers.shadow.parameters()),
        "semantic": list(routers.semantic.parameters()),
        "image": list(routers.image.parameters()),
    }
    seen = {id(p) for ps in groups.values() for p in ps}
    rest = [n for n, p in list(model.named_parameters()) + list(routers.named_parameters())
            if id(p) not in seen]
    if rest:  # a new submodule in a future transformers: refuse rather than train it silently
        raise RuntimeError(f"parameters outside every freezing group: {rest[:5]}")
    return groups


def apply_freezing(bb, routers: nn.Module, trainable: List[str],
                   keep_frozen: Sequence[nn.Parameter] = ()) -> List[nn.Parameter]:
    """requires_grad exactly for the groups in ``trainable`` but the parameters of
    ``keep_frozen`` (a curriculum's ``frozen``); returns the trained parameters."""
    bad = sorted(set(trainable) - set(GROUPS))
    if bad:
        raise ValueError(f"trainable: unknown groups {bad}; expected some of {GROUPS}")
    params = []
    for name, ps in param_groups(bb, routers).items():
        on = name in trainable
        for p in ps:
            p.requires_grad_(on)
        if on:
            params.extend(ps)
    frozen = {id(p) for p in keep_frozen}
    for p in keep_frozen:
        p.requires_grad_(False)
    return [p for p in params if id(p) not in frozen]


def _pack(Z, plan, grid, out, dest, backend="auto"):
    return vr_kernels.pool_pack(Z, list(plan), grid, out=out, dest=dest, backend=backend)


def _times(bb, times) -> dict:
    """``times=`` for a backbone whose prompt writes each unit's time (as the runtime passes)."""
    return {"times": times} if getattr(bb, "uses_frame_times", False) and times is not None \
        else {}


def dialogue_sequence(bb, turns, plan, times=None):
    """The one place a training sequence is laid out, so that its first turn is the prompt
    ``answer()`` and ``option_logprobs`` build for the same plan: (question, answer) ``turns``
    about the same frames, the first in the runtime's video prompt, each later one a follow-up
    user turn, every answer closed by the end of turn, all in the tokenizer's chat template
    (``chat.py``) -> (ids, prompt length, per-frame dest rows, the backbone's position ids
    (None: 1-D), targets): ``targets[i]`` is what position ``prompt length - 1 + i`` predicts,
    -100 on the follow-up questions (only answers are trained)."""
    counts = pooled_counts(plan, bb.grid)
    ids, starts = bb.build_prompt(turns[0][0], counts, **_times(bb, times))
    ids = ids.tolist()
    n_prompt, targets = len(ids), []
    chat, tok = chat_turns(bb.tokenizer), bb.tokenizer
    end = tok(chat.end, add_special_tokens=False)["input_ids"]
    for k, (q, a) in enumerate(turns):
        if k:
            turn = tok(chat.follow_up(q), add_special_tokens=False)["input_ids"]
            ids, targets = ids + turn, targets + [-100] * len(turn)
        ans = tok(a, add_special_tokens=False)["input_ids"] + end
        ids, targets = ids + ans, targets + ans
    dest = plan_dest(counts, starts)
    kept_plan = [w for w, n in zip(plan, counts) if n]
    pos = bb.position_ids(torch.tensor(ids), kept_plan, starts)
    return ids, n_prompt, dest, pos, targets


def answer_sequence(bb, question: str, answer: str, plan, times=None):
    """One question and its answer (``dialogue_sequence`` of one turn) -> (ids, prompt length,
    dest, positions); the targets are ``ids[prompt length:]``."""
    ids, n_prompt, dest, pos, _ = dialogue_sequence(bb, [(question, answer)], plan, times)
    return ids, n_prompt, dest, pos


def kept_rows(plan: Sequence, src: Sequence[int], dest: Sequence[int]):
    """(source frame, window, dest row) of each kept virtual frame, in time order: what
    ``pool_pack`` needs to write a plan over virtual frames from the source frames alone."""
    out = [(src[t], w, d) for t, (w, d) in enumerate(zip(plan, dest)) if w != 0]
    return [s for s, _, _ in out], [w for _, w, _ in out], [d for _, _, d in out]


def sequence_loss(tr: "Trainee", Z: torch.Tensor, lay: Layout, ex: dict):
    """One Stage 3 sequence: ``lay``'s turns about ``Z``'s frames under its plan packed into
    the prompt -> (summed answer cross-entropy, answer tokens, {name: term} of each of
    ``tr.extra_losses`` that selects something in it)."""
    ids, n_prompt, dest, pos, target = dialogue_sequence(tr.bb, lay.turns, lay.plan, lay.times)
    plan = lay.plan
    seq = LaidSequence(tr.tokenizer, ids, n_prompt, target, lay, pooled_counts(plan, tr.grid),
                       dest, ex)
    chosen = [(x, what) for x in tr.extra_losses for what in [x.select(seq)] if what]
    if lay.src is not None:   # virtual frames: the kept ones gathered from the example's
        rows, plan, dest = kept_rows(plan, lay.src, dest)
        Z = Z[torch.tensor(rows, device=Z.device)]
    emb = tr.frame_rows(torch.tensor(ids, device=Z.device), Z, plan, dest)
    with contextlib.ExitStack() as stack:
        watched = [stack.enter_context(x.watch(tr.bb)) for x, _ in chosen]
        logits = tr.lm_logits(emb.unsqueeze(0), n_prompt - 1, pos)[0]  # predicts ids[n_prompt:]
    target = torch.tensor(target, device=Z.device)
    ce = F.cross_entropy(logits.float(), target, reduction="sum", ignore_index=-100)
    aux = {x.name: x.loss(tr.bb, w, what) for (x, what), w in zip(chosen, watched)}
    return ce, int((target != -100).sum()), aux


class Trainee(nn.Module):
    """model + routers with the stage's forward. ``batch`` is a list of example dicts:
    ``v`` (pre-projector features [T,256,4C], stages 1/3), ``q_ids`` (ids [Lq] of the routers'
    text, the bare question: ``Example.routed_question``),
    ``labels`` ([T] float, optional in stage 3), ``policy`` (int, optional in stage 3),
    ``question``/``answer`` (stage 3)."""

    def __init__(self, lm, routers, cfg, pack=None):
        super().__init__()
        self.model = lm.model
        self.__dict__["bb"] = lm  # the Backbone (not a submodule: its model is self.model)
        self.routers = routers
        self.cfg = cfg
        self.tokenizer = lm.tokenizer
        self.image_token_id = lm.image_token_id
        self.grid = tuple(lm.grid)
        self.pack = pack or functools.partial(_pack, backend=cfg.pool_pack_backend)
        self.curriculum = curriculum_for(cfg)
        self.extra_losses = self.curriculum.extra_losses(lm) if cfg.stage == 3 else []

    # -- shared pieces
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids)

    def project(self, v: torch.Tensor) -> torch.Tensor:
        return self.bb.project(v)

    def frame_rows(self, ids: torch.Tensor, Z: torch.Tensor, plan, dest) -> torch.Tensor:
        """The decoder's input rows [L, D] of ``ids`` with ``Z``'s frames pooled by ``plan``
        written into their placeholder rows (each frame's first: ``dest``). Gradients reach
        ``embed_tokens`` through the rows the frames do not overwrite, the projector through
        the kernel's backward; a wide ``Z`` (DeepStack streams) gets zeros on the text rows."""
        emb = self.embed(ids)
        if Z.shape[-1] != emb.shape[-1]:
            emb = torch.cat([emb, emb.new_zeros(emb.shape[0], Z.shape[-1] - emb.shape[-1])], -1)
        return self.pack(Z.to(emb.dtype), plan, self.grid, emb, dest)

    def forward(self, batch: List[dict]) -> Dict[str, torch.Tensor]:
        stage = self.cfg.stage
        if stage == 1:
            return self.stage1(batch)
        if stage == 2:
            return self.stage2(batch)
        return self.stage3(batch)

    def frame_subset(self, labels: torch.Tensor) -> Optional[torch.Tensor]:
        """Frames that enter L_img: all, or (``frames_per_example``) every relevant frame plus
        random irrelevant ones. Exact because the Image Router scores each frame on its own
        ([Z_t; q] through the shadow stack), so a subset is a cheaper, class-rebalanced sample of
        the same per-frame terms."""
        n = self.cfg.frames_per_example
        if not n or n >= labels.numel():
            return None
        pos = torch.nonzero(labels > 0.5).flatten()
        neg = torch.nonzero(labels <= 0.5).flatten()
        neg = neg[torch.randperm(neg.numel(), device=neg.device)[:max(n - pos.numel(), 1)]]
        return torch.sort(torch.cat([pos[:n - 1], neg]))[0]

    def frame_loss(self, Z, q, labels):
        """L_img over the (sub)set of frames -> (loss, logits, labels used)."""
        idx = self.frame_subset(labels)
        if idx is not None:
            Z, labels = Z[idx], labels[idx]
        logits = self.routers.frame_logits(Z, q, grid=self.grid).float()
        y = labels.to(logits.device)
        return F.binary_cross_entropy_with_logits(logits, y), logits, y

    # -- stage 1
    def stage1(self, batch):
        losses, correct, total = [], 0, 0
        for ex in batch:
            Z = self.project(ex["v"])
            loss, logits, y = self.frame_loss(Z, self.embed(ex["q_ids"]), ex["labels"])
            losses.append(loss)
            correct += int((relevant_from_logits(logits, self.routers.config.threshold)
                            == (y > 0.5)).sum())
            total += y.numel()
        loss = torch.stack(losses).mean()
        return {"loss": loss, "l_img": loss.detach(),
                "frame_acc": torch.tensor(correct / max(total, 1))}

    # -- stage 2
    def _policy_logits(self, batch):
        ids = [ex["q_ids"] for ex in batch]
        L = max(int(i.numel()) for i in ids)
        dev = ids[0].device
        pad = torch.zeros(len(ids), L, dtype=torch.long, device=dev)
        mask = torch.zeros(len(ids), L, dtype=torch.long, device=dev)
        for b, i in enumerate(ids):  # right padding: the causal shadow stack never sees pads
            pad[b, :i.numel()] = i
            mask[b, :i.numel()] = 1
        return self.routers.policy_logits(self.embed(pad), mask).float()

    def stage2(self, batch):
        logits = self._policy_logits(batch)
        y = torch.tensor([ex["policy"] for ex in batch], device=logits.device)
        loss = F.cross_entropy(logits, y)
        return {"loss": loss, "l_sem": loss.detach(),
                "policy_acc": (logits.argmax(-1) == y).float().mean().detach()}

    # -- stage 3
    @torch.no_grad()
    def plan(self, policy_logits, frame_logits, ex, max_length: Optional[int] = None,
             budget: Optional[int] = None,
             planners: Tuple[str, str] = ("fragment", "global")):
        """The routing decision (no gradient), made as the runtime makes it: the Semantic
        Router's class, the Image Router's threshold, the policy's planner fitted exactly into
        the context budget (``max_length``, default ``model_max_length``) with its own text, or
        into a fixed visual ``budget`` (the runtime's ``answer(budget=...)``). ``planners``:
        the Fragment and the Global planner (as the runtime's ``route_to`` pairs them)."""
        c = self.cfg
        if c.plan_policy != "routers":  # a fixed planner, no routing (Data FT + Uniform Pooling)
            fragment, relevant, name = False, None, c.plan_policy
        elif c.plan_from == "labels" and ex.get("policy") is not None:
            fragment = bool(ex["policy"])
            relevant = (ex["labels"] > 0.5).tolist() if ex.get("labels") is not None \
                else [False] * frame_logits.shape[0]
        else:
            fragment = bool(policy_logits.argmax(-1).item() == 1)
            relevant = relevant_from_logits(frame_logits, self.routers.config.threshold).tolist()
        if c.plan_policy == "routers":
            name = planners[0] if fragment else planners[1]
        T = frame_logits.shape[0]
        s1, s0 = c.fragment_windows
        w = Windows(relevant_window=s1, other_window=s0, global_window=c.global_window)
        fitted = plan_fitted(get_planner(name), T, self.grid, relevant, w,
                             self.text_for(ex, T),
                             max_length or c.model_max_length, c.gen_tokens, c.margin,
                             budget=budget)
        return fitted.plan, fragment

    def text_for(self, ex, T: int):
        """The prompt's text tokens for the kept frames of a ``T``-frame plan (``plan_fitted``'s
        ``text_for``), as the runtime counts them."""
        return lambda kept: self.bb.text_tokens(ex["question"], T, kept=kept,
                                                **_times(self.bb, ex.get("times")))

    def training_plan(self, policy_logits, frame_logits, ex):
        """``plan`` with the inference-time conditions the answer head must survive: a random
        L_max from ``train_max_length`` (tight ones drop frames, even evidence frames when
        false positives crowd the budget) and, with ``false_positive_prob``, one irrelevant
        frame promoted to relevant. Random draws use torch's RNG (seeded by the loop)."""
        c = self.cfg
        max_length = budget = None
        if c.train_max_length:
            lo, hi = c.train_max_length
            max_length = int(torch.randint(lo, hi + 1, ()).item())
        if c.train_budget_fraction:   # a fraction of this example's dense visual tokens
            lo, hi = c.train_budget_fraction
            dense = frame_logits.shape[0] * self.grid[0] * self.grid[1]
            budget = max(1, round((lo + (hi - lo) * torch.rand(()).item()) * dense))
        frame_logits = frame_logits.clone()
        ex = dict(ex)
        if c.false_positive_prob and torch.rand(()).item() < c.false_positive_prob:
            if c.plan_from == "labels" and ex.get("labels") is not None:
                rel = ex["labels"] > 0.5
            else:
                rel = relevant_from_logits(frame_logits, self.routers.config.threshold)
            neg = torch.nonzero(~rel.to(frame_logits.device)).flatten()
            if neg.numel() and bool(rel.any()):  # only Fragment-style plans have relevance
                t = int(neg[torch.randint(neg.numel(), ())])
                if ex.get("labels") is not None:
                    ex["labels"] = ex["labels"].clone()
                    ex["labels"][t] = 1.0
                frame_logits[t] = 10.0  # relevant under any threshold
        return self.plan(policy_logits, frame_logits, ex, max_length, budget)

    def build_sequence(self, ex, plan):
        return answer_sequence(self.bb, ex["question"], ex["answer"], plan, ex.get("times"))

    def stage3(self, batch):
        c = self.cfg
        lm_losses, sem_losses, img_losses, aux_losses = [], [], [], {}
        n_tok = 0
        for ex in batch:
            Z = self.project(ex["v"])                     # grad -> projector
            q = self.embed(ex["q_ids"])
            pol = self.routers.policy_logits(q.unsqueeze(0)).float()   # [1, 2]
            l_img = fr = None
            if ex.get("labels") is not None:
                l_img, fr, _ = self.frame_loss(Z, q, ex["labels"])
            T = Z.shape[0]
            if c.plan_from == "labels" and ex.get("policy") is not None:
                fr_all = torch.zeros(T)  # not used: the plan follows the labels
            elif fr is not None and fr.shape[0] == T:
                fr_all = fr.detach()
            else:
                with torch.no_grad():  # the decision for every frame, without gradient
                    fr_all = self.routers.frame_logits(Z.detach(), q.detach(),
                                                       grid=self.grid).float()
            lay = self.curriculum.lay_out(self, pol.detach()[0], fr_all, ex)
            ce, n, aux = sequence_loss(self, Z, lay, ex)
            lm_losses.append(ce)
            n_tok += n
            for k, v in aux.items():
                aux_losses.setdefault(k, []).append(v)
            if ex.get("policy") is not None:
                y = torch.tensor([int(ex["policy"])], device=pol.device)
                sem_losses.append(F.cross_entropy(pol, y))
            if l_img is not None:
                img_losses.append(l_img)
        l_lm = torch.stack(lm_losses).sum() / max(n_tok, 1)
        zero = l_lm.new_zeros(())
        l_sem = torch.stack(sem_losses).mean() if sem_losses else zero
        l_img = torch.stack(img_losses).mean() if img_losses else zero
        loss = l_lm + c.lambda_sem * l_sem + c.lambda_img * l_img
        out = {"l_lm": l_lm.detach(), "l_sem": l_sem.detach(), "l_img": l_img.detach()}
        for x in self.extra_losses:   # logged every step, 0 when no sequence selected it
            aux = torch.stack(aux_losses[x.name]).mean() if x.name in aux_losses else zero
            loss = loss + x.weight * aux
            out[x.name] = aux.detach()
        return {"loss": loss, **out}

    def lm_logits(self, inputs_embeds: torch.Tensor, start: int,
                  position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Decoder over the whole sequence; the LM head only on positions >= ``start``."""
        kw = {} if position_ids is None else {"position_ids": position_ids.to(inputs_embeds.device)}
        D = self.bb.hidden_size
        kw.update(deepstack_kwargs(inputs_embeds, D))   # wide rows: the DeepStack streams
        h = self.bb.decoder()(inputs_embeds=inputs_embeds[..., :D], use_cache=False,
                              return_dict=True, **kw).last_hidden_state
        return self.bb.lm_head()(h[:, start:-1])
