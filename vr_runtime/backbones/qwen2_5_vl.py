"""Qwen2.5-VL (Hugging Face ``Qwen2_5_VLForConditionalGeneration``) behind the backbone interface.

Paper Appendix E runs VideoRouter unchanged on Qwen2.5-VL; this module is everything that is
specific to it.

Loading
    A local ``Qwen2.5-VL-*-Instruct`` directory (``model_type`` ``qwen2_5_vl``) with
    ``local_files_only=True``, safetensors only, never ``trust_remote_code``; the
    ``tiny-qwen2.5-vl`` preset (:meth:`Qwen25VLBackbone.tiny`); random-weight shape presets
    (``vr_runtime/configs/qwen2_5_vl_{3b,7b}.json``, the public config.json layout) paired with
    the tiny tokenizer for latency benchmarks (:meth:`Qwen25VLBackbone.from_config`).

Frames and Qwen's temporal patches (the decision)
    Qwen's vision tower embeds ``temporal_patch_size = 2`` frames per 14x14x2 patch, so a video
    clip of 2N frames gives N temporal patches. VideoRouter routes *sampled frames*, and the
    paper's Qwen table (Dense, 64 frames = 16,384 visual tokens = 256 per frame) says one sampled
    frame per temporal patch. So **each sampled frame is one still image**, built exactly as
    ``Qwen2VLImageProcessor`` builds a single image: the 448x448 frame is normalised with the
    CLIP mean/std, cut into 14x14 patches flattened in the processor's order -- groups of
    (h/2, w/2, 2, 2) patches, each patch as (channel, temporal, 14, 14) -- and repeated over the
    temporal patch (:func:`frame_patches`); ``grid_thw = [1, 32, 32]`` per frame. The tower then
    attends within each frame only (its own image), and the patch merger's 256 outputs, after
    the window un-permutation HF applies, are Z_t in row-major order of the 16x16 merged grid
    (token k at row k // 16, column k % 16), the same layout as InternVL3's, so ``vr_kernels``
    pools both alike. ``tests/backbones/test_qwen2_5_vl.py`` checks the patch layout against the
    processor, Z_t against ``get_image_features``, and the row-major order with a tower whose
    blocks are the identity. (The other reading -- pairs of sampled frames in one temporal
    patch, Qwen's video mode -- halves the tokens per frame and makes a "frame" an unroutable
    half of a patch; it is not offered.)

Reduced resolution (the paper's "Qwen2.5-VL Budget" baseline)
    :meth:`Qwen25VLBackbone.at_resolution` gives a view of the same weights whose frames are
    h x w (multiples of 28) instead of 448x448: ``grid_thw = [1, h/14, w/14]`` per frame in the
    tower, an (h/28) x (w/28) merged grid per frame in Z, the prompt and the M-RoPE positions,
    still one still image per sampled frame (no temporal merge). :func:`budget_frame_size` is the
    baseline's rule: the largest ``smart_resize`` size of the full frame whose F frames fit the
    visual budget (``videorouter eval --methods budget-resize``; docs/PAPER.md, Qwen Budget row).

Prompt
    The same "FrameN:" layout as InternVL3, one image block per kept frame::

        Frame{i}: <|vision_start|><|image_pad|> x n_i<|vision_end|>

    in the checkpoint's chat template (ChatML). Frame numbers are sampled indices + 1.

Positions (M-RoPE)
    Qwen's decoder rotates each head-dim section by one of three position axes (t, h, w)
    (``mrope_section``). HF's ``get_rope_index`` gives text tokens (p, p, p) with p advancing by
    one, and an image whose merged grid is gh x gw, starting at p, positions
    (p, p + r, p + c) for its token at (r, c); the text after it continues at p + max(gh, gw).
    :func:`mrope_position_ids` does exactly that for a prompt whose kept frames hold *pooled*
    grids: a frame pooled by window (sh, sw) is a ceil(16/sh) x ceil(16/sw) image (the pooled
    tokens' own compact grid, not stretched over the 16x16 extent), a dropped frame has no block.
    With every window 1 this is ``get_rope_index`` on the same ids with ``image_grid_thw``
    [1, 32, 32] per frame, and for any plan it equals ``get_rope_index`` with each frame's grid
    [1, 2*gh, 2*gw] (tested). No two tokens share a (t, h, w) triple: an image's t is its own
    start p (so images never collide with each other), and its only triple with h = w = t is
    (p, p, p), a position no text token takes (text resumes at p + max(gh, gw)). Decoding
    continues at max + 1 with all three axes equal (:meth:`Qwen25VLBackbone.step_position_ids`).

Shadow stack
    The first 4 layers of the Qwen2.5-VL text decoder (``AutoModel.from_config(text_config)`` is
    ``Qwen2_5_VLTextModel``) with its M-RoPE rotary embedding; [Z_t; q] is positioned like a
    one-image prompt: Z_t as a grid image at 0, the question after it
    (:meth:`Qwen25VLBackbone.router_position_ids`).

Vision split (training's feature cache, Stage 3)
    :meth:`~Qwen25VLBackbone.vision_features` is the frozen tower up to the patch merger:
    per frame [256, 4C], row k holding the four pre-merger patch features of merged cell k
    (row-major 16x16), concatenated in the merger's own (2x2, row-major) order -- the same
    [256, 4C] shape InternVL3's pixel shuffle gives. :meth:`~Qwen25VLBackbone.project` is the
    trainable merger (RMSNorm + MLP) -> Z [b, 256, D].
"""
from __future__ import annotations

