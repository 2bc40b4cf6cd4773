"""Multiple-choice prompting and answer extraction, the way lmms-eval does it.

The LLM prompt (lmms-eval's ``longvideobench`` / ``mlvu`` / generic MC layout)::

    {question}
    A. {option}
    B. {option}
    ...
    Answer with the option's letter from the given choices directly.

The routers get the bare question (``router_question``): that is what they are trained on.
``--prompt-style bare`` gives the LLM the bare question too (no options, no instruction): for
models fine-tuned on open-ended answers that never saw a multiple-choice prompt -- the tiny
synthetic model -- scored with ``option-text``.

Scoring modes (``--answer-mode``):

* ``letter`` (default, real models): lmms-eval's extraction -- strip "The best answer is" and
  similar prefixes, then the first option letter standing alone ("B", "(B)", "B.", "B)",
  "Answer: B"). No letter -> wrong.
* ``option-text``: the option whose *text* the answer matches (exact after normalising case and
  punctuation, then a unique option contained in the answer), falling back to ``letter``. For
  models that answer with the content and not the letter -- the tiny synthetic model answers
  single words ("circle"), and letters it never learnt would make every method score chance.

Option log-likelihood scoring is not offered: ``VideoRouter.answer`` generates, and a
log-likelihood path would need a second public seam in the runtime.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

from .benchmarks import LETTERS

DEFAULT_POST_PROMPT = "Answer with the option's letter from the given choices directly."
ANSWER_MODES = ("letter", "option-text")
PROMPT_STYLES = ("mc", "bare")
ANSWER_PREFIXES = ("The best answer is", "The correct answer is", "The answer is", "The answer",
                   "The best option is", "The correct option is", "Best answer:", "Best option:",
                   "Answer:", "Option")


@dataclass(frozen=True)
class PromptConfig:
    pre_prompt: str = ""
    post_prompt: str = DEFAULT_POST_PROMPT
    answer_mode: str = "letter"
    style: str = "mc"

    def __post_init__(self):
        if self.answer_mode not in ANSWER_MODES:
            raise ValueError(f"--answer-mode {self.answer_mode!r}: expected one of "
                             f"{', '.join(ANSWER_MODES)}")
        if self.style not in PROMPT_STYLES:
            raise ValueError(f"--prompt-style {self.style!r}: expected one of "
                             f"{', '.join(PROMPT_STYLES)}")


def mc_prompt(question: str, options: Sequence[str], cfg: PromptConfig = PromptConfig()) -> str:
    """The LLM prompt: question, lettered options, instruction (style ``bare``: the question)."""
    if cfg.style == "bare":
        return question.strip()
    lines = [cfg.pre_prompt + question.strip() if cfg.pre_prompt else question.strip()]
    lines += [f"{LETTERS[i]}. {o}" for i, o in enumerate(options)]
    if cfg.post_prompt:
        lines.append(cfg.post_prompt)
    return "\n".join(lines)


def extract_letter(response: str, n_options: int) -> Optional[str]:
    """The option letter in ``response`` (lmms-eval's rule, made robust), or None."""
    letters = LETTERS[:n_options]
    s = (response or "").strip()
    for p in ANSWER_PREFIXES:
        s = re.sub(re.escape(p), " ", s, flags=re.I)
    s = s.strip()
    if not s:
        return None
    cls = f"[{letters}]"
    # A letter standing alone: start of text or after a non-letter, and not followed by a letter
    # (so "A" in "A cat" counts but the "I" of "It" does not).
    m = re.search(rf"(?:^|[^A-Za-z])\(?({cls})\)?(?:[.:,)]|\s|$)", s)
    if m:
        return m.group(1)
    if len(s.split()) > 10:
        return None
    m = re.fullmatch(rf"\W*({cls})\W*", s)
    return m.group(1) if m else None


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def match_option_text(response: str, options: Sequence[str]) -> Optional[str]:
    """The letter of the option whose text the response names, or None (ambiguous/none)."""
    r = _norm(response or "")
    if not r:
        return None
    norm = [_norm(o) for o in options]
    exact = [i for i, o in enumerate(norm) if o == r]
    if len(exact) == 1:
        return LETTERS[exact[0]]
    inside = [i for i, o in enumerate(norm) if o and re.search(rf"\b{re.escape(o)}\b", r)]
    if len(inside) == 1:
        return LETTERS[inside[0]]
    return None


def extract_answer(response: str, options: Sequence[str], mode: str = "letter") -> Optional[str]:
    """The predicted letter under ``mode`` (see the module doc), or None."""
    if mode == "option-text":
        got = match_option_text(response, options)
        if got is not None:
            return got
    return extract_letter(response, len(options))


__all__ = ["PROMPT_STYLES", "PromptConfig", "mc_prompt", "extract_letter", "match_option_text", "extract_answer",
           "ANSWER_MODES", "DEFAULT_POST_PROMPT"]
