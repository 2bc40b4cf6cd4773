"""Attention supervision of the row that predicts an answer, in three parts, each off unless
its weight is set: the tiny curriculum's extra losses (``ExtraLoss`` of
``vr_runtime.training.curriculum``).

- ``RouteSupervision``: one head looks at the question's cue word (the queried color). Among
  all 16 full-resolution frames the tiny model's color words already attend to their color's
  object (layer 0), but its answer row read the frames directly and never the color word,
  which works only when a plan highlights the evidence by resolution
  (``scripts/studies/attention_probe_tiny.py``). The labeller (``labeller.py``) learned from
  it what plain fine-tuning did not find (docs/TRAINING_STUDIES.md, "The labeller").
- ``EvidenceSupervision``: one later head looks at the frames the question is about (the
  frame labels).
- ``ExclusionSupervision``: every head of later layers keeps off the frames the question is
  not about.

Stage 3 adds them to its dense and long examples (the ``tiny`` section's ``route_weight``,
``evidence_weight``, ``exclusion_weight``). Never used for a real checkpoint, which makes these
hops already.
"""
from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

from vr_runtime.data.synthetic_videos import COLORS
from vr_runtime.training.curriculum import LaidSequence

_COLOR_WORD = re.compile(r"\b(" + "|".join(sorted(COLORS, key=len, reverse=True)) + r")\b")


def cue_word(question: str) -> Optional[str]:
    """The synthetic task's color named in ``question`` (its last one), or None."""
    found = _COLOR_WORD.findall(question.lower())
    return found[-1] if found else None


class Supervision:
    """An extra loss of Stage 3: the rows ``pairs`` picks in the laid-out sequence (``Laid``),
    read from the attention inputs of decoder ``layers`` (``attention_inputs``)."""

    def select(self, seq: LaidSequence):
        return self.pairs(laid(seq))

    def watch(self, bb):
        return attention_inputs(bb, self.layers)


class OneHead(Supervision):
    """A supervision of one head (``self.head``) of one decoder layer (``self.layer``), in the
    terms every supervision answers to (``layers``, ``heads``)."""

    @property
    def layers(self) -> Tuple[int, ...]:
        return (self.layer,)

    @property
    def heads(self) -> Tuple[int, ...]:
        return (self.head,)


@dataclass
class RouteSupervision(OneHead):
    """Head ``head`` of decoder layer ``layer``, at the row that predicts an answer, trained to
    attend to the question's cue word (the queried color); the module docstring says why."""
    layer: int = 1
    head: int = 0
    weight: float = 1.0
    name = "l_route"
    keys = "route_layer, route_head"

    @staticmethod
    def cue_id(tok, word: str) -> Optional[int]:
        ids = tok(" " + word, add_special_tokens=False)["input_ids"]
        return ids[0] if len(ids) == 1 else None

    def pairs(self, laid: "Laid") -> List[Tuple[int, int]]:
        return answer_pairs(laid.tok, laid.ids, laid.n_prompt, laid.targets, laid.questions)

    def loss(self, bb, captured: dict, pairs) -> torch.Tensor:
        """Mean -log attention weight of the supervised head from each answer row to its cue."""
        logp = layer_logp(bb, self.layer, captured, [r for r, _ in pairs])[self.head]
        cues = torch.tensor([c for _, c in pairs], device=logp.device)
        return -logp[torch.arange(len(pairs)), cues].mean()