import copy
import pathlib
import threading
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from ..errors import ModelFilesError
from .base import (Backbone, CostShape, FrameSpec, VisionTokens, build_model, cache_kwargs,
                   check_pixels)
from .devices import pick_attn_implementation, resolve_device, resolve_dtype
from .files import check_weights_dir, load_hf_model

QWEN_TOKENS = VisionTokens("<|vision_start|>", "<|vision_end|>", "<|image_pad|>")
# Added to the tiny BPE for the tiny-qwen2.5-vl preset (ChatML's tokens are already in it).
QWEN_SPECIAL_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")

# Qwen2VLImageProcessor's image_mean / image_std (OpenAI CLIP).
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
FRAME_SIZE = (448, 448)  # full resolution, as in the paper: 32x32 patches of 14 -> 16x16 merged
# tokens (a view from at_resolution runs at a reduced size)


# ----------------------------------------------------------------------------- pixels
def frame_patches(pixel_values: torch.Tensor, patch_size: int = 14, merge_size: int = 2,
                  temporal_patch_size: int = 2) -> torch.Tensor:
    """Normalised frames [b, 3, H, W] -> Qwen's flattened patches [b*(H/p)*(W/p), 3*tp*p*p],
    each frame as one still image: ``Qwen2VLImageProcessor.patchify`` (patch groups in
    (h/m, w/m, m, m) order, each patch (channel, temporal, p, p), the frame repeated over the
    temporal patch)."""
    b, c, H, W = pixel_values.shape
    unit = patch_size * merge_size
    if H % unit or W % unit:
        raise ValueError(f"pixel_values: frames of {H}x{W} are not a multiple of {unit} "
                         f"(patch {patch_size} x merge {merge_size})")
    gh, gw = H // patch_size, W // patch_size
    x = pixel_values.reshape(b, c, gh // merge_size, merge_size, patch_size,
                             gw // merge_size, merge_size, patch_size)
    x = x.permute(0, 2, 5, 3, 6, 1, 4, 7)  # b, h/m, w/m, m, m, c, p, p
    x = x.unsqueeze(6).expand(-1, -1, -1, -1, -1, -1, temporal_patch_size, -1, -1)
    return x.reshape(b * gh * gw, c * temporal_patch_size * patch_size * patch_size)


class _MergeGroups(nn.Module):
    """Stands in for the patch merger inside the tower's forward: [n*unit, C] -> [n, unit*C]
    (the grouping the merger's MLP sees), so the tower's own window un-permutation is applied
    to the pre-merger features and nothing of the merger runs."""

    def __init__(self, unit: int):
        super().__init__()
        self.unit = unit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1, self.unit * x.shape[-1])


