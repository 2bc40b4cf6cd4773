"""The paper's label construction (Appendix A) as tools for any backbone and any
multiple-choice QA file that ``videorouter eval`` reads (``vr_runtime.eval.benchmarks``).

(a) Frame relevance by counterfactual necessity (Video-FLR style), :func:`counterfactual_labels`.
    For one question with options and correct option c, every option is scored by its
    log-likelihood (:func:`vr_runtime.eval.option_scoring.option_logprobs`: the option's letter, or its text + the
    end-of-turn token, after the runtime's own prompt). The reference plan keeps every sampled
    frame at full resolution (window 1; ``keep`` / ``--keep-window`` sets another window for a
    model never trained on every frame at full resolution, a departure from the paper). ``off`` is the ablated window: 0 (``mode="drop"``, the
    frame leaves the prompt) or 8 (``mode="pool8"``, 8x8 pooling).

    1. consistency: the reference must pick c (highest log-likelihood), else the question is
       ``unanswerable`` and gets no labels (the paper's first validation filter);
    2. necessity: frame t is *necessary* if the reference with frame t at ``off`` no longer
       picks c, or lowers log p(c) by more than ``margin`` nats;
    3. greedy minimal sufficient set S: start from every frame at ``off`` (nothing / most
       pooled); while the plan "S at full resolution, the rest at ``off``" does not both pick c
       and reach log p(c) >= reference log p(c) - ``margin``, add the frame t not in S whose
       addition gives the largest log p(c) (ties: the earlier frame). It ends at the latest when
       S holds every frame (that plan is the reference). ``max_set`` caps |S| (then
       ``sufficient`` is false).
    4. ``frame_labels`` (``rule``): ``union`` (default) = necessary or in S; ``necessary``; or
       ``minimal-set``. Necessity alone labels nothing when the evidence is repeated in several
       frames (no single one is needed); S finds one copy of it, so the union is the default.
    5. validation (``validate``), the paper's third filter: "a counterfactual necessity test
       masks labeled positive frames ...; labels are corrected or removed if the answer remains
       recoverable without the claimed evidence". Mask every labelled frame (``off``), the rest
       at ``keep``; if that plan still picks c within the margin, the evidence is repeated
       elsewhere: ``correct`` (default) adds the greedy minimal sufficient set of the frames not
       yet labelled (every labelled frame kept ablated) and masks again, until the answer is
       gone (``validation``: ``passed`` at once, or ``corrected``); ``remove`` drops the
       question (status ``removed``), as ``correct`` does when no further set carries the
       answer; ``off`` keeps the labels of steps 1-4. Labels that claim no frame (the answer
       needs none) are not validated (``empty``), nor labels whose first set hit ``max_set``
       (``insufficient``). With a target on screen in k frames, S holds
       one of them and the corrected labels all k, as a frame-level annotator marks them.

    Each video is decoded and encoded (Z) once; every counterfactual plan of every question on
    it reuses Z, and plans of equal prompt length share a decoder pass (``batch``).

(b) The A/B probe (Video-QTR style), :func:`ab_probe`: each question answered with forced
    ``global`` and forced ``fragment`` (frame scores from the routers' Image Router, or fixed
    labels through :class:`~vr_runtime.routing.scorers.FixedRelevance`), accuracy per question
    category (the reader's ``category``: the generic JSONL's ``category`` field, Video-MME's
    ``task_type``, LongVideoBench's ``question_category``, MLVU's ``question_type``) ->
    ``{"category", "acc_global", "acc_fragment", "n"}`` lines for ``policy-labels --tau``.
"""
from __future__ import annotations

import os
import pathlib
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import torch

from ..backbones import PRESETS
from ..backbones.devices import resolve_device, resolve_dtype
from ..data.jsonl import write_jsonl
from ..eval.benchmarks import LETTERS, load_benchmark
from ..eval.option_scoring import option_logprobs
from ..eval.prompting import PromptConfig, extract_answer, mc_prompt
from ..report import json_window
from ..routing.scorers import FixedRelevance
from ..runtime import VideoRouter
from ..video.load import load_video
from .data import DataFormatError, _labels, iter_jsonl

MODES = {"drop": 0, "pool8": 8}
LABEL_RULES = ("union", "necessary", "minimal-set")
VALIDATIONS = ("correct", "remove", "off")
SCORINGS = ("loglik", "generate")
FULL = 1          # the reference window: full resolution


class LabelError(ValueError):
    """A label-construction argument or input that cannot be used."""


