"""Option scoring for multiple-choice labels and evaluation: log p(continuation | video under a
plan, prompt), with the prompt and its pooled frames built exactly as ``VideoRouter.answer``
builds them. The label tools (vr_runtime.training.labels, .labeller) score plans with it; it is
not part of the inference path, so it lives here rather than on ``VideoRouter``."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from vr_kernels import pooled_counts

from ..backbones.base import output_cache
from ..reconstruct import reconstruct_embeds


@torch.inference_mode()
def option_logprobs(lm, Z: torch.Tensor, prompt: str, plans: Sequence[Sequence],
                    continuations: Sequence[Sequence[int]], system: Optional[str] = None,
                    batch_size: int = 8) -> torch.Tensor:
    """log p(continuation | video under plan, prompt) -> float32 [len(plans),
    len(continuations)] on the CPU: the sum of each continuation's token log-probabilities.

    ``Z`` [T, H*W, D] is every sampled frame encoded once (``lm.encode_frames``); each plan
    has one window per frame (0 = dropped), fixed by the caller (no planner, no budget).
    The prompt and its pooled frames are built exactly as ``VideoRouter.answer`` builds them
    (``lm.build_prompt``, ``reconstruct_embeds``, ``lm.position_ids``). Prompts of equal
    length are prefilled together, up to ``batch_size`` plans per decoder pass; a
    one-token continuation (an option letter) is read off the prefill's last row, longer
    ones continue from its KV cache, repeated once per continuation (memory: batch_size x
    len(continuations) caches -- lower ``batch_size`` for long prompts on large models)."""
    T = int(Z.shape[0]) if Z is not None and Z.ndim == 3 else -1
    if T < 1:
        raise ValueError(f"Z: expected [T, N, D] encoded frames, got "
                         f"{None if Z is None else tuple(Z.shape)}")
    if not continuations or any(len(c) < 1 for c in continuations):
        raise ValueError("continuations: expected one or more non-empty token-id lists")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected an int >= 1, got {batch_size!r}")
    prompts = []
    for i, plan in enumerate(plans):
        if len(plan) != T:
            raise ValueError(f"plans[{i}]: {len(plan)} windows for {T} frames")
        ids, starts = lm.build_prompt(prompt, pooled_counts(list(plan), lm.grid), system)
        prompts.append((i, list(plan), ids, starts))
    by_length: dict = {}
    for p in prompts:
        by_length.setdefault(p[2].numel(), []).append(p)
    out = torch.empty(len(prompts), len(continuations), dtype=torch.float32)
    for group in by_length.values():
        for k in range(0, len(group), batch_size):
            chunk = group[k:k + batch_size]
            out[[p[0] for p in chunk]] = _score_chunk(lm, Z, chunk, continuations)
    return out

def _score_chunk(lm, Z, chunk, continuations) -> torch.Tensor:
    """Equal-length prompts (one decoder batch) -> [len(chunk), len(continuations)]."""
    embeds, positions = [], []
    for _, plan, ids, starts in chunk:
        kept_plan = [w for w in plan if pooled_counts([w], lm.grid)[0] > 0]
        if kept_plan:
            embeds.append(reconstruct_embeds(lm.model, ids, Z, plan, lm.image_token_id,
                                             lm.grid, frame_starts=starts))
        else:   # every frame dropped: the text alone
            embeds.append(lm.embed_tokens(ids.to(lm.device))[None])
        positions.append(lm.position_ids(ids, kept_plan, starts))
    L = chunk[0][2].numel()
    pos = None if positions[0] is None else torch.cat(positions, 1)
    res = lm.forward(inputs_embeds=torch.cat(embeds, 0), position_ids=pos, logits_to_keep=1)
    first = torch.log_softmax(res.logits[:, -1].float(), -1)              # [b, V]
    C = len(continuations)
    score = first[:, [int(c[0]) for c in continuations]].clone()           # [b, C]
    n = max(len(c) for c in continuations) - 1
    if n == 0:
        return score.cpu()
    cache = output_cache(res)
    cache.batch_repeat_interleave(C)
    # Step j reads token j and predicts token j + 1. Continuations are right-padded with
    # their own last token: causal, so padding after a token never changes its logits.
    def padded(c, shift):
        return [int(c[min(j + shift, len(c) - 1)]) for j in range(n)]
    toks = torch.tensor([padded(c, 0) for c in continuations],
                        device=lm.device).repeat(len(chunk), 1)
    targets = torch.tensor([padded(c, 1) for c in continuations],
                           device=lm.device).repeat(len(chunk), 1)
    step_pos = None
    if pos is not None:
        step_pos = torch.cat([torch.cat([lm.step_position_ids(lm.next_position(p, L) + j)
                                         for j in range(n)], -1) for p in positions], 1)
        step_pos = step_pos.repeat_interleave(C, 1)
    o = lm.forward(inputs_embeds=lm.embed_tokens(toks), past_key_values=cache,
                   position_ids=step_pos, logits_to_keep=0)
    lp = torch.log_softmax(o.logits.float(), -1)                           # [b*C, n, V]
    got = lp.gather(-1, targets[..., None])[..., 0].view(len(chunk), C, n)
    for j, c in enumerate(continuations):
        score[:, j] += got[:, j, :len(c) - 1].sum(-1)
    return score.cpu()


__all__ = ["option_logprobs"]
