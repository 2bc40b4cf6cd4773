"""Training data formats (JSONL, one example per line, video paths relative to the file).

Frame relevance (Stage 1, as in Video-FLR)::

    {"video": "clips/v0001.mp4", "question": "What shape is the red object?",
     "answer": "circle", "frame_labels": [0, 0, 1, 1, 0, ...]}

``frame_labels`` has one 0/1 entry per *sampled* frame: the loader samples
``len(frame_labels)`` frames with InternVL's rule (the middle frame of each of T equal
segments), so label t belongs to the t-th sampled frame.

Any line may also give its own frame count, ``"num_frames": T`` (the synthetic task v2 does,
with videos of 8 to 64 sampled frames in one file): its video is sampled at T frames, and its
``frame_labels``, if any, must have T entries. Lines without it use the stage's ``num_frames``
(or ``len(frame_labels)``), as before.

Allocation policy (Stage 2, as in Video-QTR)::

    {"video": "clips/v0001.mp4", "question": "What is the background color?",
     "policy": "global"}            # or "fragment", or 0 / 1 (0 = Global, 1 = Fragment)

Joint fine-tuning (Stage 3): InternVL's conversation JSONL, one human turn and one answer::

    {"video": "clips/v0001.mp4",
     "conversations": [{"from": "human", "value": "<video>\\nWhat shape is the red object?"},
                       {"from": "gpt", "value": "circle"}],
     "frame_labels": [...], "policy": 1}      # both optional: add L_img / L_sem when present

What the routers read. The paper's routers read the question, H_q = E_{1:4}(Emb(q)), and so
does inference (``answer(router_question=...)``: eval and the lmms-eval plugin pass the bare
question while the LLM reads the multiple-choice prompt). Training gives them the same text:
``Example.routed_question`` is a line's ``"question"`` field when it has one; for a conversation
line without it, the human turn without ``<video>`` and without a trailing multiple-choice block
(the first line that starts like an option, ``A. ...``, and everything after it: the options and
the instruction, ``eval.prompting.mc_prompt``'s layout). The LLM's Stage 3 sequence keeps the
whole human turn (``Example.question``).

A frame-relevance line (question + answer) is accepted for Stage 3 as well. Every malformed
line raises ``DataFormatError`` naming the file, the line number and the field.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import List, Optional

from ..data import jsonl
from ..data.jsonl import JsonlError, write_jsonl  # noqa: F401  (re-exported)

POLICY_NAMES = ("global", "fragment")


class DataFormatError(JsonlError):
    """A training JSONL line that does not follow the documented format (a ``ValueError``)."""


@dataclass
class Example:
    """One training example; the fields a stage does not need may be None."""
    video: str
    question: str
    answer: Optional[str] = None
    frame_labels: Optional[List[int]] = None
    policy: Optional[int] = None
    meta: dict = field(default_factory=dict)
    router_question: Optional[str] = None   # what the routers read (None: ``question``)
    frames: Optional[int] = None            # the line's own "num_frames" T, if it gives one

    @property
    def routed_question(self) -> str:
        """The routers' text: the bare question, as ``answer(router_question=...)`` gives it."""
        return self.router_question or self.question

    @property
    def num_frames(self) -> Optional[int]:
        """Frames to sample for this line: its own ``num_frames``, else one per label."""
        if self.frames is not None:
            return self.frames
        return None if self.frame_labels is None else len(self.frame_labels)


def _policy(value, where: str) -> int:
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int) and value in (0, 1):
        return value
    if isinstance(value, str) and value.strip().lower() in POLICY_NAMES:
        return POLICY_NAMES.index(value.strip().lower())
    raise DataFormatError(f"{where}: 'policy' must be 0/'global' or 1/'fragment', got {value!r}")


def _labels(value, where: str) -> List[int]:
    if not isinstance(value, list) or not value:
        raise DataFormatError(f"{where}: 'frame_labels' must be a non-empty list of 0/1, "
                              f"got {value!r}")
    out = []
    for i, v in enumerate(value):
        if isinstance(v, bool):
            v = int(v)
        if v not in (0, 1) or not isinstance(v, int):
            raise DataFormatError(f"{where}: frame_labels[{i}] must be 0 or 1, got {v!r}")
        out.append(v)
    return out


def _text(rec: dict, key: str, where: str, required: bool = True) -> Optional[str]:
    v = rec.get(key)
    if v is None and not required:
        return None
    if not isinstance(v, str) or not v.strip():
        raise DataFormatError(f"{where}: '{key}' must be a non-empty string, got {v!r}")
    return v.strip()


def _video(rec: dict, where: str, root: str, check_files: bool) -> str:
    v = _text(rec, "video", where)
    path = v if os.path.isabs(v) else os.path.normpath(os.path.join(root, v))
    if check_files and not os.path.isfile(path):
        raise DataFormatError(f"{where}: video file {path!r} does not exist; paths are "
                              f"relative to the JSONL file's folder")
    return path