# ----------------------------------------------------------------------------- option scoring
def option_continuations(tokenizer, options: Sequence[str], answer_mode: str) -> List[List[int]]:
    """Token ids each option is scored by: its letter (``letter``) or its text followed by the
    end-of-turn token (``option-text``; the end token makes "red" and "red circle" differ)."""
    if answer_mode == "letter":
        return [tokenizer.encode(LETTERS[i], add_special_tokens=False)
                for i in range(len(options))]
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if not isinstance(end, int) or end == tokenizer.unk_token_id:
        end = tokenizer.eos_token_id
    return [tokenizer.encode(str(o), add_special_tokens=False) + [int(end)] for o in options]


def _picks(lp: torch.Tensor, correct: int) -> bool:
    return int(torch.argmax(lp)) == correct


# ----------------------------------------------------------------------------- (a) the rule
def counterfactual_labels(score: Callable[[List[list]], torch.Tensor], num_frames: int,
                          correct: int, mode: str = "drop", margin: float = 1.0,
                          rule: str = "union", max_set: Optional[int] = None,
                          keep: int = FULL, validate: str = "correct") -> dict:
    """Frame labels of one question (see the module doc). ``score(plans)`` -> [P, options]
    log-likelihoods for a list of plans (one window per frame). Pure logic over ``score``; a
    plan is scored once however often the rule asks for it.
    ``keep`` is the window of the frames that are not ablated (the reference's and the set's):
    1, full resolution, is the paper; a coarser one is for a model that was never trained on
    every frame at full resolution (it must stay finer than ``pool8``'s 8). ``validate`` is the
    paper's counterfactual-necessity filter on the labels (module doc, step 5)."""
    off = _check_label_options(mode, rule, validate, margin, keep)
    T = int(num_frames)
    ab = _Ablations(score, T, off, keep, correct, margin)
    ref = ab.reference()
    out = {"reference_logprobs": [round(float(x), 5) for x in ref]}
    if not _picks(ref, correct):
        return {"status": "unanswerable", "frame_labels": None, **out, "forwards": ab.calls}
    loo = ab([[off if u == t else keep for u in range(T)] for t in range(T)])
    drop = (ref[correct] - loo[:, correct]).tolist()
    flips = [not _picks(loo[t], correct) for t in range(T)]
    necessary = [int(flips[t] or drop[t] > margin) for t in range(T)]
    cap = T if max_set is None else min(int(max_set), T)
    S, cur, trace = ab.greedy(set(), cap)
    sufficient = bool(ab.enough(cur))
    in_set = [int(t in S) for t in range(T)]
    if rule == "necessary":
        labels = necessary
    elif rule == "minimal-set":
        labels = in_set
    else:
        labels = [int(a or b) for a, b in zip(necessary, in_set)]
    sets = [S]
    validation = ("off" if validate == "off" else "insufficient" if not sufficient
                  else "empty" if not any(labels) else "")
    if not validation:
        validation, labels = _validate_labels(ab, labels, sets, validate, cap)
    return {"status": "removed" if validation == "removed" else "ok",
            "frame_labels": None if validation == "removed" else labels, **out,
            "necessary": necessary, "logprob_drop": [round(float(x), 5) for x in drop],
            "answer_flips": [int(x) for x in flips], "minimal_set": S,
            "minimal_set_order_logprob": trace, "sufficient": sufficient,
            "evidence_sets": sets, "validation": validation, "forwards": ab.calls}


def _check_label_options(mode: str, rule: str, validate: str, margin: float, keep) -> int:
    """``LabelError`` for an unknown mode, rule or validation, a negative margin or a keep
    window that is not finer than the ablation; returns the ablated frames' window."""
    if mode not in MODES:
        raise LabelError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
    if rule not in LABEL_RULES:
        raise LabelError(f"rule {rule!r}: expected one of {', '.join(LABEL_RULES)}")
    if validate not in VALIDATIONS:
        raise LabelError(f"validate {validate!r}: expected one of {', '.join(VALIDATIONS)}")
    if not margin >= 0:
        raise LabelError(f"margin: expected >= 0 nats, got {margin!r}")
    off = MODES[mode]
    if not isinstance(keep, int) or keep < 1 or (off and keep >= off):
        raise LabelError(f"keep window {keep!r}: expected an int >= 1"
                         + (f" and < {off} (mode {mode})" if off else ""))
    return off