class VisionTrunk(nn.Module):
    """The frozen part of Qwen's vision path: the vision transformer without its patch merger.
    A view: it holds (shares) the tower's patch embedding, rotary embedding and blocks, so its
    ``parameters()`` are exactly the tower's minus the merger's (what training freezes)."""

    def __init__(self, visual: nn.Module):
        super().__init__()
        self.patch_embed = visual.patch_embed
        self.rotary_pos_emb = visual.rotary_pos_emb
        self.blocks = visual.blocks


# ----------------------------------------------------------------------------- positions
def mrope_position_ids(length: int, blocks: Sequence[Tuple[int, int, int]]) -> torch.Tensor:
    """M-RoPE positions [3, length] (int64) of a sequence whose image blocks are ``blocks`` =
    ``(first row, gh, gw)`` in increasing order (rows row..row+gh*gw-1 hold a row-major gh x gw
    grid) and whose other rows are text. Placement as HF's ``get_rope_index`` for images: text
    advances (t, h, w) together; an image starting at position p takes (p, p + r, p + c); the
    text after it continues at p + max(gh, gw)."""
    pos = torch.empty(3, length, dtype=torch.long)
    row = p = 0
    for start, gh, gw in blocks:
        n = gh * gw
        if start < row or start + n > length:
            raise ValueError(f"frame_starts: an image block of {n} rows at row {start} overlaps "
                             f"the previous block or runs past the prompt ({length} rows)")
        pos[:, row:start] = torch.arange(p, p + start - row)
        p += start - row
        pos[0, start:start + n] = p
        pos[1, start:start + n] = torch.arange(gh).repeat_interleave(gw) + p
        pos[2, start:start + n] = torch.arange(gw).repeat(gh) + p
        p += max(gh, gw)
        row = start + n
    pos[:, row:] = torch.arange(p, p + length - row)
    return pos