@dataclass
class EvidenceSupervision(OneHead):
    """Head ``head`` of decoder layer ``layer`` (after the route hop has brought the queried
    color into the answer row), at the row that predicts an answer, trained to put its
    attention on the visual rows of the frames its question is about (their labels: in the
    synthetic task one object is on screen at a time, so those frames hold the queried object
    and no other target). Why: with the color found, the dense answerer still named the
    video's other target (it read shape without binding it to the color), and among hundreds
    of pooled frames it said ``none``; both looked like the answer row not reading the
    evidence. Measured, it does not close either gap (``binding_tiny/`` at commit 4194068;
    docs/TRAINING_STUDIES.md)."""
    layer: int = 2
    head: int = 0
    weight: float = 1.0
    name = "l_evidence"
    keys = "evidence_layer, evidence_head"

    def pairs(self, laid: "Laid") -> List[Tuple[int, List[int]]]:
        if laid.evidence is None:
            return []
        rows = answer_rows(laid.n_prompt, laid.targets)
        return [(r, ev) for r, ev in zip(rows, laid.evidence) if ev]

    def loss(self, bb, captured: dict, pairs) -> torch.Tensor:
        """Mean -log of the head's summed attention from each answer row to its evidence."""
        logp = layer_logp(bb, self.layer, captured, [r for r, _ in pairs])[self.head]
        return -torch.stack([torch.logsumexp(logp[i, torch.tensor(ev, device=logp.device)], 0)
                             for i, (_, ev) in enumerate(pairs)]).mean()


@dataclass
class ExclusionSupervision(Supervision):
    """Every head of decoder ``layers``, at the row that predicts an answer, trained to keep its
    attention off the visual rows of the frames its question is not about (it may read its
    evidence frames and the text). Why: one head trained onto the evidence
    (``EvidenceSupervision``) left the answer row's other heads reading every full-resolution
    frame, and so the other target's shape (measured: ``binding_tiny/`` at commit 4194068)."""
    layers: Tuple[int, ...] = (2, 3)
    weight: float = 1.0
    name = "l_exclusion"
    keys = "exclusion_layers"
    heads = ()      # every head of each layer: none named, so none to check

    def pairs(self, laid: "Laid") -> List[Tuple[int, List[int]]]:
        """(answer row, the visual rows it should not read) of each turn with evidence."""
        if laid.evidence is None:
            return []
        rows = answer_rows(laid.n_prompt, laid.targets)
        return [(r, sorted(set(laid.visual) - set(ev)))
                for r, ev in zip(rows, laid.evidence) if ev]

    def loss(self, bb, captured: dict, pairs) -> torch.Tensor:
        """Mean over layers, heads and answer rows of -log(1 - attention on the other frames)."""
        out = []
        for layer in self.layers:
            logp = layer_logp(bb, layer, captured, [r for r, _ in pairs])        # [H, r, L]
            for i, (_, other) in enumerate(pairs):
                if other:
                    mass = logp[:, i, torch.tensor(other, device=logp.device)].exp().sum(-1)
                    out.append(-torch.log1p(-mass.clamp(max=1 - 1e-6)))        # [H]
        return torch.cat(out).mean() if out else logp.new_zeros(())


@dataclass
class FrameSupervision(OneHead):
    """Head ``head`` of decoder layer ``layer``, at visual rows, trained to spread its attention
    evenly over the rows of its own frame up to itself (the KL divergence from that uniform
    distribution), at ``rows`` rows drawn per sequence. Why: an object's shape is in its
    boundary cells and not in its interior ones (a linear readout from the interior cells'
    mean is at chance, from the boundary cells' or the whole frame's mean exact:
    ``v7_steps/`` at commit 571181a), while a color word's attention picks the cells of its color,
    the interior most. A row that has read its frame carries that frame's shape, so a
    color-gated read of later layers gets the shape with the color. Measured, it does not bind
    the dense answers (``v7_steps/I_frame`` at 571181a; docs/TRAINING_STUDIES.md, v7)."""
    layer: int = 0
    head: int = 3
    weight: float = 1.0
    rows: int = 64
    name = "l_frame"
    keys = "frame_layer, frame_head"

    def pairs(self, laid: "Laid") -> List[Tuple[int, int]]:
        """(visual row, its frame's first row), ``rows`` of them drawn among the visual rows
        that are not their frame's first (frames: the runs of consecutive visual rows)."""
        firsts, prev, first = [], None, None
        for r in laid.visual:
            first = r if prev is None or r != prev + 1 else first
            if r != first:
                firsts.append((r, first))
            prev = r
        if len(firsts) <= self.rows:
            return firsts
        return [firsts[i] for i in torch.randperm(len(firsts))[:self.rows].tolist()]

    def loss(self, bb, captured: dict, pairs) -> torch.Tensor:
        """Mean KL(uniform over the row's frame so far || the head's attention)."""
        logp = layer_logp(bb, self.layer, captured, [r for r, _ in pairs])[self.head]
        out = [-logp[i, s:r + 1].mean() - math.log(r + 1 - s) for i, (r, s) in enumerate(pairs)]
        return torch.stack(out).mean()


