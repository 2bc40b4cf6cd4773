"""The three stages as one module: freezing per the paper's table and each stage's loss.

``Trainee`` holds the InternVL model and the routers, so one ``nn.Module`` goes through
accelerate (DDP / FSDP / DeepSpeed). ``forward(batch)`` returns the stage's loss and parts.

- Stage 1: L_img = mean over frames of BCE(frame logit, y_t)    (shadow stack + Image Router)
- Stage 2: L_sem = CE(policy logits, y_s)                         (Semantic Router)
- Stage 3: L_LM + lambda_s L_sem + lambda_v L_img with the compressed visual sequence built by
  ``vr_kernels.pool_pack`` straight into the placeholder rows of ``inputs_embeds``; the plan
  (which frame gets which window) is decided under ``no_grad`` from the routers' outputs (or the
  labels), so re-running the forward under activation checkpointing yields the same plan.
  Tiny-only, off by default: + route_weight L_route + evidence_weight L_evidence
  + exclusion_weight L_exclusion (``route.py``).
"""
from __future__ import annotations

import functools
from typing import Dict, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

import vr_kernels
from vr_kernels import pooled_counts
from vr_runtime.backbones.base import deepstack_kwargs
from vr_runtime.backbones.prompt import CHATML, plan_dest
from vr_runtime.planning.policies import Windows, get_planner, plan_fitted, relevant_from_logits

from .layouts import (captioned, colored, dense_cap, dialogue_turns, draw_int, global_twin,
                      keep_evidence, kept_rows, stretch, stretched_times)
from .route import Laid, attention_inputs, evidence_rows, supervisions, turn_labels

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
                   freeze_embeddings: bool = False) -> List[nn.Parameter]:
    """requires_grad exactly for the groups in ``trainable`` (with ``freeze_embeddings``, the
    language group but its input embeddings); returns those parameters."""
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
    if freeze_embeddings:
        emb = bb.model.get_input_embeddings().weight
        emb.requires_grad_(False)
        params = [p for p in params if p is not emb]
    return params


def _pack(Z, plan, grid, out, dest, backend="auto"):
    return vr_kernels.pool_pack(Z, list(plan), grid, out=out, dest=dest, backend=backend)


def _times(bb, times) -> dict:
    """``times=`` for a backbone whose prompt writes each unit's time (as the runtime passes)."""
    return {"times": times} if getattr(bb, "uses_frame_times", False) and times is not None \
        else {}


def dialogue_sequence(bb, turns, plan, times=None):
    """The one place a training sequence is laid out, so that its first turn is the prompt
    ``answer()`` and ``option_logprobs`` build for the same plan: (question, answer) ``turns``
    about the same frames, the first in the runtime's video prompt (chat template), each later
    one a ChatML follow-up turn, every answer closed by the end of turn -> (ids, prompt length,
    per-frame dest rows, the backbone's position ids (None: 1-D), targets): ``targets[i]`` is
    what position ``prompt length - 1 + i`` predicts, -100 on the follow-up questions (only
    answers are trained)."""
    counts = pooled_counts(plan, bb.grid)
    ids, starts = bb.build_prompt(turns[0][0], counts, **_times(bb, times))
    ids = ids.tolist()
    n_prompt, targets = len(ids), []
    end = bb.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for k, (q, a) in enumerate(turns):
        if k:
            turn = bb.tokenizer("\n" + CHATML.format(content=q),
                                add_special_tokens=False)["input_ids"]
            ids, targets = ids + turn, targets + [-100] * len(turn)
        ans = bb.tokenizer(a, add_special_tokens=False)["input_ids"] + [end]
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


