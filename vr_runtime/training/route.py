"""Tiny-only: route supervision, one attention head trained to look from the row that predicts an
answer at the question's cue word (the queried color).

Why: among all 16 full-resolution frames the tiny model's color words already attend to their
color's object (layer 0), but its answer row reads the frames directly and never the color word,
which works only when a plan highlights the evidence by resolution
(``scripts/studies/attention_probe_tiny.py``). With this loss the answer row's other heads read
the queried object: the labeller (``labeller.py``) learned from it what plain fine-tuning did not
find (training README, "The labeller"), and Stage 3 can add it to its dense examples
(``route_weight``). Never used for a real checkpoint, which makes that hop already.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

from vr_runtime.data.synthetic_videos import COLORS

_COLOR_WORD = re.compile(r"\b(" + "|".join(sorted(COLORS, key=len, reverse=True)) + r")\b")


def cue_word(question: str) -> Optional[str]:
    """The synthetic task's color named in ``question`` (its last one), or None."""
    found = _COLOR_WORD.findall(question.lower())
    return found[-1] if found else None


@dataclass
class RouteSupervision:
    """Head ``head`` of decoder layer ``layer``, at the row that predicts an answer, trained to
    attend to the question's cue word (the queried color); the module docstring says why."""
    layer: int = 1
    head: int = 0
    weight: float = 1.0

    @staticmethod
    def cue_id(tok, word: str) -> Optional[int]:
        ids = tok(" " + word, add_special_tokens=False)["input_ids"]
        return ids[0] if len(ids) == 1 else None

    @contextlib.contextmanager
    def capture(self, bb):
        """The layer's attention inputs (normed hidden states, rotary cos/sin) of one forward."""
        attn = bb.decoder().layers[self.layer].self_attn
        captured = {}

        def hook(module, args, kwargs):
            captured["h"] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            captured["pe"] = kwargs["position_embeddings"] if "position_embeddings" in kwargs \
                else args[1]

        handle = attn.register_forward_pre_hook(hook, with_kwargs=True)
        try:
            yield captured
        finally:
            handle.remove()

    def loss(self, bb, captured: dict, pairs) -> torch.Tensor:
        """Mean -log attention weight of the supervised head from each answer row to its cue."""
        from transformers.models.qwen2.modeling_qwen2 import rotate_half
        attn = bb.decoder().layers[self.layer].self_attn
        h, (cos, sin) = captured["h"][0], captured["pe"]
        cos, sin = cos[0], sin[0]                                       # [L, hd]
        rows = torch.tensor([r for r, _ in pairs], device=h.device)
        hd = attn.head_dim
        q = attn.q_proj(h[rows]).view(len(pairs), -1, hd)[:, self.head]          # [r, hd]
        kv = self.head // attn.num_key_value_groups
        k = attn.k_proj(h).view(h.shape[0], -1, hd)[:, kv]                        # [L, hd]
        q = q * cos[rows] + rotate_half(q) * sin[rows]
        k = k * cos + rotate_half(k) * sin
        logits = (q @ k.T).float() * attn.scaling                                 # [r, L]
        causal = torch.arange(h.shape[0], device=h.device)[None] > rows[:, None]
        logp = torch.log_softmax(logits.masked_fill(causal, float("-inf")), -1)
        cues = torch.tensor([c for _, c in pairs], device=h.device)
        return -logp[torch.arange(len(pairs)), cues].mean()


def route_bounds(bb, route: RouteSupervision) -> None:
    """Fail in one line when ``route``'s layer or head is not in ``bb``'s decoder."""
    layers = bb.decoder().layers
    heads = layers[0].self_attn.config.num_attention_heads if len(layers) else 0
    if not (route.layer < len(layers) and route.head < heads):
        raise ValueError(f"route_layer, route_head: expected < {len(layers)} layers and < "
                         f"{heads} heads, got {route.layer}, {route.head}")


def answer_pairs(tok, ids: Sequence[int], n_prompt: int, targets: Sequence[int],
                 questions: Sequence[str]) -> List[Tuple[int, int]]:
    """(answer-predicting row, cue row) of each turn of ``stages.dialogue_sequence``'s output
    whose question names a color: the row before the turn's first answer token, and the last
    row of that color's word within the turn's question (the first turn's question is in the
    prompt, a later one in the rows between the previous answer and its own)."""
    starts = [i for i, y in enumerate(targets) if y != -100 and (i == 0 or targets[i - 1] == -100)]
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


__all__ = ["RouteSupervision", "cue_word", "route_bounds", "answer_pairs"]