def plan_grids(plan: Sequence, grid: Tuple[int, int]) -> List[Optional[Tuple[int, int]]]:
    """Per frame: the pooled (gh, gw) of its window, None for a dropped frame."""
    from vr_kernels import normalize_window
    H, W = grid
    out = []
    for i, w in enumerate(plan):
        nw = normalize_window(w, f"plan[{i}]")
        out.append(None if nw is None else (-(-H // nw[0]), -(-W // nw[1])))
    return out


# ----------------------------------------------------------------------------- budget resolution
# Qwen2VLImageProcessor's min_pixels (preprocessor_config.json of Qwen2.5-VL-*-Instruct): 2x2
# merged tokens at least.
QWEN_MIN_PIXELS = 56 * 56


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = QWEN_MIN_PIXELS,
                 max_pixels: int = 14 * 14 * 4 * 1280) -> Tuple[int, int]:
    """Qwen's own resize rule, transformers' ``qwen2_vl`` ``smart_resize`` (the PIL processor's
    module: the default one imports torchvision, which this project does not install)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as rule
    return rule(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)


def budget_frame_size(frames: int, budget: int, size: Tuple[int, int] = FRAME_SIZE,
                      factor: int = 28, min_pixels: int = QWEN_MIN_PIXELS) -> Tuple[int, int]:
    """The Qwen2.5-VL Budget baseline's frame size: the largest ``smart_resize(H, W,
    max_pixels=m)`` of the full frame ``size`` = (H, W) (aspect kept as Qwen keeps it), over
    every pixel cap ``min_pixels <= m <= H*W`` (never above full resolution), whose ``frames``
    frames fit ``budget`` visual tokens: ``frames * (h/factor) * (w/factor) <= budget``. Each
    sampled frame is one still image (the module docstring), so Qwen's temporal merge does not
    apply. The token count of ``smart_resize(H, W, max_pixels=m)`` never decreases as m grows
    (below the rounded size both sides are floors of H, W * sqrt(m/HW); at it, the rounded size,
    larger than every capped one), so the largest fitting m is found by bisection.
    ``budget_frame_size(64, 12288)`` = (364, 364): 13x13 = 169 tokens a frame, 10,816 in all."""
    H, W = (int(v) for v in size)
    for name, v in (("frames", frames), ("budget", budget)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {v!r}")

    def tokens(m: int) -> Tuple[int, Tuple[int, int]]:
        h, w = smart_resize(H, W, factor, min_pixels, m)
        return frames * (h // factor) * (w // factor), (h, w)

    lo, hi = min_pixels, max(min_pixels, H * W)
    n, hw = tokens(lo)
    if n > budget:
        raise ValueError(f"budget: {budget} visual tokens cannot hold {frames} frames even at "
                         f"Qwen's smallest size {hw[0]}x{hw[1]} ({n // frames} tokens a frame); "
                         f"raise the budget or lower --frames")
    while lo < hi:   # invariant: m = lo fits; find the largest m that fits
        mid = (lo + hi + 1) // 2
        if tokens(mid)[0] <= budget:
            lo = mid
        else:
            hi = mid - 1
    return tokens(lo)[1]


# ----------------------------------------------------------------------------- the backbone
class QwenGridPositions:
    """What the Qwen-VL backbones (2.5-VL, 3-VL and 3.5) share over their merged patch grid:
    the grid read from the vision config (:meth:`_init_grid`), the frozen trunk and the LM
    head, views at another frame size, and M-RoPE positions for prompts of pooled grids. Needs
    ``image_token_id``, ``vision_tokens``, ``frames_per_unit`` and ``device`` of the backbone."""

    def _init_grid(self, model, name: str, trunk: nn.Module,
                   frame_size: Tuple[int, int]) -> None:
        """Patch, merge and temporal patch sizes from the vision config (the merged unit must
        tile the full ``frame_size``), the frame size, the frozen trunk, the merger's stand-in and the lock
        under which ``vision_features`` swaps the merger(s) out for one call."""
        vc = model.config.vision_config
        self.patch_size = int(vc.patch_size)
        self.merge_size = int(vc.spatial_merge_size)
        self.temporal_patch_size = int(vc.temporal_patch_size)
        unit = self.patch_size * self.merge_size
        if frame_size[0] % unit or frame_size[1] % unit:
            raise ModelFilesError(f"model {name!r}: patch {self.patch_size} x merge "
                                  f"{self.merge_size} does not tile {frame_size} frames")
        # (H, W) of every frame: the full size, or a view's own size (at_resolution)
        self.frame_size: Tuple[int, int] = frame_size
        self._trunk = trunk
        self._group = _MergeGroups(self.merge_size ** 2)
        self._swap = threading.Lock()

    @property
    def grid(self) -> Tuple[int, int]:
        u = self.patch_size * self.merge_size
        return self.frame_size[0] // u, self.frame_size[1] // u

    def lm_head(self) -> nn.Module:
        return self.model.lm_head

    def vision_tower(self) -> nn.Module:
        return self._trunk

    def step_position_ids(self, position: int) -> torch.Tensor:
        """[3, 1, 1]: a decoded token is text, all three axes at ``position`` (the base
        class's ``next_position``, max + 1, is where HF's rope_deltas put the first one)."""
        return torch.full((3, 1, 1), int(position), dtype=torch.long, device=self.device)

    def at_resolution(self, height: int, width: int) -> "Backbone":
        """A view of this model (the same weights, tokenizer and merger-swap lock) whose frames
        are ``height`` x ``width`` (multiples of patch x merge: 28 for Qwen2.5-VL, 32 for
        Qwen3-VL): its frame spec, token grid, vision call, prompt counts and M-RoPE positions
        all follow, as Qwen's processor would run the model on frames of that size (the
        Qwen2.5-VL Budget baseline; :func:`budget_frame_size` picks the size)."""
        unit = self.patch_size * self.merge_size
        size = (height, width)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= unit and v % unit == 0
                   for v in size):
            raise ValueError(f"at_resolution: {height}x{width} is not a frame size of this model; "
                             f"height and width must be positive multiples of {unit} "
                             f"(patch {self.patch_size} x merge {self.merge_size})")
        if size == tuple(self.frame_size):
            return self
        view = copy.copy(self)   # shallow: shares model, tokenizer, trunk, merger and _swap
        view.frame_size = size
        return view

    def position_ids(self, ids: torch.Tensor, plan: Sequence, frame_starts: Sequence[int],
                     grid: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        """M-RoPE positions [3, 1, L] (int64, on the model's device) of a prompt ``ids`` [L]
        whose kept units hold the grids of ``plan`` (one window per unit: a frame, or
        Qwen3-VL's temporal patch; 0 = dropped) starting at ``frame_starts`` (one row per kept
        unit, in order): ``get_rope_index``'s placement, one block per unit."""
        ids = ids.reshape(-1)
        units = "frames" if self.frames_per_unit == 1 else "units"
        placeholder = self.vision_tokens.context
        grids = plan_grids(plan, tuple(grid or self.grid))
        kept = [g for g in grids if g is not None]
        starts = [int(s) for s in frame_starts]
        if len(starts) != len(kept):
            raise ValueError(f"frame_starts: {len(starts)} entries for {len(kept)} kept {units}")
        total = sum(gh * gw for gh, gw in kept)
        n_ph = int((ids == self.image_token_id).sum())
        if n_ph != total:
            raise ValueError(f"ids: {n_ph} {placeholder} rows but the plan's kept {units} "
                             f"hold {total} tokens; build the prompt from the same plan")
        blocks = [(s, gh, gw) for s, (gh, gw) in zip(starts, kept)]
        for s, gh, gw in blocks:
            if not bool((ids[s:s + gh * gw] == self.image_token_id).all()):
                raise ValueError(f"frame_starts: rows {s}..{s + gh * gw - 1} are not all "
                                 f"{placeholder} placeholders")
        return mrope_position_ids(ids.numel(), blocks).unsqueeze(1).to(self.device)

    def router_position_ids(self, tokens_grid: Tuple[int, int], num_text: int,
                            batch: int) -> torch.Tensor:
        """Positions [3, batch, gh*gw + num_text] of [Z_t; q]: the unit's (pooled) grid as a
        block at position 0, then the question."""
        gh, gw = (int(v) for v in tokens_grid)
        if gh < 1 or gw < 1 or num_text < 0 or batch < 1:
            raise ValueError(f"router_position_ids: bad grid {tokens_grid}, num_text {num_text} "
                             f"or batch {batch}")
        pos = mrope_position_ids(gh * gw + int(num_text), [(0, gh, gw)])
        return pos.unsqueeze(1).expand(3, int(batch), -1).to(self.device)


class Qwen25VLBackbone(QwenGridPositions, Backbone):
    family = "qwen2_5_vl"
    resizes_frames = True
    model_types = ("qwen2_5_vl",)
    vision_tokens = QWEN_TOKENS

    def __init__(self, model, tokenizer, device, dtype, name):
        super().__init__(model, tokenizer, device, dtype, name)
        visual = model.model.visual
        self._init_grid(model, name, VisionTrunk(visual), FRAME_SIZE)
        self._merger = visual.merger

    # ------------------------------------------------------------------ identity and parts
    @property
    def frame_spec(self) -> FrameSpec:
        return FrameSpec(size=self.frame_size, mean=CLIP_MEAN, std=CLIP_STD)

    def budget_frame_size(self, frames: int, budget: int) -> Tuple[int, int]:
        """The Qwen2.5-VL Budget rule (:func:`budget_frame_size`) for this model's full frame
        size, patch and merge."""
        return budget_frame_size(frames, budget, size=FRAME_SIZE,
                                 factor=self.patch_size * self.merge_size)

    @classmethod
    def spec_from_config(cls, config: dict) -> FrameSpec:
        return FrameSpec(size=FRAME_SIZE, mean=CLIP_MEAN, std=CLIP_STD)  # fixed, as in the paper

    @classmethod
    def cost_shape(cls, config: dict) -> CostShape:
        """Qwen2.5-VL's tower on one 448x448 frame (the frame repeated over the temporal patch,
        see the module docstring): 32x32 patches, no CLS, window attention except in
        ``fullatt_block_indexes``, SwiGLU MLPs; the merger (2x2 patches, RMSNorm, two linears at
        4x the tower's width); then the Qwen2 LLM (flat or nested ``text_config`` layout)."""
        v = config["vision_config"]
        t = dict(config, **(config.get("text_config") or {}))
        patch, merge = int(v.get("patch_size", 14)), int(v.get("spatial_merge_size", 2))
        side = FRAME_SIZE[0] // patch
        window = int(v.get("window_size", 112)) // patch
        d_vis = v["hidden_size"]
        return CostShape(d_vis=d_vis, vis_heads=v["num_heads"], vis_layers=v["depth"],
                         vis_ff=v["intermediate_size"], vis_tokens=side * side,
                         tokens_per_frame=(side // merge) ** 2,
                         d=t["hidden_size"], layers=t["num_hidden_layers"],
                         heads=t["num_attention_heads"],
                         kv_heads=t.get("num_key_value_heads", t["num_attention_heads"]),
                         ff=t["intermediate_size"], vocab=t["vocab_size"],
                         patch_dim=3 * int(v.get("temporal_patch_size", 2)) * patch * patch,
                         vis_gated_mlp=True, vis_window_tokens=window * window,
                         vis_full_layers=len(v.get("fullatt_block_indexes") or ()),
                         merge_hidden=merge * merge * d_vis)

    def decoder(self) -> nn.Module:
        return self.model.model.language_model  # Qwen2_5_VLTextModel

    def projector(self) -> nn.Module:
        return self._merger  # Qwen2_5_VLPatchMerger: RMSNorm + MLP over 2x2 patch groups

    # ------------------------------------------------------------------ vision
    def vision_features(self, pixel_values: torch.Tensor,
                        chunk_size: int = 16) -> Iterator[Tuple[int, torch.Tensor]]:
        """Per chunk of frames [b, 3, 448, 448] (a view's ``frame_size``): the tower up to the
        merger -> [b, 256, 4C] (row k: merged cell k of the row-major 16x16 grid -- ``grid`` --
        its 2x2 patches concatenated)."""
        check_pixels(pixel_values, chunk_size)
        H, W = self.frame_size
        if tuple(pixel_values.shape[-2:]) != (H, W):
            raise ValueError(f"pixel_values: this Qwen2.5-VL model takes frames of {H}x{W}, got "
                             f"{tuple(pixel_values.shape[-2:])}")
        visual = self.model.model.visual
        p = next(self._trunk.parameters())
        gh, gw = H // self.patch_size, W // self.patch_size
        n = self.grid[0] * self.grid[1]
        for i in range(0, pixel_values.shape[0], chunk_size):
            pv = pixel_values[i:i + chunk_size].to(device=p.device, dtype=p.dtype, non_blocking=True)
            b = pv.shape[0]
            grid_thw = torch.tensor([[1, gh, gw]] * b, dtype=torch.long, device=p.device)
            # HF's tower un-permutes its attention windows only after the merger, inside its
            # forward; swapping the merger for a reshape runs exactly that forward up to the
            # merger, without copying it (its internals change between transformers releases).
            with self._swap:
                visual.merger = self._group
                try:
                    out = visual(frame_patches(pv, self.patch_size, self.merge_size,
                                               self.temporal_patch_size), grid_thw=grid_thw)
                finally:
                    visual.merger = self._merger
            v = out.pooler_output if hasattr(out, "pooler_output") else out
            del out
            yield i, v.reshape(b, n, -1)

    def project(self, v: torch.Tensor) -> torch.Tensor:
        """[b, 256, 4C] -> Z [b, 256, D]: the merger on each frame's 2x2 patch groups."""
        p = next(self._merger.parameters())
        b, n, c4 = v.shape
        unit = self.merge_size ** 2
        z = self._merger(v.to(device=p.device, dtype=p.dtype).reshape(b * n * unit, c4 // unit))
        return z.view(b, n, -1)

    def reference_inputs(self, ids: torch.Tensor, pixel_values: torch.Tensor) -> dict:
        """Keyword arguments of HF's own ``model(...)`` for prompt ``ids`` [L] that holds every
        frame of ``pixel_values`` [T, 3, 448, 448] (a view's ``frame_size``) at window 1: the
        dense reference the compressed path must equal (Qwen derives M-RoPE itself only when
        given ``mm_token_type_ids``)."""
        ids = ids.reshape(1, -1).to(self.device)
        gh, gw = self.frame_size[0] // self.patch_size, self.frame_size[1] // self.patch_size
        return {"input_ids": ids,
                "pixel_values": frame_patches(pixel_values, self.patch_size, self.merge_size,
                                              self.temporal_patch_size).to(self.device),
                "image_grid_thw": torch.tensor([[1, gh, gw]] * pixel_values.shape[0],
                                               dtype=torch.long, device=self.device),
                "mm_token_type_ids": (ids == self.image_token_id).int()}

    # ------------------------------------------------------------------ generation
    def forward(self, *, inputs_embeds=None, input_ids=None, position_ids=None,
                past_key_values=None, logits_to_keep: int = 1, attention_mask=None):
        """As the base class, but never lets HF derive positions itself: without ids and grids
        it would offset them by ``rope_deltas`` left over from an earlier multimodal call.
        ``position_ids=None`` means text positions continuing the cache (all axes equal)."""
        if position_ids is None:
            x = inputs_embeds if inputs_embeds is not None else input_ids
            past = past_key_values.get_seq_length() if past_key_values is not None else 0
            position_ids = (torch.arange(past, past + x.shape[1], device=x.device)
                            .view(1, 1, -1).expand(3, x.shape[0], -1))
        kw = {} if attention_mask is None else {"attention_mask": attention_mask}
        return self.model(inputs_embeds=inputs_embeds, input_ids=input_ids,
                          position_ids=position_ids, **cache_kwargs(self.model, past_key_values),
                          use_cache=True, return_dict=True, logits_to_keep=logits_to_keep, **kw)

    # ------------------------------------------------------------------ construction
    @classmethod
    def load(cls, path, device="cpu", dtype=None,
             attn_implementation: Optional[str] = None) -> "Qwen25VLBackbone":
        """A local Qwen2.5-VL-*-Instruct directory, in eval mode."""
        from transformers import Qwen2_5_VLForConditionalGeneration
        path = pathlib.Path(path).expanduser()
        check_weights_dir(path, "qwen2_5_vl", "Qwen2.5-VL-*-Instruct")
        model, tok, dev, dt = load_hf_model(Qwen2_5_VLForConditionalGeneration, path, device,
                                            dtype, attn_implementation)
        return cls(model, tok, dev, dt, path.name)

    @classmethod
    def preset_config(cls, name: str = "tiny-qwen2.5-vl") -> dict:
        tok = tiny_tokenizer()
        return tiny_config_dict(len(tok), special_ids(tok))

    @classmethod
    def tiny(cls, device="cpu", dtype=None, attn_implementation: Optional[str] = None,
             seed: int = 0) -> "Qwen25VLBackbone":
        """The ``tiny-qwen2.5-vl`` preset: :func:`tiny_config_dict` with deterministic random
        weights (built and filled on the CPU, then moved: the same weights on every device)."""
        tok = tiny_tokenizer()
        cfg = tiny_config_dict(len(tok), special_ids(tok))
        return cls._build(cfg, tok, "tiny-qwen2.5-vl", device, dtype, seed, attn_implementation,
                          build_on_cpu=True)

    @classmethod
    def from_config(cls, config, device="cpu", dtype=None, seed: int = 0,
                    attn_implementation: Optional[str] = None,
                    name: str = "config") -> "Qwen25VLBackbone":
        """Random weights of a shape preset (a config.json dict in the public Qwen2.5-VL
        layout; ``backbones.backbone_from_config`` reads paths), for latency benchmarks. Built on ``device`` with transformers' init
        skipped, then filled by ``tiny.init_weights_``. Paired with the tiny tokenizer: the
        image/video/vision-start/end ids and eos/pad/bos are rewritten to its ids (timings depend
        on shapes and lengths, not on token identities)."""
        if not isinstance(config, dict):
            raise ValueError(f"config: expected a path or a dict, got {type(config).__name__}")
        if config.get("model_type", "qwen2_5_vl") != "qwen2_5_vl":
            raise ValueError(f"config: model_type {config.get('model_type')!r}, expected 'qwen2_5_vl'")
        tok = tiny_tokenizer()
        cfg = with_token_ids(config, special_ids(tok), len(tok))
        return cls._build(cfg, tok, name, device, dtype, seed, attn_implementation)

    @classmethod
    def _build(cls, cfg: dict, tok, name, device, dtype, seed, attn_implementation,
               build_on_cpu: bool = False) -> "Qwen25VLBackbone":
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        attn = pick_attn_implementation(attn_implementation, dev, dt)
        where = torch.device("cpu") if build_on_cpu else dev
        model = build_model(Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLConfig.from_dict(cfg),
                            dt, attn, bool(attn_implementation), where, seed)
        return cls(model.to(dev).eval(), tok, dev, dt, name)


# ----------------------------------------------------------------------------- tiny preset
def tiny_tokenizer():
    """The shipped tiny BPE (``assets/tiny/tokenizer.json``) plus Qwen's vision special tokens,
    built locally (ids 1024.. after the BPE's 1024). ChatML's tokens are already in it."""
    from .tiny import load_tiny_tokenizer
    tok = load_tiny_tokenizer()
    tok.add_tokens(list(QWEN_SPECIAL_TOKENS), special_tokens=True)
    for t in QWEN_SPECIAL_TOKENS:
        assert len(tok.encode(t, add_special_tokens=False)) == 1, t
    return tok


def special_ids(tok) -> Dict[str, int]:
    names = QWEN_SPECIAL_TOKENS + ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    return {t: int(tok.convert_tokens_to_ids(t)) for t in names}


def tiny_config_dict(vocab_size: int, ids: Dict[str, int]) -> dict:
    """Qwen2_5_VLConfig (HF config.json layout) of ``tiny-qwen2.5-vl``: the real geometry
    (448x448, patch 14, merge 2, temporal patch 2, window 112 = 4x4 merged tokens) with small
    widths and depths. Vision: 2 blocks, block 0 windowed and block 1 full attention (the 7B's
    pattern of window blocks closed by a full one, [7, 15, 23, 31], at depth 2), hidden 64 in
    4 heads. Text: 4 layers, hidden 128, 4 heads of 32 (16 rotary frequencies) split by
    ``mrope_section`` [4, 6, 6] into t/h/w, the 7B's [16, 24, 24] of 64 scaled down."""
    return {
        "model_type": "qwen2_5_vl",
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "tie_word_embeddings": False,
        "vision_config": {
            "model_type": "qwen2_5_vl_vision",
            "depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 4,
            "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "window_size": 112, "fullatt_block_indexes": [1],
            "out_hidden_size": 128, "hidden_act": "silu", "tokens_per_second": 2,
        },
        "text_config": {
            "model_type": "qwen2_5_vl_text",
            "vocab_size": vocab_size, "hidden_size": 128, "intermediate_size": 256,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]},
            "use_sliding_window": False, "tie_word_embeddings": False,
            "bos_token_id": ids["<|im_start|>"], "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
    }


def with_token_ids(config: dict, ids: Dict[str, int], vocab_needed: int) -> dict:
    """A copy of a Qwen2.5-VL config dict (public flat layout or with ``text_config``) with its
    token ids pointed at the tiny tokenizer's."""
    cfg = copy.deepcopy(config)
    cfg.pop("_comment", None)
    cfg.update(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
               vision_start_token_id=ids["<|vision_start|>"],
               vision_end_token_id=ids["<|vision_end|>"])
    cfg.pop("vision_token_id", None)
    text = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg
    if int(text.get("vocab_size", 0)) < vocab_needed:
        raise ValueError(f"config: vocab_size {text.get('vocab_size')} is smaller than the tiny "
                         f"tokenizer ({vocab_needed} ids)")
    text.update(eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
                bos_token_id=ids["<|im_start|>"])
    return cfg


__all__ = ["Qwen25VLBackbone", "QwenGridPositions", "QWEN_TOKENS", "QWEN_SPECIAL_TOKENS", "CLIP_MEAN", "CLIP_STD",
           "FRAME_SIZE", "QWEN_MIN_PIXELS", "VisionTrunk", "budget_frame_size", "smart_resize", "frame_patches", "mrope_position_ids", "plan_grids",
           "tiny_tokenizer", "tiny_config_dict", "special_ids", "with_token_ids"]