class _Ablations:
    """The plans of one question, each scored once through ``score``: the validation's searches
    start where the first set's did (every frame ablated, then one frame added), so a memo
    saves them all but their new plans. ``calls`` counts the plans scored."""

    def __init__(self, score, T: int, off: int, keep: int, correct: int, margin: float):
        self.score, self.T, self.off, self.keep = score, T, off, keep
        self.correct, self.margin = correct, margin
        self.scored: Dict[tuple, torch.Tensor] = {}
        self.calls = 0
        self.ref = None

    def __call__(self, plans):
        plans = [tuple(p) for p in plans]
        todo = list(dict.fromkeys(p for p in plans if p not in self.scored))
        if todo:
            self.calls += len(todo)
            self.scored.update(zip(todo, self.score([list(p) for p in todo]).float()))
        return torch.stack([self.scored[p] for p in plans])

    def reference(self):
        """The log-likelihoods with no frame ablated."""
        self.ref = self([[self.keep] * self.T])[0]
        return self.ref

    def enough(self, lp) -> bool:
        """Still picks the correct option, within ``margin`` of the reference."""
        c = self.correct
        return _picks(lp, c) and float(lp[c]) >= float(self.ref[c]) - self.margin

    def greedy(self, masked: set, room: int):
        """The greedy minimal sufficient set among the frames not in ``masked`` (those stay
        ablated), at most ``room`` frames: (set, its log-likelihoods, log p(c) as it grew)."""
        T, off, keep, correct = self.T, self.off, self.keep, self.correct
        S: List[int] = []
        cur = self([[off] * T])[0]
        trace = [round(float(cur[correct]), 5)]
        while not self.enough(cur) and len(S) < room:
            cands = [t for t in range(T) if t not in S and t not in masked]
            if not cands:
                break
            lps = self([[keep if u in S or u == t else off for u in range(T)] for t in cands])
            best = max(range(len(cands)), key=lambda i: (float(lps[i, correct]), -i))
            S.append(cands[best])
            cur = lps[best]
            trace.append(round(float(cur[correct]), 5))
        return S, cur, trace


def _validate_labels(ab: _Ablations, labels: List[int], sets: List[list], validate: str,
                     cap: int):
    """The counterfactual-necessity filter: ablate the labelled frames; while the answer
    survives, add the next evidence set (``correct``) or drop the question (``remove``).
    Appends to ``sets``; returns (validation, labels)."""
    T, off, keep = ab.T, ab.off, ab.keep
    while True:
        claimed = {t for t in range(T) if labels[t]}
        rest = ab([[off if t in claimed else keep for t in range(T)]])[0]
        if not ab.enough(rest):      # without the claimed evidence the answer is gone
            return ("passed" if len(sets) == 1 else "corrected"), labels
        if validate == "remove":
            return "removed", labels
        more, lp, _ = ab.greedy(claimed, cap - len(claimed))
        if not more or not ab.enough(lp):   # recoverable, and no further evidence explains it
            return "removed", labels
        sets.append(more)
        labels = [int(labels[t] or t in more) for t in range(T)]


# ----------------------------------------------------------------------------- shared plumbing
@dataclass
class LabelConfig:
    benchmark: str = "jsonl"
    data: str = ""
    videos: str = ""
    model: str = "tiny"
    routers: Optional[str] = None
    frames: int = 16
    mode: str = "drop"
    keep_window: int = FULL   # window of the frames not ablated (1: the paper)
    margin: float = 1.0
    rule: str = "union"
    validate: str = "correct"   # the paper's counterfactual-necessity filter on the labels
    max_set: Optional[int] = None
    answer_mode: str = "letter"
    prompt_style: str = "mc"
    batch: int = 8
    limit: Optional[int] = None
    device: str = "cpu"
    dtype: Optional[str] = None


def check_config(cfg: LabelConfig) -> None:
    """Every argument, before any model loads or video decodes."""
    if cfg.mode not in MODES:
        raise LabelError(f"--mode {cfg.mode!r}: expected one of {', '.join(MODES)}")
    if cfg.rule not in LABEL_RULES:
        raise LabelError(f"--rule {cfg.rule!r}: expected one of {', '.join(LABEL_RULES)}")
    if cfg.validate not in VALIDATIONS:
        raise LabelError(f"--validate {cfg.validate!r}: expected one of {', '.join(VALIDATIONS)}")
    if not cfg.margin >= 0:
        raise LabelError(f"--margin: expected >= 0 (nats of log-likelihood), got {cfg.margin}")
    off = MODES[cfg.mode]
    if not isinstance(cfg.keep_window, int) or cfg.keep_window < 1 or (
            off and cfg.keep_window >= off):
        raise LabelError("--keep-window: expected an int >= 1"
                         + (f" and < {off} with --mode {cfg.mode}" if off else "")
                         + f", got {cfg.keep_window!r}")
    for name, v in (("--frames", cfg.frames), ("--batch", cfg.batch)):
        if not isinstance(v, int) or v < 1:
            raise LabelError(f"{name}: expected an int >= 1, got {v!r}")
    if cfg.max_set is not None and cfg.max_set < 1:
        raise LabelError(f"--max-set: expected an int >= 1, got {cfg.max_set}")
    if cfg.limit is not None and cfg.limit < 1:
        raise LabelError(f"--limit: expected an int >= 1, got {cfg.limit}")
    PromptConfig(answer_mode=cfg.answer_mode, style=cfg.prompt_style)
    if str(cfg.model) not in PRESETS and not pathlib.Path(cfg.model).expanduser().is_dir():
        raise LabelError(f"--model {cfg.model!r}: not a preset ({', '.join(PRESETS)}) nor a "
                         f"local checkpoint directory")
    if cfg.routers is not None and not pathlib.Path(cfg.routers).is_file():
        raise LabelError(f"--routers {cfg.routers!r}: no such file")