def sequence_loss(tr: "Trainee", Z: torch.Tensor, turns, plan, src, times, labels=None):
    """One Stage 3 sequence: ``turns`` about ``Z``'s frames under ``plan`` (``src``: a stretched
    plan's source frames; ``labels``: each turn's frame labels or None) packed into the prompt
    -> (summed answer cross-entropy, answer tokens, {name: loss} of each of ``tr.supervision``
    that has rows to supervise)."""
    ids, n_prompt, dest, pos, target = dialogue_sequence(tr.bb, turns, plan, times)
    counts = pooled_counts(plan, tr.grid)
    evidence = [evidence_rows(plan, counts, dest, lab) for lab in labels] if labels else None
    visual = evidence_rows(plan, counts, dest, [1.0] * len(plan)) if labels else ()
    laid = Laid(tr.tokenizer, ids, n_prompt, target, [q for q, _ in turns], evidence, visual)
    pairs = {s.name: p for s in tr.supervision for p in [s.pairs(laid)] if p}
    ids_t = torch.tensor(ids, device=Z.device)
    emb = tr.embed(ids_t)                           # [L, D]; grad -> embed_tokens
    if Z.shape[-1] != emb.shape[-1]:   # wide Z (DeepStack streams): zeros on text rows
        emb = torch.cat([emb, emb.new_zeros(emb.shape[0], Z.shape[-1] - emb.shape[-1])], -1)
    if src is not None:   # a stretched plan: its kept frames gathered from the example's
        rows, plan, dest = kept_rows(plan, src, dest)
        Z = Z[torch.tensor(rows, device=Z.device)]
    emb = tr.pack(Z.to(emb.dtype), plan, tr.grid, emb, dest)
    layers = [i for s in tr.supervision if s.name in pairs for i in s.layers]
    with attention_inputs(tr.bb, layers) as cap:
        logits = tr.lm_logits(emb.unsqueeze(0), n_prompt - 1, pos)[0]  # predicts ids[n_prompt:]
    target = torch.tensor(target, device=Z.device)
    ce = F.cross_entropy(logits.float(), target, reduction="sum", ignore_index=-100)
    aux = {s.name: s.loss(tr.bb, cap, pairs[s.name]) for s in tr.supervision if s.name in pairs}
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
        self.supervision = supervisions(cfg, lm) if cfg.stage == 3 else []

    # -- shared pieces
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids)

    def project(self, v: torch.Tensor) -> torch.Tensor:
        return self.bb.project(v)

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
             budget: Optional[int] = None, planner: Optional[str] = None):
        """The routing decision (no gradient), made as the runtime makes it: the Semantic
        Router's class, the Image Router's threshold, the policy's planner fitted exactly into
        the context budget (``max_length``, default ``model_max_length``) with its own text, or
        into a fixed visual ``budget`` (the runtime's ``answer(budget=...)``). ``planner``: a
        Fragment planner to use instead of ``fragment`` (its Global twin for Global, as the
        runtime's ``route_to`` pairs them)."""
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
            name = planner or "fragment"
            if not fragment:
                name = global_twin(name)
        T = frame_logits.shape[0]
        s1, s0 = c.fragment_windows
        w = Windows(relevant_window=s1, other_window=s0, global_window=c.global_window)
        fitted = plan_fitted(get_planner(name), T, self.grid, relevant, w,
                             self._text_for(ex, T),
                             max_length or c.model_max_length, c.gen_tokens, c.margin,
                             budget=budget)
        return fitted.plan, fragment

    def _text_for(self, ex, T: int):
        """The prompt's text tokens for the kept frames of a ``T``-frame plan (``plan_fitted``'s
        ``text_for``), as the runtime counts them."""
        return lambda kept: self.bb.text_tokens(ex["question"], T, kept=kept,
                                                **_times(self.bb, ex.get("times")))

    def training_plan(self, policy_logits, frame_logits, ex):
        """``plan`` with the inference-time conditions the answer head must survive: a random
        L_max from ``train_max_length`` (tight ones drop frames, even evidence frames when
        false positives crowd the budget) and, with ``false_positive_prob``, one irrelevant
        frame promoted to relevant; with ``random_plan_prob``, a ``random_plan`` instead. Random
        draws use torch's RNG (seeded by the loop)."""
        c = self.cfg
        if c.random_plan_prob and torch.rand(()).item() < c.random_plan_prob:
            plan = self.random_plan(frame_logits.shape[0], ex)
            if plan is not None:
                return plan, None
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

    def layout(self, policy_logits, frame_logits, ex):
        """(plan, src, times) of one Stage 3 example: with ``dense_plan_prob`` a ``dense_plan``,
        with ``long_plan_prob`` a ``long_plan`` (``src`` maps its virtual frames to the
        example's, ``times`` are theirs), else ``training_plan`` (``src`` None: the example's
        own frames). No draw is made for a probability of 0, so configs without them train as
        before, draw for draw."""
        c = self.cfg
        if c.dense_plan_prob or c.long_plan_prob:
            u = torch.rand(()).item()
            if u < c.dense_plan_prob:
                return self.dense_plan(frame_logits.shape[0], ex), None, ex.get("times")
            if u < c.dense_plan_prob + c.long_plan_prob:
                return self.long_plan(policy_logits, frame_logits, ex)
        plan, _ = self.training_plan(policy_logits, frame_logits, ex)
        return plan, None, ex.get("times")

    @torch.no_grad()
    def dense_plan(self, T: int, ex) -> list:
        """Every frame at full resolution when they fit ``model_max_length`` (and
        ``dense_plan_frames``), else as many as fit spread evenly in time: the ``budget``
        planner, which is the dense reference at the frame counts that fit. With
        ``dense_plan_keep_relevant`` the kept frames include the labelled relevant ones
        (``layouts.keep_evidence``)."""
        c = self.cfg
        w = Windows(relevant_window=1, other_window=1, global_window=1)
        n = dense_cap(c.dense_plan_frames)
        cap = n * self.grid[0] * self.grid[1] if n else None
        fitted = plan_fitted(get_planner("budget"), T, self.grid, None, w,
                             self._text_for(ex, T),
                             c.model_max_length, c.gen_tokens, c.margin, budget=cap)
        if c.dense_plan_keep_relevant and ex.get("labels") is not None:
            turns = ex.get("turns", ()) if c.dense_plan_dialogue else ()
            more = [(t["labels"] > 0.5).tolist() for t in turns if t.get("labels") is not None]
            return keep_evidence(fitted.plan, (ex["labels"] > 0.5).tolist(), more)
        return fitted.plan

    @torch.no_grad()
    def long_plan(self, policy_logits, frame_logits, ex):
        """The example stretched to a virtual count drawn from ``long_plan_frames``
        (``layouts.stretch``: its relevant frames stay a short event), planned under a visual
        budget drawn from ``long_plan_budget`` by a planner drawn from ``long_plan_planners``
        -> (plan, src, times). The stretch follows the labels (the event's true frames); the
        plan follows ``plan_from``, as ``plan`` decides it."""
        c = self.cfg
        T = frame_logits.shape[0]
        truth = ex["labels"] > 0.5 if ex.get("labels") is not None else \
            relevant_from_logits(frame_logits, self.routers.config.threshold)
        src = stretch(truth.tolist(), draw_int(*c.long_plan_frames))
        if len(src) == T:   # nothing to stretch (every frame relevant): the usual plan
            plan, _ = self.training_plan(policy_logits, frame_logits, ex)
            return plan, None, ex.get("times")
        idx = torch.tensor(src, device=frame_logits.device)
        virtual = dict(ex, times=stretched_times(ex.get("times"), len(src)))
        if ex.get("labels") is not None:
            virtual["labels"] = ex["labels"][idx.to(ex["labels"].device)]
        names = c.long_plan_planners
        planner = names[draw_int(0, len(names) - 1)]
        plan, _ = self.plan(policy_logits, frame_logits[idx], virtual,
                            budget=draw_int(*c.long_plan_budget), planner=planner)
        return plan, src, virtual["times"]

    def random_plan(self, T: int, ex) -> Optional[List[int]]:
        """A plan that says nothing about the question: one window from ``random_plan_windows``
        for every frame (half the draws) or one per frame, within ``model_max_length`` (None
        when it does not fit: the caller plans as usual)."""
        c = self.cfg
        ws = c.random_plan_windows
        if torch.rand(()).item() < 0.5:
            plan = [ws[int(torch.randint(len(ws), ()))]] * T
        else:
            plan = [ws[int(i)] for i in torch.randint(len(ws), (T,))]
        need = sum(pooled_counts(plan, self.grid)) + \
            self.bb.text_tokens(ex["question"], T, **_times(self.bb, ex.get("times"))) \
            + c.gen_tokens + c.margin
        return plan if need <= c.model_max_length else None

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
            plan, src, times = self.layout(pol.detach()[0], fr_all, ex)
            turns = dialogue_turns(plan, ex) if c.dense_plan_dialogue else \
                [(ex["question"], ex["answer"])]
            turns = colored(captioned(turns, plan, c.caption_turn_prob), c.color_first_answers)
            labels = turn_labels(turns, ex, src) if self.supervision else None
            ce, n, aux = sequence_loss(self, Z, turns, plan, src, times, labels)
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
        for sup in self.supervision:   # logged every step, 0 when no sequence had rows for it
            aux = torch.stack(aux_losses[sup.name]).mean() if sup.name in aux_losses else zero
            loss = loss + sup.weight * aux
            out[sup.name] = aux.detach()
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
