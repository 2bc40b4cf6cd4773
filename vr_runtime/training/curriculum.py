"""The seams of Stage 3, and the registry of the curricula that plug into them.

The trainer runs the paper's Stages 1-3. A curriculum beyond the paper's (the tiny model's, in
the package ``vr_tiny``) changes Stage 3 in two places only, and the trainer knows nothing else
of it:

- **how an example is laid out** (:meth:`Curriculum.lay_out`): its plan (which frame gets which
  window), the (question, answer) turns of its sequence and the answer's trained wording
  (:meth:`Curriculum.answer_text`). The paper's: the routing plan ``Trainee.training_plan``
  makes, one turn, the answer as the data says it.
- **extra losses** (:meth:`Curriculum.extra_losses`): terms added to Stage 3's loss, each with
  its weight, computed from the laid-out sequence and what each watches of the forward pass
  (:class:`ExtraLoss`). The paper's: none.

A curriculum may also keep parameters of a trained group frozen (:meth:`Curriculum.frozen`).

A curriculum is registered with its options (:func:`register`): a dataclass whose fields are
the keys of its own section of a training config (``"tiny": {...}``), checked by the same
config loader as the paper's keys (``config.py``). A config without a section trains the
paper's curriculum. The package that defines a curriculum registers it when imported; the
trainer never imports that package.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple


@dataclass
class Layout:
    """One Stage 3 example as its sequence is laid out: ``plan`` gives one window per frame
    (0: left out) of the example's frames, or with ``src`` of virtual frames, ``src[t]`` the
    example's frame that virtual frame ``t`` shows; ``turns`` are the (question, answer) turns
    about those frames, the first in the runtime's video prompt; ``times`` the frames' times
    (for a prompt that writes them)."""
    plan: List[int]
    turns: List[Tuple[str, str]]
    src: Optional[List[int]] = None
    times: Optional[Sequence[float]] = None


@dataclass
class LaidSequence:
    """What an extra loss may read of one laid-out Stage 3 sequence: the token ``ids``, the
    prompt's length ``n_prompt``, the ``targets`` (``targets[i]`` is what row ``n_prompt - 1 +
    i`` predicts; -100 where nothing is trained), the ``layout``, each frame's placeholder rows
    (``counts``, from row ``dest``) and the example itself (``ex``: the batch's dict)."""
    tokenizer: Any
    ids: List[int]
    n_prompt: int
    targets: List[int]
    layout: Layout
    counts: List[int]
    dest: List[int]
    ex: dict


class ExtraLoss(Protocol):
    """A term of Stage 3's loss beyond the paper's: ``weight * mean over the batch's sequences
    that it selects``, logged as ``name`` every step (0 when no sequence had anything for it)."""
    name: str
    weight: float

    def select(self, seq: LaidSequence) -> Any:
        """What to supervise in ``seq``; falsy: nothing (the sequence adds no term)."""

    def watch(self, bb):
        """A context manager around the decoder's forward pass; what it yields is passed to
        :meth:`loss` (e.g. the attention inputs of some layers)."""

    def loss(self, bb, watched, selected):
        """The term of one sequence (a scalar tensor)."""


class Curriculum:
    """The paper's Stage 3 (the default of every config without an extension section). A
    curriculum beyond it subclasses this and overrides the seams; ``cfg`` is the whole
    ``TrainConfig``, ``options`` its own section (None here)."""

    siblings = False   # examples carry the other questions about their frames (``ex["turns"]``)

    def __init__(self, cfg, options=None):
        self.cfg, self.options = cfg, options

    def lay_out(self, trainee, policy_logits, frame_logits, ex: dict) -> Layout:
        """The example under the routing plan of training (``Trainee.training_plan``), one
        turn: its question and answer."""
        plan, _ = trainee.training_plan(policy_logits, frame_logits, ex)
        return Layout(plan, [(ex["question"], ex["answer"])], None, ex.get("times"))

    def answer_text(self, question: str, answer: str) -> str:
        """The answer as Stage 3 trains it to be said (the held-out evaluation compares the
        generated text with it)."""
        return answer

    def extra_losses(self, bb) -> List[ExtraLoss]:
        """The terms Stage 3 adds to its loss on backbone ``bb`` (checked against it)."""
        return []

    def frozen(self, bb) -> list:
        """Parameters kept frozen even when their group trains."""
        return []


@dataclass(frozen=True)
class Extension:
    """A curriculum and its options: ``name`` is its config section, ``options`` a dataclass
    (every field with a default; ``validate()`` raises ``ConfigError`` naming a bad key),
    ``curriculum(cfg, options)`` builds it for a stage, ``configs`` is the folder of its
    configs (or None)."""
    name: str
    options: type
    curriculum: Callable[[Any, Any], Curriculum]
    configs: Optional[str] = None

    def fields(self) -> List[str]:
        return [f.name for f in dataclasses.fields(self.options)]


EXTENSIONS: Dict[str, Extension] = {}


def register(ext: Extension) -> Extension:
    """Make ``ext``'s section known to the config loader and its curriculum to the trainer."""
    EXTENSIONS[ext.name] = ext
    return ext


def curriculum_for(cfg) -> Curriculum:
    """The curriculum a config trains: its extension section's, else the paper's."""
    for name, options in cfg.extensions.items():   # validate() allows one section at most
        return EXTENSIONS[name].curriculum(cfg, options)
    return Curriculum(cfg)


__all__ = ["Layout", "LaidSequence", "ExtraLoss", "Curriculum", "Extension", "EXTENSIONS",
           "register", "curriculum_for"]