def load_questions(cfg: LabelConfig):
    return load_benchmark(cfg.benchmark, cfg.data, cfg.videos, limit=cfg.limit).questions


def load_router(cfg: LabelConfig):
    dev = resolve_device(cfg.device)
    return VideoRouter.from_pretrained(cfg.model, routers=cfg.routers, device=dev,
                                       dtype=resolve_dtype(cfg.dtype, dev), warmup_frames=0)


def by_video(questions) -> Dict[str, list]:
    out: Dict[str, list] = defaultdict(list)
    for q in questions:
        out[q.video].append(q)
    return dict(sorted(out.items()))


def load_clip(vr, path: str, frames: int):
    spec = vr.lm.frame_spec
    return load_video(path, num_frames=frames, size=spec.size[0], mean=spec.mean, std=spec.std)


def _write_jsonl(path, lines: Sequence[dict]) -> None:
    """All at once through a temporary file: nothing half-written."""
    write_jsonl(path, lines, atomic=True)


# ----------------------------------------------------------------------------- (a) driver
def label_frames(vr, questions, cfg: LabelConfig, out: str, diagnostics: Optional[str] = None,
                 progress: bool = False) -> dict:
    """(a) over ``questions`` -> a Stage 1 relevance JSONL at ``out`` (answerable questions
    only; video paths relative to its folder) and, optionally, one diagnostics line per
    question. Returns counts and timings."""
    pcfg = PromptConfig(answer_mode=cfg.answer_mode, style=cfg.prompt_style)
    root = pathlib.Path(out).resolve().parent
    lines, diag = [], []
    t0 = time.perf_counter()
    enc_s = 0.0
    for video, qs in by_video(questions).items():
        clip = load_clip(vr, video, cfg.frames)
        t1 = time.perf_counter()
        Z = vr.lm.encode_frames(clip.pixel_values)           # once per video
        enc_s += time.perf_counter() - t1
        T = int(Z.shape[0])
        for q in qs:
            prompt = mc_prompt(q.question, q.options, pcfg)
            conts = option_continuations(vr.lm.tokenizer, q.options, cfg.answer_mode)
            correct = LETTERS.index(q.answer)
            t1 = time.perf_counter()
            res = counterfactual_labels(
                lambda plans: option_logprobs(vr.lm, Z, prompt, plans, conts, batch_size=cfg.batch),
                T, correct, cfg.mode, cfg.margin, cfg.rule, cfg.max_set, cfg.keep_window,
                cfg.validate)
            diag.append({"id": q.id, "video": video, "category": q.category, **res,
                         "seconds": round(time.perf_counter() - t1, 4)})
            if progress:
                print(f"{q.id}: {res['status']} {res['frame_labels']}", flush=True)
            if res["status"] != "ok":
                continue
            lines.append({"id": q.id, "video": os.path.relpath(video, root),
                          "question": q.question, "answer": q.options[correct],
                          "frame_labels": res["frame_labels"], "category": q.category,
                          "label_source": f"counterfactual-{cfg.mode}-{cfg.rule}"
                                          + (f"-keep{cfg.keep_window}" if cfg.keep_window != FULL
                                             else "")
                                          + ("" if cfg.validate == "correct"
                                             else f"-validate-{cfg.validate}")})
    _write_jsonl(out, lines)
    if diagnostics:
        _write_jsonl(diagnostics, diag)
    return {"questions": len(diag), "labelled": len(lines),
            "unanswerable": sum(d["status"] == "unanswerable" for d in diag),
            "removed": sum(d["status"] == "removed" for d in diag),
            "forwards": sum(d["forwards"] for d in diag), "encode_s": round(enc_s, 3),
            "wall_s": round(time.perf_counter() - t0, 3), "diagnostics": diag}


