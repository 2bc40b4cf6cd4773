"""Stage 3 training layouts beyond the inference-matched plans (tiny-only, off by default).

A model answers only from layouts it has seen. The shipped tiny model trained on the plans its
routers make for 8 to 64 sampled frames, so two layouts that users ask for were never in its
training data:

- **dense**: every sampled frame at full resolution (the paper's dense reference), or as many
  as ``model_max_length`` holds, spread evenly in time (the ``budget`` baseline);
- **long**: hundreds to thousands of sampled frames, a few relevant ones and a long run of
  others, planned by today's Algorithm 1 (the few at s_1, hundreds at s_0 or dropped) or by a
  long-prompt planner (``planning/long_prompt.py``).

Studies of the dense layout (docs/TRAINING_STUDIES.md, recipe v3: ``dense_probe3_tiny/`` at
commit 507b324) add a drawn dense cap
(``dense_cap``), capped dense plans that keep the event's frames (``keep_evidence``) and dense
*dialogues*, every question about the same frames in one sequence (``dialogue_turns``), and
*captions* in their place (``caption_turn``).

A long example is built from a short one without decoding anything: the example's frames are
*stretched* to a virtual count ``T'``. Each relevant frame appears once or twice (a short event
stays short), and the irrelevant frames fill the rest in time order, each repeated about evenly,
so the question's answer is unchanged (the relevant frames are the same pictures) while the
prompt has the long layout, its frame numbers up to ``T'`` included. ``src[t']`` names the
source frame of virtual frame ``t'``; only the frames the plan keeps are gathered, so a virtual
count of 2,048 costs no more memory than its plan's kept frames.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch


def stretch(labels: Sequence[bool], num_frames: int, gen: Optional[torch.Generator] = None,
            max_repeat: int = 2) -> List[int]:
    """Source frame of each of ``num_frames`` virtual frames, in time order: every relevant
    source frame 1..``max_repeat`` times, the irrelevant ones sharing the rest evenly (the
    earlier ones get the remainder). With no irrelevant frame, or ``num_frames`` not above the
    source count, the identity."""
    T = len(labels)
    rel = [bool(x) for x in labels]
    others = [t for t in range(T) if not rel[t]]
    reps = {t: 1 + int(torch.randint(max_repeat, (), generator=gen)) for t in range(T) if rel[t]}
    free = num_frames - sum(reps.values())
    if num_frames <= T or not others or free < len(others):
        return list(range(T))
    share, extra = divmod(free, len(others))
    for i, t in enumerate(others):
        reps[t] = share + (1 if i < extra else 0)
    return [t for t in range(T) for _ in range(reps[t])]


def stretched_times(times: Optional[Sequence[float]], num_frames: int) -> Optional[List[float]]:
    """Timestamps for ``num_frames`` virtual frames spread over the source's duration (None when
    the source has none), so a prompt that writes times stays monotonic."""
    if times is None or len(times) == 0:
        return None
    T = len(times)
    step = (float(times[-1]) - float(times[0])) / max(T - 1, 1) if T > 1 else 1.0
    span = step * T
    return [float(times[0]) + span * k / num_frames for k in range(num_frames)]


def draw_int(lo: int, hi: int, gen: Optional[torch.Generator] = None) -> int:
    """Uniform integer in [lo, hi] from torch's RNG (the loop seeds it)."""
    return int(torch.randint(lo, hi + 1, (), generator=gen))


def global_twin(planner: str) -> str:
    """The Global planner a Global example gets where a Fragment ``planner`` was drawn
    (``fragment-long-16`` -> ``global-long-16``; the ``-mid`` variants share their base's Global
    plan, having no relevant frames to give neighbours)."""
    return planner.replace("fragment", "global").replace("-mid", "")