@dataclass
class Laid:
    """What a supervision needs of one laid-out sequence
    (``vr_runtime.training.stages.dialogue_sequence``): ``evidence`` holds, per turn, the visual
    rows of the frames its question is about (None: not known); ``visual`` every visual row."""
    tok: object
    ids: Sequence[int]
    n_prompt: int
    targets: Sequence[int]
    questions: Sequence[str]
    evidence: Optional[List[List[int]]] = None
    visual: Sequence[int] = ()


def laid(seq: LaidSequence) -> Laid:
    """The supervisions' view of a Stage 3 sequence: each turn's evidence rows from its frame
    labels (``turn_labels``), every visual row of the kept frames."""
    lay, plan = seq.layout, seq.layout.plan
    labels = turn_labels(lay.turns, seq.ex, lay.src)
    evidence = [evidence_rows(plan, seq.counts, seq.dest, lab) for lab in labels]
    visual = evidence_rows(plan, seq.counts, seq.dest, [1.0] * len(plan))
    return Laid(seq.tokenizer, seq.ids, seq.n_prompt, seq.targets, [q for q, _ in lay.turns],
                evidence, visual)


@contextlib.contextmanager
def attention_inputs(bb, layers):
    """Each of ``layers``' attention inputs of one forward: {layer: (normed hidden states,
    rotary (cos, sin))}; no hook for no layers."""
    captured, handles = {}, []

    def hook_for(i):
        def hook(module, args, kwargs):
            h = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            pe = kwargs["position_embeddings"] if "position_embeddings" in kwargs else args[1]
            captured[i] = (h, pe)
        return hook

    for i in sorted(set(layers)):
        attn = bb.decoder().layers[i].self_attn
        handles.append(attn.register_forward_pre_hook(hook_for(i), with_kwargs=True))
    try:
        yield captured
    finally:
        for h in handles:
            h.remove()


def layer_logp(bb, layer: int, captured: dict, rows: List[int]) -> torch.Tensor:
    """Log attention weights [heads, len(rows), L] of every head of ``layer`` at ``rows``
    (causal), recomputed from the layer's captured inputs as the eager implementation
    computes them."""
    from transformers.models.qwen2.modeling_qwen2 import rotate_half
    attn = bb.decoder().layers[layer].self_attn
    h, (cos, sin) = captured[layer]
    h, cos, sin = h[0], cos[0], sin[0]                                   # [L, D], [L, hd]
    rows = torch.tensor(rows, device=h.device)
    hd = attn.head_dim
    q = attn.q_proj(h[rows]).view(len(rows), -1, hd).transpose(0, 1)            # [H, r, hd]
    k = attn.k_proj(h).view(h.shape[0], -1, hd).transpose(0, 1)                 # [KV, L, hd]
    k = k.repeat_interleave(attn.num_key_value_groups, 0)                       # [H, L, hd]
    q = q * cos[rows] + rotate_half(q) * sin[rows]
    k = k * cos + rotate_half(k) * sin
    logits = (q @ k.transpose(1, 2)).float() * attn.scaling                     # [H, r, L]
    causal = torch.arange(h.shape[0], device=h.device)[None] > rows[:, None]
    return torch.log_softmax(logits.masked_fill(causal, float("-inf")), -1)


def route_bounds(bb, sup) -> None:
    """Fail in one line when a layer or head of supervision ``sup`` (config ``sup.keys``) is
    not in ``bb``'s decoder."""
    layers = bb.decoder().layers
    heads = layers[0].self_attn.config.num_attention_heads if len(layers) else 0
    if not (all(0 <= i < len(layers) for i in sup.layers) and
            all(0 <= h < heads for h in sup.heads)):
        got = ", ".join(map(str, tuple(sup.layers) + tuple(sup.heads)))
        raise ValueError(f"{sup.keys}: expected < {len(layers)} layers and < "
                         f"{heads} heads, got {got}")