# An option line of a multiple-choice prompt: "A. text", "(B) text", "C) text".
_OPTION_LINE = re.compile(r"^\s*\(?[A-Z][.)]\)?\s+\S")


def bare_question(prompt: str) -> str:
    """The question of an LLM prompt: the text before its first option line (the options and
    the instruction after them dropped); the prompt itself when it has no options."""
    lines = prompt.splitlines()
    for i, line in enumerate(lines):
        if i > 0 and _OPTION_LINE.match(line):
            head = "\n".join(lines[:i]).strip()
            return head or prompt.strip()
    return prompt.strip()


def _conversation(rec: dict, where: str):
    conv = rec.get("conversations")
    if not isinstance(conv, list) or len(conv) < 2:
        raise DataFormatError(f"{where}: 'conversations' must be a list with a human turn and "
                              f"a gpt turn, got {conv!r}")
    q = a = None
    for i, turn in enumerate(conv[:2]):
        if not isinstance(turn, dict) or "from" not in turn or "value" not in turn:
            raise DataFormatError(f"{where}: conversations[{i}] must be "
                                  f"{{'from': ..., 'value': ...}}, got {turn!r}")
    if conv[0]["from"] != "human" or conv[1]["from"] != "gpt":
        raise DataFormatError(f"{where}: conversations must start with a 'human' then a 'gpt' "
                              f"turn, got {conv[0]['from']!r}, {conv[1]['from']!r}")
    q = str(conv[0]["value"]).replace("<video>", "").replace("<image>", "").strip()
    a = str(conv[1]["value"]).strip()
    if not q or not a:
        raise DataFormatError(f"{where}: empty question or answer in 'conversations'")
    return q, a


def parse_record(rec, kind: str, where: str, root: str = ".", check_files: bool = False) -> Example:
    """Validate one decoded JSON line. ``kind``: 'relevance', 'policy' or 'conversation'."""
    if not isinstance(rec, dict):
        raise DataFormatError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    if kind not in ("relevance", "policy", "conversation"):
        raise ValueError(f"kind: expected 'relevance', 'policy' or 'conversation', got {kind!r}")
    video = _video(rec, where, root, check_files)
    labels = _labels(rec["frame_labels"], where) if rec.get("frame_labels") is not None else None
    policy = _policy(rec["policy"], where) if rec.get("policy") is not None else None
    meta = {k: v for k, v in rec.items() if k in ("id", "category", "split", "kind", "phrasing",
                                                   "task", "factors", "varies", "source_frames")}
    frames = rec.get("num_frames")
    if frames is not None:
        if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1:
            raise DataFormatError(f"{where}: 'num_frames' must be an integer >= 1, "
                                  f"got {frames!r}")
        if labels is not None and len(labels) != frames:
            raise DataFormatError(f"{where}: {len(labels)} frame_labels but num_frames is "
                                  f"{frames}; give one label per sampled frame")
    router_q = None
    if kind == "conversation" and "conversations" in rec:
        q, a = _conversation(rec, where)
        # the routers read the bare question: the line's own "question", else the human turn
        # without its multiple-choice block
        router_q = (_text(rec, "question", where) if rec.get("question") is not None
                    else bare_question(q))
        router_q = None if router_q == q else router_q
    else:
        q = _text(rec, "question", where)
        a = _text(rec, "answer", where, required=(kind != "policy"))
    if kind == "relevance" and labels is None:
        raise DataFormatError(f"{where}: a frame-relevance line needs 'frame_labels' "
                              f"(one 0/1 per sampled frame)")
    if kind == "policy" and policy is None:
        raise DataFormatError(f"{where}: a policy line needs 'policy' "
                              f"(0/'global' or 1/'fragment')")
    return Example(video=video, question=q, answer=a, frame_labels=labels, policy=policy,
                   meta=meta, router_question=router_q, frames=frames)


def iter_jsonl(path: str, what: str = "data"):
    """Yield ``(where, record)`` for each non-blank line of a JSONL file, ``where`` being
    ``path:line`` for error messages; a missing file or a line that is not JSON is a
    ``DataFormatError`` (:func:`vr_runtime.data.jsonl.iter_jsonl` with training's error)."""
    return jsonl.iter_jsonl(path, what, error=DataFormatError)


def read_jsonl(path: str, kind: str, check_files: bool = True) -> List[Example]:
    """Read and validate a whole JSONL file (blank lines are skipped)."""
    root = os.path.dirname(os.path.abspath(path))
    out = [parse_record(rec, kind, where, root, check_files) for where, rec in iter_jsonl(path)]
    if not out:
        raise DataFormatError(f"{path}: no examples")
    return out


# ``write_jsonl`` lives in vr_runtime.data.jsonl (shared with eval and the synthetic task); it
# is imported above, so ``from vr_runtime.training.data import write_jsonl`` keeps working.
