"""The tiny curriculum in the trainer's two seams (``vr_runtime.training.curriculum``).

How an example is laid out: besides the plans the routers make (the paper's), a dense plan
(every kept frame at full resolution), a long plan (the example stretched to hundreds or
thousands of frames) or a random plan, chosen per example by the options' probabilities
(``layouts.py``); dense examples as dialogues of every question about the same frames, or as
captions; shape answers colour first. Extra losses: the attention supervisions of
``route.py``. And, with ``freeze_embeddings``, the language model's input embeddings kept
frozen while it trains. Every option is off by default, and no random draw is made for an
option that is off, so a config without them trains as the paper's curriculum does, draw for
draw.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from vr_kernels import pooled_counts
from vr_runtime.planning.policies import Windows, get_planner, plan_fitted, relevant_from_logits
from vr_runtime.training.curriculum import Curriculum, Layout

from .layouts import (captioned, color_first, colored, dense_cap, dialogue_turns, draw_int,
                      global_twin, keep_evidence, stretch, stretched_times)
from .route import supervisions


class TinyCurriculum(Curriculum):
    """Stage 3 of the tiny recipes: ``cfg`` the stage's config, ``options`` its ``tiny``
    section (``options.TinyOptions``)."""

    def __init__(self, cfg, options):
        super().__init__(cfg, options)
        self.siblings = bool(options.dense_plan_dialogue)

    def lay_out(self, trainee, policy_logits, frame_logits, ex: dict) -> Layout:
        o = self.options
        plan, src, times = self.plan(trainee, policy_logits, frame_logits, ex)
        turns = dialogue_turns(plan, ex) if o.dense_plan_dialogue else \
            [(ex["question"], ex["answer"])]
        turns = colored(captioned(turns, plan, o.caption_turn_prob), o.color_first_answers)
        return Layout(plan, turns, src, times)

    def answer_text(self, question: str, answer: str) -> str:
        return color_first(question, answer) if self.options.color_first_answers else answer

    def extra_losses(self, bb) -> list:
        return supervisions(self.options, bb)

    def frozen(self, bb) -> list:
        return [bb.model.get_input_embeddings().weight] if self.options.freeze_embeddings \
            else []

    def plan(self, tr, policy_logits, frame_logits, ex):
        """(plan, src, times) of one example: with ``dense_plan_prob`` a ``dense_plan``, with
        ``long_plan_prob`` a ``long_plan`` (``src`` maps its virtual frames to the example's,
        ``times`` are theirs), else ``training_plan`` (``src`` None: the example's frames)."""
        o = self.options
        if o.dense_plan_prob or o.long_plan_prob:
            u = torch.rand(()).item()
            if u < o.dense_plan_prob:
                return self.dense_plan(tr, frame_logits.shape[0], ex), None, ex.get("times")
            if u < o.dense_plan_prob + o.long_plan_prob:
                return self.long_plan(tr, policy_logits, frame_logits, ex)
        plan = self.training_plan(tr, policy_logits, frame_logits, ex)
        return plan, None, ex.get("times")

    def training_plan(self, tr, policy_logits, frame_logits, ex) -> List[int]:
        """With ``random_plan_prob`` a ``random_plan``, else the trainer's own (the routing
        plan under the inference-time conditions of ``Trainee.training_plan``)."""
        o = self.options
        if o.random_plan_prob and torch.rand(()).item() < o.random_plan_prob:
            plan = self.random_plan(tr, frame_logits.shape[0], ex)
            if plan is not None:
                return plan
        return tr.training_plan(policy_logits, frame_logits, ex)[0]

    @torch.no_grad()
    def dense_plan(self, tr, T: int, ex) -> list:
        """Every frame at full resolution when they fit ``model_max_length`` (and
        ``dense_plan_frames``), else as many as fit spread evenly in time: the ``budget``
        planner, which is the dense reference at the frame counts that fit. With
        ``dense_plan_keep_relevant`` the kept frames include the labelled relevant ones
        (``layouts.keep_evidence``)."""
        c, o = self.cfg, self.options
        w = Windows(relevant_window=1, other_window=1, global_window=1)
        n = dense_cap(o.dense_plan_frames)
        cap = n * tr.grid[0] * tr.grid[1] if n else None
        fitted = plan_fitted(get_planner("budget"), T, tr.grid, None, w, tr.text_for(ex, T),
                             c.model_max_length, c.gen_tokens, c.margin, budget=cap)
        if o.dense_plan_keep_relevant and ex.get("labels") is not None:
            turns = ex.get("turns", ()) if o.dense_plan_dialogue else ()
            more = [(t["labels"] > 0.5).tolist() for t in turns if t.get("labels") is not None]
            return keep_evidence(fitted.plan, (ex["labels"] > 0.5).tolist(), more)
        return fitted.plan

    @torch.no_grad()
    def long_plan(self, tr, policy_logits, frame_logits, ex):
        """The example stretched to a virtual count drawn from ``long_plan_frames``
        (``layouts.stretch``: its relevant frames stay a short event), planned under a visual
        budget drawn from ``long_plan_budget`` by a planner drawn from ``long_plan_planners``
        -> (plan, src, times). The stretch follows the labels (the event's true frames); the
        plan follows ``plan_from``, as ``Trainee.plan`` decides it."""
        o = self.options
        T = frame_logits.shape[0]
        truth = ex["labels"] > 0.5 if ex.get("labels") is not None else \
            relevant_from_logits(frame_logits, tr.routers.config.threshold)
        src = stretch(truth.tolist(), draw_int(*o.long_plan_frames))
        if len(src) == T:   # nothing to stretch (every frame relevant): the usual plan
            return self.training_plan(tr, policy_logits, frame_logits, ex), None, ex.get("times")
        idx = torch.tensor(src, device=frame_logits.device)
        virtual = dict(ex, times=stretched_times(ex.get("times"), len(src)))
        if ex.get("labels") is not None:
            virtual["labels"] = ex["labels"][idx.to(ex["labels"].device)]
        names = o.long_plan_planners
        planner = names[draw_int(0, len(names) - 1)]
        plan, _ = tr.plan(policy_logits, frame_logits[idx], virtual,
                          budget=draw_int(*o.long_plan_budget),
                          planners=(planner, global_twin(planner)))
        return plan, src, virtual["times"]

    def random_plan(self, tr, T: int, ex) -> Optional[List[int]]:
        """A plan that says nothing about the question: one window from ``random_plan_windows``
        for every frame (half the draws) or one per frame, within ``model_max_length`` (None
        when it does not fit: the caller plans as usual)."""
        c, ws = self.cfg, self.options.random_plan_windows
        if torch.rand(()).item() < 0.5:
            plan = [ws[int(torch.randint(len(ws), ()))]] * T
        else:
            plan = [ws[int(i)] for i in torch.randint(len(ws), (T,))]
        need = sum(pooled_counts(plan, tr.grid)) + tr.text_for(ex, T)(None) \
            + c.gen_tokens + c.margin
        return plan if need <= c.model_max_length else None


__all__ = ["TinyCurriculum"]