# ----------------------------------------------------------------------------- (b) A/B probe
def read_relevance(path: str) -> Dict[str, List[int]]:
    """``id`` -> ``frame_labels`` of a JSONL (the output of (a), or data lines that carry
    labels)."""
    out = {}
    for where, rec in iter_jsonl(path, "relevance"):
        if not isinstance(rec, dict) or not isinstance(rec.get("id"), (str, int)):
            raise DataFormatError(f"{where}: expected an object with an 'id' and 'frame_labels'")
        out[str(rec["id"])] = _labels(rec.get("frame_labels"), where)
    return out


def check_relevance(questions, relevance: Dict[str, List[int]], frames: int) -> None:
    for q in questions:
        if q.id not in relevance:
            raise LabelError(f"--relevance: no frame_labels for question {q.id!r}")
        if len(relevance[q.id]) != frames:
            raise LabelError(f"--relevance: question {q.id!r} has {len(relevance[q.id])} frame "
                             f"labels, --frames is {frames} (one label per sampled frame)")


def ab_probe(vr, questions, cfg: LabelConfig, out: str, relevance: Optional[dict] = None,
             scoring: str = "loglik", max_length: int = 12288, budget: Optional[int] = None,
             max_new_tokens: int = 16, predictions: Optional[str] = None) -> Dict[str, tuple]:
    """(b): forced Global vs forced Fragment per question -> per-category accuracies written to
    ``out`` (the ``policy-labels --accuracies`` format); returns {category: (g, f)}.

    ``relevance`` (id -> labels): Fragment's frame scores through ``FixedRelevance``; None: the
    routers' Image Router. ``scoring``: ``loglik`` -- the option with the highest
    log-likelihood under the plan ``answer`` made (as (a) scores); ``generate`` -- the generated
    answer, extracted as ``videorouter eval`` does (``--answer-mode``)."""
    if scoring not in SCORINGS:
        raise LabelError(f"--scoring {scoring!r}: expected one of {', '.join(SCORINGS)}")
    pcfg = PromptConfig(answer_mode=cfg.answer_mode, style=cfg.prompt_style)
    if relevance is not None:
        check_relevance(questions, relevance, cfg.frames)
    right: Dict[str, List[int]] = defaultdict(lambda: [0, 0, 0])
    preds = []
    for video, qs in by_video(questions).items():
        clip = load_clip(vr, video, cfg.frames)
        Z = vr.lm.encode_frames(clip.pixel_values) if scoring == "loglik" else None
        for q in qs:
            prompt = mc_prompt(q.question, q.options, pcfg)
            cat = q.category or "uncategorized"
            row = {"id": q.id, "category": cat, "answer": q.answer}
            for j, policy in enumerate(("global", "fragment")):
                kw = {}
                if policy == "fragment" and relevance is not None:
                    kw["scorer"] = FixedRelevance(relevance[q.id])
                res = vr.answer(clip, prompt, num_frames=cfg.frames, max_length=max_length,
                                max_new_tokens=max_new_tokens if scoring == "generate" else 0,
                                policy=policy, budget=budget, cache_visual=True,
                                router_question=q.question, **kw)
                if scoring == "generate":
                    pred = extract_answer(res.text, q.options, cfg.answer_mode)
                else:
                    plan = [tuple(w) if isinstance(w, list) else w for w in res.report["windows"]]
                    lp = option_logprobs(vr.lm, Z, prompt, [plan], option_continuations(
                        vr.lm.tokenizer, q.options, cfg.answer_mode))[0]
                    pred = LETTERS[int(torch.argmax(lp))]
                right[cat][j] += int(pred == q.answer)
                row[policy] = {"prediction": pred, "visual_tokens": res.report["visual_tokens"],
                               "windows": [json_window(w) for w in res.report["windows"]]}
            right[cat][2] += 1
            preds.append(row)
    acc = {c: (g / n, f / n) for c, (g, f, n) in sorted(right.items())}
    _write_jsonl(out, [{"category": c, "acc_global": g, "acc_fragment": f, "n": right[c][2]}
                       for c, (g, f) in acc.items()])
    if predictions:
        _write_jsonl(predictions, preds)
    return acc


# ----------------------------------------------------------------------------- the study
__all__ = ["MODES", "LABEL_RULES", "SCORINGS", "LabelError", "LabelConfig",
           "counterfactual_labels", "option_continuations", "label_frames", "ab_probe",
           "read_relevance", "check_relevance", "check_config"]
