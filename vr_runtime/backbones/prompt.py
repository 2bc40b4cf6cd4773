"""InternVL's video prompt with a per-frame number of placeholder rows.

The user turn is InternVL's video layout followed by the question::

    Frame1: <img><IMG_CONTEXT> x n_1</img>
    Frame2: <img><IMG_CONTEXT> x n_2</img>
    ...
    <question>

inside the tokenizer's chat template (InternVL3-*-hf and the tiny preset both use ChatML).
With VideoRouter n_i differs per frame; a frame with n_i = 0 gets no line at all. Frame numbers
are the *sampled* index + 1 even when earlier frames are left out, so "Frame12" always means the
12th sampled frame, in the dense prompt and in every compressed one.

Tokenising 16K ``<IMG_CONTEXT>`` strings is slow and pointless, so the prompt is rendered and
tokenised with one ``<IMG_CONTEXT>`` per kept frame and each is then expanded to n_i ids. Special
tokens are split off before BPE, so this gives exactly the ids of tokenising the full text
(``tests/backbones/test_prompt.py`` checks it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch


@dataclass(frozen=True)
class VisionTokens:
    """The strings that frame one frame's placeholder rows in the prompt:
    ``start + context * n + end`` (``context`` is the placeholder, one id per visual token)."""
    start: str
    end: str
    context: str


IMG_START, IMG_END, IMG_CONTEXT = "<img>", "</img>", "<IMG_CONTEXT>"
INTERNVL_TOKENS = VisionTokens(IMG_START, IMG_END, IMG_CONTEXT)

def _check_question(question: str, tokens: VisionTokens = INTERNVL_TOKENS) -> str:
    if not isinstance(question, str) or not question.strip():
        raise ValueError("question: empty; ask a non-empty question about the video")
    for t in (tokens.start, tokens.end, tokens.context):
        if t in question:
            raise ValueError(f"question: contains the image token {t!r}, which would corrupt the "
                             f"placeholder layout; remove it")
    return question.strip()


def render_chat(tokenizer, content: str, system: Optional[str] = None) -> str:
    """The chat-templated text of one user turn plus the assistant prefix."""
    messages = ([{"role": "system", "content": system}] if system else []) + \
        [{"role": "user", "content": content}]
    return render_messages(tokenizer, messages)


def render_messages(tokenizer, messages, add_generation_prompt: bool = True) -> str:
    """The chat-templated text of ``messages`` ([{"role", "content"}, ...]), with the
    assistant prefix after them when ``add_generation_prompt``; ChatML for a tokenizer without
    a template."""
    if getattr(tokenizer, "chat_template", None):
        try:
            return tokenizer.apply_chat_template(messages, tokenize=False,
                                                 add_generation_prompt=add_generation_prompt)
        except Exception:
            # Some multimodal templates only accept the list-of-parts content form.
            parts = [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]}
                     for m in messages]
            return tokenizer.apply_chat_template(parts, tokenize=False,
                                                 add_generation_prompt=add_generation_prompt)
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def video_content(question: str, kept: Sequence[int], tokens: VisionTokens = INTERNVL_TOKENS) -> str:
    """User-turn text with one placeholder marker per kept frame (sampled indices)."""
    lines = [f"Frame{i + 1}: {tokens.start}{tokens.context}{tokens.end}" for i in kept]
    return "\n".join(lines) + ("\n" if lines else "") + question


def build_video_prompt(tokenizer, question: str, counts: Sequence[int], image_token_id: int,
                       system: Optional[str] = None, tokens: VisionTokens = INTERNVL_TOKENS
                       ) -> Tuple[torch.Tensor, List[int]]:
    """Token ids [L] (int64, CPU) and, per kept frame in temporal order, its first placeholder row.

    ``counts[i]`` is the number of placeholder rows of sampled frame i (0 = frame left out);
    ``tokens`` are the backbone's frame delimiters and placeholder."""
    question = _check_question(question, tokens)
    counts = [int(c) for c in counts]
    if any(c < 0 for c in counts):
        raise ValueError(f"counts: every entry must be >= 0, got {counts}")
    kept = [i for i, c in enumerate(counts) if c > 0]
    text = render_chat(tokenizer, video_content(question, kept, tokens), system)
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    is_ph = ids == image_token_id
    if int(is_ph.sum()) != len(kept):
        raise ValueError(f"prompt: found {int(is_ph.sum())} {tokens.context} tokens for {len(kept)} kept "
                         f"frames; the tokenizer must hold {tokens.context} (id {image_token_id}) as one "
                         f"special token and the chat template must not add image tokens")
    repeats = torch.ones_like(ids)
    repeats[is_ph] = torch.tensor([counts[i] for i in kept], dtype=torch.long)
    starts = torch.cumsum(repeats, 0) - repeats  # new position of each original token
    return ids.repeat_interleave(repeats), starts[is_ph].tolist()


def text_tokens(tokenizer, question: str, num_frames: int, system: Optional[str] = None,
                tokens: VisionTokens = INTERNVL_TOKENS, kept: Optional[Sequence[int]] = None) -> int:
    """L_text: prompt tokens that are not visual placeholders, with the lines of the ``kept``
    frames (default: all ``num_frames``; an upper bound for every plan, since dropping a frame
    only removes its line). Frame labels and the frame delimiters count as text."""
    question = _check_question(question, tokens)
    kept = range(num_frames) if kept is None else list(kept)
    text = render_chat(tokenizer, video_content(question, kept, tokens), system)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"]) - len(kept)


def plan_dest(counts: Sequence[int], frame_starts: Sequence[int]) -> List[int]:
    """``dest`` for ``pool_pack``: one row per frame (dropped frames: 0, ignored by the kernel)."""
    it = iter(frame_starts)
    dest = [next(it) if c > 0 else 0 for c in counts]
    if next(it, None) is not None:
        raise ValueError("frame_starts: more entries than frames with counts > 0")
    return dest


__all__ = ["build_video_prompt", "text_tokens", "render_chat", "render_messages", "video_content",
           "plan_dest",
           "IMG_START", "IMG_END", "IMG_CONTEXT", "INTERNVL_TOKENS"]
