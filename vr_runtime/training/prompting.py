"""Stage 3 prompts: exactly the runtime's InternVL video prompt (``vr_runtime.prompt``).

Training and inference must build the same token sequence, or the fine-tuned LLM sees a
different layout at answer time; this module only adapts the runtime's return value."""
from __future__ import annotations

from typing import List, Sequence, Tuple


def video_prompt_ids(tokenizer, question: str, counts: Sequence[int],
                     image_token_id: int) -> Tuple[List[int], List[int]]:
    """-> (prompt ids ending with the assistant turn's opening, first placeholder row per kept
    frame)."""
    from vr_runtime.prompt import build_video_prompt
    ids, spans = build_video_prompt(tokenizer, question, list(counts), image_token_id)
    if hasattr(ids, "tolist"):
        ids = ids.reshape(-1).tolist()
    return list(ids), [int(s) for s in spans]
