"""A training dialogue in the tokenizer's own chat template.

The first turn of a training sequence is the runtime's video prompt (``build_prompt``, the chat
template's user turn and generation prompt; ChatML for a tokenizer without a template, as the
runtime renders it: ``backbones.prompt.render_messages``). What closes an answer and what a later user turn
looks like are read off the same template, by rendering a two-turn conversation with stand-in
texts and cutting it around them, so that training and answering share one format whatever the
backbone's template is. The text of each piece is what the template writes, so a sequence
tokenises as the template's conversation does.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

from vr_runtime.backbones.prompt import render_chat, render_messages

_Q1, _A, _Q2 = "FIRSTQUESTION", "THEANSWER", "NEXTQUESTION"
_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class ChatTurns:
    """``end``: the special token that closes an answer (trained after it: decoding stops at
    it); a later user turn is ``before + question + after``, ``after`` ending with the
    assistant's generation prompt."""
    end: str
    before: str
    after: str

    def follow_up(self, question: str) -> str:
        return self.before + question + self.after


def _split(tok) -> ChatTurns:
    first = render_chat(tok, _Q1) + _A
    full = render_messages(tok, [{"role": "user", "content": _Q1},
                                 {"role": "assistant", "content": _A},
                                 {"role": "user", "content": _Q2}])
    if not full.startswith(first) or _Q2 not in full[len(first):]:
        raise ValueError("chat template: a two-turn conversation does not continue its first "
                         "turn's text, so training dialogues cannot be laid out in it")
    between = full[len(first):]
    ids = tok(between, add_special_tokens=False)["input_ids"]
    end = tok.convert_ids_to_tokens(ids[0]) if ids else ""
    if not (end and between.startswith(end) and end in tok.get_added_vocab()):
        raise ValueError(f"chat template: no special token closes an answer (it is followed by "
                         f"{between[:20]!r})")
    before, after = between[len(end):].split(_Q2, 1)
    return ChatTurns(end, before, after)


def chat_turns(tok) -> ChatTurns:
    """The pieces of ``tok``'s chat template (read once per tokenizer)."""
    try:
        return _CACHE[tok]
    except (KeyError, TypeError):
        pass
    turns = _split(tok)
    try:
        _CACHE[tok] = turns
    except TypeError:   # a tokenizer that takes no weak reference: read again next time
        pass
    return turns


__all__ = ["ChatTurns", "chat_turns"]
