"""Held-out evaluation of each stage (what the training numbers in the report come from).

- Stage 1: per-frame accuracy of the Image Router (sigmoid > 0.5) against the frame labels, with
  precision / recall / F1 of the relevant class and the all-irrelevant baseline's accuracy
  (frame labels are imbalanced, so plain accuracy alone flatters a router that says "no").
- Stage 2: policy accuracy of the Semantic Router (Global vs Fragment).
- Stage 3: exact-match answer accuracy of greedy decoding with the routers' compression plan,
  per policy label, against the chance level of the synthetic task (1 / number of answers), at
  ``model_max_length`` and at each of ``eval_max_lengths`` (tight budgets, as in the demo).
  The answer is decoded as the runtime decodes it (``vr_runtime.generate.generate``: one
  prefill, then KV-cached greedy steps until a stop token) and compared with the answer in the wording the
  curriculum trains (``Curriculum.answer_text``).
"""
from __future__ import annotations

from collections import defaultdict
from typing import List

import torch
from tqdm.auto import tqdm

from vr_kernels import pooled_counts
from vr_runtime.backbones.prompt import plan_dest
from vr_runtime.generate import generate

from .data import Example


def _q(trainee, ex: Example):
    ids = trainee.tokenizer(ex.routed_question, add_special_tokens=False)["input_ids"]
    dev = next(trainee.parameters()).device
    return torch.tensor(ids, dtype=torch.long, device=dev)


@torch.no_grad()
def eval_relevance(trainee, examples: List[Example], cache, progress=False) -> dict:
    tp = fp = fn = tn = 0
    for ex in tqdm(examples, desc="eval frames", disable=not progress, leave=False):
        Z = trainee.project(cache.get(ex.video, ex.frames))
        pred = trainee.routers.frame_logits(Z, trainee.embed(_q(trainee, ex)),
                                            grid=trainee.grid) > 0
        y = torch.tensor(cache.labels(ex.frame_labels), dtype=torch.bool, device=pred.device)
        tp += int((pred & y).sum()); fp += int((pred & ~y).sum())
        fn += int((~pred & y).sum()); tn += int((~pred & ~y).sum())
    n = tp + fp + fn + tn
    prec = tp / max(tp + fp, 1)
    rec = tp / max(tp + fn, 1)
    return {"frame_accuracy": (tp + tn) / max(n, 1), "precision": prec, "recall": rec,
            "f1": 2 * prec * rec / max(prec + rec, 1e-12),
            "all_irrelevant_baseline_accuracy": (fp + tn) / max(n, 1),
            "frames": n, "examples": len(examples)}


@torch.no_grad()
def eval_policy(trainee, examples: List[Example], batch_size: int = 64) -> dict:
    right = 0
    per = defaultdict(lambda: [0, 0])
    for i in range(0, len(examples), batch_size):
        chunk = examples[i:i + batch_size]
        logits = trainee._policy_logits([{"q_ids": _q(trainee, ex)} for ex in chunk])
        for ex, p in zip(chunk, logits.argmax(-1).tolist()):
            right += int(p == ex.policy)
            per[ex.policy][0] += int(p == ex.policy)
            per[ex.policy][1] += 1
    return {"policy_accuracy": right / max(len(examples), 1), "examples": len(examples),
            "accuracy_by_label": {("fragment" if k else "global"): r / n
                                  for k, (r, n) in sorted(per.items())}}


@torch.no_grad()
def answer(trainee, ex: Example, v: torch.Tensor, max_new_tokens: int = 8, max_length=None):
    """Greedy answer under the routers' plan (budget from ``max_length``, default the config's
    ``model_max_length``), in the runtime's prompt for that plan -> (text, plan, fragment?)."""
    q = _q(trainee, ex)
    Z = trainee.project(v)
    qe = trainee.embed(q)
    pol = trainee.routers.policy_logits(qe.unsqueeze(0)).float()[0]
    fr = trainee.routers.frame_logits(Z, qe, grid=trainee.grid).float()
    plan, fragment = trainee.plan(pol, fr, {"policy": None, "question": ex.question}, max_length)
    bb = trainee.bb
    counts = pooled_counts(plan, trainee.grid)
    ids, starts = bb.build_prompt(ex.question, counts)
    emb = trainee.frame_rows(ids.to(Z.device), Z, plan, plan_dest(counts, starts))
    pos = bb.position_ids(ids, [w for w, n in zip(plan, counts) if n], starts)
    pos = None if pos is None else pos.to(emb.device)
    out = generate(bb, emb.unsqueeze(0), max_new_tokens, bb.stop_token_ids(), pos)
    return trainee.tokenizer.decode(out, skip_special_tokens=True).strip(), plan, fragment


@torch.no_grad()
def eval_answers(trainee, examples: List[Example], cache, progress=False,
                 max_length=None) -> dict:
    answers = defaultdict(set)
    right = defaultdict(lambda: [0, 0])
    routed = [0, 0]
    samples = []
    for ex in tqdm(examples, desc="eval answers", disable=not progress, leave=False):
        v = cache.get(ex.video, ex.frames)
        text, plan, fragment = answer(trainee, ex, v, max_length=max_length)
        key = "fragment" if ex.policy else "global"
        want = trainee.curriculum.answer_text(ex.question, ex.answer)
        answers[key].add(want.lower())
        ok = text.lower() == want.lower()
        right[key][0] += int(ok)
        right[key][1] += 1
        routed[0] += int(fragment == bool(ex.policy))
        routed[1] += 1
        if len(samples) < 6:
            samples.append({"question": ex.question, "answer": want, "generated": text,
                            "plan": [w if isinstance(w, int) else list(w) for w in plan]})
    total_r = sum(r for r, _ in right.values())
    total_n = sum(n for _, n in right.values())
    return {"answer_accuracy": total_r / max(total_n, 1),
            "answer_accuracy_by_policy": {k: r / n for k, (r, n) in sorted(right.items())},
            "chance_by_policy": {k: 1 / len(v) for k, v in sorted(answers.items())},
            "policy_routing_accuracy": routed[0] / max(routed[1], 1),
            "examples": total_n, "max_length": max_length or trainee.cfg.model_max_length,
            "samples": samples}


def evaluate_stage(trainee, examples: List[Example], cache, progress=False) -> dict:
    stage = trainee.cfg.stage
    if stage == 1:
        return eval_relevance(trainee, examples, cache, progress)
    if stage == 2:
        return eval_policy(trainee, examples)
    res = eval_answers(trainee, examples, cache, progress)
    if trainee.cfg.eval_max_lengths:  # the same questions under tighter budgets (drops)
        res["by_max_length"] = {}
        for L in trainee.cfg.eval_max_lengths:
            r = eval_answers(trainee, examples, cache, progress, max_length=L)
            r["samples"] = r["samples"][:2]
            res["by_max_length"][str(L)] = r
    return res
