"""Sequence reconstruction: pooled frame tokens written straight into ``inputs_embeds``.

``inputs_embeds = embed_tokens(input_ids)`` already has one row per placeholder; the fused kernel
(``vr_kernels.pool_pack`` with ``out=`` / ``dest=``) pools each frame of Z with its window and
writes the result into that frame's placeholder rows. There is no packed intermediate and no
``masked_scatter`` (which would read a boolean mask over L x D and a packed copy).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from vr_kernels import pool_pack, pooled_counts

from .backbones.prompt import plan_dest
from .planning.request_plan import frame_times

def _backend_kw(device: torch.device, backend: Optional[str]) -> dict:
    """On CPU the runtime takes pool_pack's vectorised torch path even under TRITON_INTERPRET=1:
    the interpreter is how the kernel tests run Triton on CPU, ~100x slower than torch there."""
    if backend is None:
        backend = "torch" if device.type == "cpu" else "auto"
    return {"backend": backend}


def placeholder_starts(input_ids: torch.Tensor, counts: Sequence[int], image_token_id: int):
    """First placeholder row of each kept frame, from the ids (host-side; checks contiguity)."""
    pos = (input_ids.reshape(-1).cpu() == image_token_id).nonzero().flatten().tolist()
    starts, off = [], 0
    for c in counts:
        if c == 0:
            continue
        if off + c > len(pos) or pos[off + c - 1] - pos[off] != c - 1:
            raise ValueError("input_ids: the placeholder rows of a frame are not contiguous")
        starts.append(pos[off])
        off += c
    return starts


def reconstruct_embeds(model, input_ids: torch.Tensor, Z: torch.Tensor, plan: Sequence,
                       image_token_id: int, grid: Tuple[int, int] = (16, 16),
                       frame_starts: Optional[Sequence[int]] = None,
                       backend: Optional[str] = None) -> torch.Tensor:
    """inputs_embeds [1, L, D] for the prompt ``input_ids`` with frame t of ``Z`` pooled by
    ``plan[t]`` in its placeholders.

    ``frame_starts`` (from :func:`vr_runtime.backbones.prompt.build_video_prompt`) avoids a device sync to
    find the placeholders; without it they are located on the host. ``backend``: passed to
    ``pool_pack`` (None: "torch" on CPU, "auto" -- Triton -- on CUDA)."""
    ids = input_ids.reshape(-1)
    if Z.ndim != 3 or Z.shape[0] != len(plan):
        raise ValueError(f"Z: expected [T={len(plan)}, N, D], got {tuple(Z.shape)}")
    counts = pooled_counts(plan, grid)
    n_ph = int((ids.cpu() == image_token_id).sum()) if ids.device.type == "cpu" or frame_starts is None \
        else None
    if n_ph is not None and n_ph != sum(counts):
        raise ValueError(f"input_ids: {n_ph} image placeholders (id {image_token_id}) but the plan "
                         f"pools the frames into {sum(counts)} tokens; build the prompt from the "
                         f"same plan (vr_runtime.backbones.prompt.build_video_prompt with pooled_counts(plan))")
    if frame_starts is None:
        frame_starts = placeholder_starts(ids, counts, image_token_id)
    dest = plan_dest(counts, frame_starts)
    emb = model.get_input_embeddings()
    embeds = emb(ids.to(emb.weight.device))  # fresh [L, D] buffer, not a view of the table
    D = embeds.shape[-1]
    if Z.shape[-1] != D:
        # Z wider than the embeddings: S streams side by side (Qwen3-VL's DeepStack features
        # after the main one). Every stream is pooled with the same plan in one pool_pack call
        # into [L, S*D] rows; a text row is its embedding and zeros in the extra streams.
        if Z.shape[-1] % D:
            raise ValueError(f"Z: width {Z.shape[-1]} is not a multiple of the embedding width {D}")
        embeds = torch.cat([embeds, embeds.new_zeros(embeds.shape[0], Z.shape[-1] - D)], -1)
    if Z.dtype != embeds.dtype or Z.device != embeds.device:
        Z = Z.to(device=embeds.device, dtype=embeds.dtype)
    # The Triton path writes in place and returns `out`; the reference returns a new tensor
    # (out-of-place for autograd), so always take the return value.
    embeds = pool_pack(Z, list(plan), grid, out=embeds, dest=dest,
                       **_backend_kw(embeds.device, backend))
    return embeds.unsqueeze(0)


def reconstruct_embeds_batch(model, input_ids: Sequence[torch.Tensor],
                             Zs: Sequence[torch.Tensor], plans: Sequence[Sequence],
                             image_token_id: int, grid: Tuple[int, int],
                             frame_starts: Sequence[Sequence[int]],
                             backend: Optional[str] = None) -> Tuple[torch.Tensor, List[int]]:
    """inputs_embeds of B prompts, right-padded into one [B, L_max, D] buffer, with every kept
    frame of every request pooled by ONE ``pool_pack`` call (request b's frames written at rows
    ``b * L_max + frame_starts[b]`` of the flattened buffer). -> (embeds, lengths).

    Row for row the result is what :func:`reconstruct_embeds` gives each request alone (the same
    embedding gather, the same per-window means: every output row of ``pool_pack`` depends on
    its own window only); padding rows are zeros, as ``GreedyDecoder`` pads. The requests' Z are
    concatenated for the call (one extra copy of the kept frames while it runs); the caller
    drops its own references right after, so no Z outlives the packing."""
    B = len(input_ids)
    if not (len(Zs) == len(plans) == len(frame_starts) == B) or B < 1:
        raise ValueError(f"reconstruct_embeds_batch: {B} prompts, {len(Zs)} Z, {len(plans)} plans "
                         f"and {len(frame_starts)} start lists")
    ids = [i.reshape(-1) for i in input_ids]
    lengths = [int(i.numel()) for i in ids]
    L = max(lengths)
    emb = model.get_input_embeddings()
    dev = emb.weight.device
    padded = torch.zeros(B, L, dtype=torch.long)
    all_frames, all_plan, all_dest = [], [], []
    for b in range(B):
        counts = pooled_counts(plans[b], grid)
        Z = Zs[b]
        if Z is None or Z.ndim != 3 or Z.shape[0] != len(plans[b]):
            raise ValueError(f"Z of request {b}: expected [T={len(plans[b])}, N, D], got "
                             f"{None if Z is None else tuple(Z.shape)}")
        n_ph = int((ids[b].cpu() == image_token_id).sum())
        if n_ph != sum(counts):
            raise ValueError(f"input_ids of request {b}: {n_ph} image placeholders but its plan "
                             f"pools the frames into {sum(counts)} tokens")
        padded[b, :lengths[b]] = ids[b].cpu()
        all_frames.append(Z)
        all_plan += list(plans[b])
        all_dest += [b * L + d for d in plan_dest(counts, frame_starts[b])]
    embeds = emb(padded.to(dev))                 # [B, L, D]: one gather for every row
    for b, n in enumerate(lengths):
        if n < L:
            embeds[b, n:] = 0                    # padding rows, as GreedyDecoder pads
    frames = torch.cat([Z.to(device=embeds.device, dtype=embeds.dtype) for Z in all_frames], 0) \
        if B > 1 else all_frames[0].to(device=embeds.device, dtype=embeds.dtype)
    del all_frames
    D = embeds.shape[-1]
    if frames.shape[-1] != D:   # wide Z (DeepStack streams): as in reconstruct_embeds
        if frames.shape[-1] % D:
            raise ValueError(f"Z: width {frames.shape[-1]} is not a multiple of the embedding "
                             f"width {D}")
        embeds = torch.cat([embeds, embeds.new_zeros(B, L, frames.shape[-1] - D)], -1)
        D = embeds.shape[-1]
    out = pool_pack(frames, all_plan, grid, out=embeds.view(B * L, D), dest=all_dest,
                    **_backend_kw(embeds.device, backend))
    return out.view(B, L, D), lengths


def build_prompt(lm, req, plan: Sequence, keep: Sequence[int], times=None):
    """The prompt of a plan on backbone ``lm``: ids [L] with per-frame placeholder counts, the
    first row of each kept frame, the kept frames' windows, and position ids (None: 1-D)."""
    ids, starts = lm.build_prompt(req.question, pooled_counts(plan, lm.grid), req.system,
                                  **frame_times(lm, times))
    kept_plan = [plan[t] for t in keep]
    return ids, starts, kept_plan, lm.position_ids(ids, kept_plan, starts)


def compress(lm, req, plan: Sequence, Z: torch.Tensor, keep: Sequence[int], timer, times=None,
             z_plan: Optional[Sequence] = None):
    """The compress stage: the prompt's ids, and the kept frames of Z pooled straight into
    their rows of inputs_embeds -> (ids [L], embeds [1, L, D], position_ids or None).
    ``z_plan``: the window of each row of Z (0 for a dropped frame, when Z holds every frame);
    None: Z holds the kept frames only."""
    with timer.stage("compress"):
        ids, starts, kept_plan, pos = build_prompt(lm, req, plan, keep, times)
        embeds = reconstruct_embeds(lm.model, ids, Z, kept_plan if z_plan is None else z_plan,
                                    lm.image_token_id, lm.grid, frame_starts=starts)
    return ids, embeds, pos


__all__ = ["reconstruct_embeds", "reconstruct_embeds_batch", "placeholder_starts",
           "build_prompt", "compress"]