def supervisions(cfg, bb) -> list:
    """The attention supervisions the ``tiny`` options ``cfg`` turn on (weight > 0), checked
    against ``bb``'s decoder."""
    out = []
    if cfg.route_weight:
        out.append(RouteSupervision(cfg.route_layer, cfg.route_head, cfg.route_weight))
    if cfg.evidence_weight:
        out.append(EvidenceSupervision(cfg.evidence_layer, cfg.evidence_head,
                                       cfg.evidence_weight))
    if cfg.exclusion_weight:
        out.append(ExclusionSupervision(tuple(cfg.exclusion_layers), cfg.exclusion_weight))
    if cfg.frame_weight:
        out.append(FrameSupervision(cfg.frame_layer, cfg.frame_head, cfg.frame_weight,
                                    cfg.frame_rows))
    for sup in out:
        route_bounds(bb, sup)
    return out


def answer_rows(n_prompt: int, targets: Sequence[int]) -> List[int]:
    """The row that predicts each answer's first token (``targets[i]`` is what row
    ``n_prompt - 1 + i`` predicts; answers are the runs of targets other than -100)."""
    return [n_prompt - 1 + i for i, y in enumerate(targets)
            if y != -100 and (i == 0 or targets[i - 1] == -100)]


def evidence_rows(plan: Sequence[int], counts: Sequence[int], dest: Sequence[int],
                  labels: Optional[Sequence[float]]) -> List[int]:
    """The prompt rows of the kept frames that ``labels`` marks relevant (``dest``: each frame's
    first row, ``counts`` its rows); [] for no labels."""
    if labels is None:
        return []
    if len(labels) != len(plan):
        raise ValueError(f"labels: expected one per frame ({len(plan)}), got {len(labels)}")
    return [r for t, (w, n, d) in enumerate(zip(plan, counts, dest))
            if w and n and labels[t] > 0.5 for r in range(d, d + n)]


def turn_labels(turns, ex: dict, src: Optional[Sequence[int]] = None):
    """Each turn's frame labels (a list, or None when not known): the example's own for the
    first, a sibling question's (``ex["turns"]``, found by its text) for a later one; ``src``
    maps a stretched plan's frames to the example's."""
    own = {t["question"]: t.get("labels") for t in ex.get("turns", ())}
    out = []
    for k, (q, _) in enumerate(turns):
        lab = ex.get("labels") if k == 0 else own.get(q)
        if lab is not None:
            lab = [float(x) for x in lab]
            lab = [lab[s] for s in src] if src is not None else lab
        out.append(lab)
    return out


def answer_pairs(tok, ids: Sequence[int], n_prompt: int, targets: Sequence[int],
                 questions: Sequence[str]) -> List[Tuple[int, int]]:
    """(answer-predicting row, cue row) of each turn of
    ``vr_runtime.training.stages.dialogue_sequence``'s output whose question names a color: the
    row before the turn's first answer token, and the last row of that color's word within the
    turn's question (the first turn's question is in the prompt, a later one in the rows
    between the previous answer and its own)."""
    starts = [r - (n_prompt - 1) for r in answer_rows(n_prompt, targets)]
    if len(starts) != len(questions):
        raise ValueError(f"questions: expected one per answer ({len(starts)}), got "
                         f"{len(questions)}")
    pairs, lo = [], 0
    for i, q in zip(starts, questions):
        row = n_prompt - 1 + i
        word = cue_word(q)
        cues = {RouteSupervision.cue_id(tok, w) for w in (word, word.capitalize())} - {None} \
            if word else set()
        hits = [r for r in range(lo, row + 1) if ids[r] in cues]
        if hits:
            pairs.append((row, hits[-1]))
        end = i
        while end < len(targets) and targets[end] != -100:
            end += 1
        lo = n_prompt - 1 + end + 1     # the next question starts after this answer's last token
    return pairs


__all__ = ["RouteSupervision", "EvidenceSupervision", "ExclusionSupervision", "FrameSupervision",
           "Supervision", "Laid", "laid",
           "attention_inputs", "layer_logp", "cue_word", "route_bounds", "supervisions",
           "answer_rows", "answer_pairs", "evidence_rows", "turn_labels"]
