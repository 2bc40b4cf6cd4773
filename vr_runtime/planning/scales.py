"""The pooling scales (s_g, s_1, s_0) from the command line: a fixed triple or the ``auto`` rule.

"scales" means this triple everywhere: ``AnswerOptions(scales=...)`` takes it (or ``auto``) and
``Request.build`` resolves it into the request's windows (``relevant_window`` = s_1,
``other_window`` = s_0, ``global_window`` = s_g).

``s_g`` pools every frame of a Global plan, ``s_1`` the Image Router's relevant frames and
``s_0`` the others of a Fragment plan (Section 3.2, Algorithm 1). One spelling everywhere
(``videorouter ask/eval/serve --scales``, the serve request's ``scales`` field, the lmms-eval
plugin's ``scales=`` model argument)::

    2,1,4     fixed (s_g, s_1, s_0): the paper's default (Section 3.2, Appendix H), the default here
    4,1,8     the paper's coarser setting (the "s=4,8" latency row, 4K-8K budgets)
    auto      the budget study's rule (Section 5.3, Appendix "Budget Sensitivity"), below

The ``auto`` rule. Section 5.3 reports which scales fit which budget on LongVideoBench: under
"extreme token budget scarcity (4K--8K tokens)" 64 frames run at s_g=4, s_0=8 and 128 frames
need s_0 >= 8; with "abundant budget (16K--24K tokens)" both 64 and 128 frames run at
s_g=2, s_0=4; the controlled protocol (12,288 tokens, 64 frames) uses s_g=2, s_0=4. The switch
depends on the budget, not on tokens per frame: 64 frames at 8K (128 tokens a frame) are coarse
while 128 frames at 16K (also 128 a frame) are not. So ``auto`` is

    B_img <= 40 * N  ->  (4, 1, 8)        else  (2, 1, 4)

with N the full-resolution tokens of one frame (256 for InternVL3 at 448x448): 40 * 256 =
10,240, the midpoint between the table's 8K and 12K columns. B_img is the visual budget of the
request (a fixed budget, or L_max - L_text - L_gen - epsilon for the requested frame count).
What the paper leaves open, and what ``auto`` chooses: s_0 = 8 exactly where it says ">= 8"
(128 frames at 4-8K); no coarser s_1 than 1 (the paper never changes s_1); (2, 1, 4) at 12K
for 128 frames (no figure given; Algorithm 1 drops low-relevance frames if they do not fit).

Why the default stays (2, 1, 4) and not ``auto``: the main results, the ablations, Stage 3
(Appendix H's ``global_scale`` / ``fragment_scale``) and the latency table's default row all use
(2, 1, 4); only the budget study changes scales, and it names them per setting.
"""
from __future__ import annotations

import re
from typing import Tuple, Union

PAPER_SCALES: Tuple[int, int, int] = (2, 1, 4)     # (s_g, s_1, s_0), Section 3.2 / Appendix H
COARSE_SCALES: Tuple[int, int, int] = (4, 1, 8)    # Section 5.3 at 4K-8K budgets
AUTO = "auto"
AUTO_FRAMES_OF_BUDGET = 40   # B_img <= 40 full-resolution frames' tokens: coarse (10,240 at 256)
SCALES_HELP = ("pooling scales s_g,s_1,s_0 (Global frames, relevant frames, other frames), e.g. "
               "2,1,4 (the paper's default) or 4,1,8; or 'auto': 4,1,8 when the visual budget is "
               "at most 40 frames' full-resolution tokens (10,240 at 256 a frame), else 2,1,4, "
               "as in the paper's budget study (default: 2,1,4)")

Scales = Union[Tuple[int, int, int], str]


class ScalesError(ValueError):
    """A ``--scales`` value that is neither ``auto`` nor three integers s_g,s_1,s_0."""


def parse_scales(value, name: str = "--scales") -> Scales:
    """``"2,1,4"`` / ``[2, 1, 4]`` / ``"auto"`` / None (the paper's default) -> a checked
    ``(s_g, s_1, s_0)`` or ``"auto"``; anything else is one ``ScalesError`` line."""
    if value is None:
        return PAPER_SCALES
    if isinstance(value, str):
        text = value.strip().lower()
        if text == AUTO:
            return AUTO
        # ":" and "/" too: lmms-eval splits its model_args at commas (scales=4:1:8)
        parts = [p for p in re.split(r"[,:/\s]+", text) if p]
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        parts = None
    try:
        if parts is None or len(parts) != 3 or any(isinstance(p, (bool, float)) for p in parts):
            raise ValueError
        s = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        raise ScalesError(f"{name} {value!r}: expected 'auto' or three integers s_g,s_1,s_0 "
                          f"(e.g. 2,1,4)") from None
    if min(s) < 1:
        raise ScalesError(f"{name} {value!r}: scales are pooling windows, each an integer >= 1")
    if s[1] > s[2]:
        raise ScalesError(f"{name} {value!r}: s_1 (relevant frames) must be at most s_0 (other "
                          f"frames); the relevant frames keep the finer resolution")
    return s


def auto_scales(budget: int, frame_tokens: int = 256) -> Tuple[int, int, int]:
    """Section 5.3's rule: the coarse scales at a budget of at most 40 frames' tokens."""
    return COARSE_SCALES if budget <= AUTO_FRAMES_OF_BUDGET * frame_tokens else PAPER_SCALES


def budget_from_text(text_tokens: int, max_length: int, max_new_tokens: int,
                     margin: int = 100) -> int:
    """B_img that ``max_length`` leaves beside a prompt of ``text_tokens`` text tokens. Never
    below 0: a hopeless budget is the runtime's to refuse."""
    from .budget import b_img
    return max(0, b_img(max_length, text_tokens, max_new_tokens, margin))


def resolve(scales: Scales, budget: int, frame_tokens: int = 256) -> Tuple[int, int, int]:
    """A parsed value -> the (s_g, s_1, s_0) to run."""
    return auto_scales(budget, frame_tokens) if scales == AUTO else tuple(scales)


def label(scales: Scales) -> str:
    """``"2,1,4"`` or ``"auto"``: how results files and tables name the setting."""
    return AUTO if scales == AUTO else ",".join(str(int(x)) for x in scales)


__all__ = ["PAPER_SCALES", "COARSE_SCALES", "AUTO", "SCALES_HELP", "ScalesError", "parse_scales",
           "auto_scales", "budget_from_text", "resolve", "label"]