def keep_evidence(plan: Sequence[int], labels: Optional[Sequence[bool]],
                  more: Sequence[Sequence[bool]] = ()) -> List[int]:
    """``plan`` (a dense plan: some frames kept at one window, the rest 0) with the same number
    of frames kept, but the labelled relevant ones first (as many as fit: ``labels``' before
    those of the ``more`` label lists) and the others spread evenly in time over the rest: a
    dense plan that drops the event's frames cannot show the answer it is trained to say. Time
    order is the plan's; unchanged without labels or when every relevant frame is already
    kept."""
    kept = [t for t, w in enumerate(plan) if w != 0]
    if labels is None or not kept:
        return list(plan)
    rel = [t for t, x in enumerate(labels) if x]
    for extra in more:
        rel += [t for t, x in enumerate(extra) if x and t not in rel]
    if all(plan[t] != 0 for t in rel):
        return list(plan)
    n, window = len(kept), plan[kept[0]]
    chosen = rel[:n]
    relevant = set(rel)
    others = [t for t in range(len(plan)) if t not in relevant]
    k = n - len(chosen)
    if k > 0:
        chosen += [others[(2 * i + 1) * len(others) // (2 * k)] for i in range(k)]
    keep = set(chosen)
    return [window if t in keep else 0 for t in range(len(plan))]


def dialogue_turns(plan: Sequence[int], ex: dict) -> List[tuple]:
    """(question, answer) turns of one Stage 3 sequence: the example's own, then, for a dense
    ``plan`` (every kept frame at s_1), every other question about the same frames
    (``ex["turns"]``) whose evidence the plan keeps, in a random order. Each later turn is
    another query of the same frames, which is what makes a question's color bind to one frame
    among many (one question per sequence leaves a single weak query, as Stage 0 found for one
    frame)."""
    turns = [(ex["question"], ex["answer"])]
    if set(plan) - {0, 1} or not ex.get("turns"):
        return turns
    kept = torch.tensor([w != 0 for w in plan])

    def shown(t):   # no frame labels, none relevant (absent), or one relevant frame kept
        lab = t.get("labels")
        if lab is None:
            return True
        rel = lab > 0.5
        return len(lab) == len(plan) and (not bool(rel.any()) or bool(kept[rel].any()))

    more = [t for t in ex["turns"] if shown(t)]
    return turns + [(more[k]["question"], more[k]["answer"])
                    for k in torch.randperm(len(more)).tolist()]


CAPTION_QUESTION = "What shape is each object?"
CAPTION_ABSENT = "no"      # Stage 0's caption word for a color with no object (one token)


def asked_color(question: str) -> Optional[str]:
    """The one color ``question`` asks about, or None: none named, or a size word with it ("the
    large red object": a same-color distractor, so that color has two objects)."""
    from vr_runtime.data.synthetic_videos import SIZE_WORDS
    from .route import cue_word
    color = cue_word(question)
    words = set(question.lower().replace("?", " ").split())
    return None if color is None or words & set(SIZE_WORDS) else color


def caption_turn(turns) -> Optional[tuple]:
    """(question, caption) that stands in for a dense dialogue: every color its ``turns`` ask
    about, in a random order, each followed by its object's shape or ``no``
    (`` red circle blue no``), from those turns' own answers; None when no turn names one color
    with one object.

    Stage 0's caption (``pretrain.py``) in the multi-frame layout: the row of each color word
    predicts its object's shape directly, so that row learns to find its color among every
    frame. A question's answer trains that row only through the rows after it, and on dense
    layouts the tiny answerer names either target's shape about evenly
    (``docs/TRAINING_STUDIES.md``, task v7). The caption replaces the dialogue rather than
    closing it: after the answers in text it could copy them from there. A same-color
    distractor's question (a size word: "the large red object") is left out: that color has
    two objects of two shapes."""
    from vr_runtime.data.synthetic_videos import ABSENT_ANSWER, SHAPES
    pairs = {}
    for q, a in turns:
        color = asked_color(q)
        if color is None or a not in (*SHAPES, ABSENT_ANSWER):
            continue
        pairs[color] = CAPTION_ABSENT if a == ABSENT_ANSWER else a
    if not pairs:
        return None
    colors = list(pairs)
    order = torch.randperm(len(colors)).tolist()
    return CAPTION_QUESTION, "".join(f" {colors[k]} {pairs[colors[k]]}" for k in order)


def captioned(turns, plan: Sequence[int], prob: float) -> list:
    """``turns``, or with probability ``prob`` on a dense ``plan`` (every kept frame at full
    resolution: windows 0 and 1 only) the one turn of their caption (``caption_turn``) when
    they have one. No random draw at ``prob`` 0, so runs without captions are as before."""
    if prob and not set(plan) - {0, 1} and torch.rand(()).item() < prob:
        caption = caption_turn(turns)
        if caption:
            return [caption]
    return turns


def color_first(question: str, answer: str) -> str:
    """``answer`` with the asked color's word first (``red circle``) when it is a shape and
    ``question`` asks about one color (``asked_color``); else ``answer`` itself (``none``
    included).

    A tiny-only answer format. Among several full-resolution frames the tiny answerer names
    either target's shape when the shape is the answer's first token: that row must find the
    color in the question, then the object of that color, two hops it does not learn. It binds
    when the shape is predicted from the color word's own row, the one hop Stage 0's captions
    train (``docs/TRAINING_STUDIES.md``, task v8). Echoing the color first puts the shape on
    that row; an option-text reader still finds the one option in the answer."""
    from vr_runtime.data.synthetic_videos import SHAPES
    color = asked_color(question)
    return f"{color} {answer}" if color is not None and answer in SHAPES else answer


def colored(turns, on: bool) -> list:
    """``turns`` with each answer in ``color_first`` form when ``on``."""
    return [(q, color_first(q, a)) for q, a in turns] if on else list(turns)


def dense_cap(frames, gen: Optional[torch.Generator] = None) -> int:
    """The dense plan's frame cap: ``frames`` itself (an int; 0 for none), or drawn uniformly
    from ``[lo, hi]``, so dense examples come with few frames as well as many."""
    if isinstance(frames, int):
        return frames
    return draw_int(int(frames[0]), int(frames[1]), gen)


def kept_rows(plan: Sequence, src: Sequence[int], dest: Sequence[int]):
    """(source frame, window, dest row) of each kept virtual frame, in time order: what
    ``pool_pack`` needs to write a stretched plan from the source frames alone."""
    out = [(src[t], w, d) for t, (w, d) in enumerate(zip(plan, dest)) if w != 0]
    return [s for s, _, _ in out], [w for _, w, _ in out], [d for _, _, d in out]


__all__ = ["stretch", "stretched_times", "draw_int", "global_twin", "keep_evidence",
           "dialogue_turns", "asked_color", "caption_turn", "captioned", "CAPTION_QUESTION",
           "CAPTION_ABSENT", "color_first", "colored", "dense_cap", "kept_rows"]
