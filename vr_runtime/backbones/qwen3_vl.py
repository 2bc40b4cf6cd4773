"""Qwen3-VL, dense and MoE (Hugging Face ``Qwen3VLForConditionalGeneration`` /
``Qwen3VLMoeForConditionalGeneration``) behind the backbone interface.

Everything specific to Qwen3-VL lives here; nothing outside this module names it.

Loading
    A local ``Qwen3-VL-*-Instruct`` directory (``model_type`` ``qwen3_vl``) with
    ``local_files_only=True``, safetensors only, never ``trust_remote_code``; the
    ``tiny-qwen3-vl`` preset (:meth:`Qwen3VLBackbone.tiny`, random weights); random-weight shape
    presets (``vr_runtime/configs/qwen3_vl_{2b,8b}.json``) paired with the tiny tokenizer. The
    MoE checkpoints (``qwen3_vl_moe``: :class:`Qwen3VLMoeBackbone`, ``tiny-qwen3-vl-moe``,
    ``qwen3_vl_30b_a3b.json``) differ only in the LLM's MLPs, which the shadow stack copies.

The routing unit: one temporal patch (the decision; docs/PAPER.md, Qwen3-VL row)
    Qwen3-VL's own video input: its tower embeds ``temporal_patch_size = 2`` consecutive frames
    per 16x16x2 patch, and its processor writes one block per temporal patch, each after a text
    timestamp::

        <t_0 seconds><|vision_start|><|video_pad|> x n_0<|vision_end|><t_1 seconds>...

    A frame alone has no tokens of its own (the two frames of a patch are mixed from the patch
    embedding on), so the unit the routers score, the planner pools and the prompt keeps or
    drops is one temporal patch: :meth:`Qwen3VLBackbone.units` groups the decoded frames in
    pairs (an odd last frame repeated, as the processor pads), ``[U, 2*3, H, W]``, and every
    stage after decoding sees U units where other backbones see frames. A unit's time is the
    processor's: the mean of its first and last frame's times (the frames' true presentation
    times, from the decoder), written ``<{t:.1f} seconds>``. A dropped unit loses its
    timestamp too (the processor has no block without tokens).

Frames
    448x448 (the paper's size, a multiple of patch 16 x merge 2), normalised with mean = std =
    0.5 (Qwen3-VL's processor); 28x28 patches per frame, a 14x14 merged grid: 196 tokens a unit.

DeepStack
    The tower also merges the hidden states of ``deepstack_visual_indexes`` (3 layers) with
    their own mergers, and the LLM adds stream j to its hidden states after decoder layer j at
    the visual rows. Z carries them: Z is ``[U, N, S*D]`` with S = 1 + 3 streams side by side
    (main, then each DeepStack stream; :class:`StreamMergers`, the projector, holds one merger a
    stream and projects each), so one ``pool_pack`` pools every stream with the same
    per-unit plan (``reconstruct.reconstruct_embeds`` writes the wide rows; a text row is zero in
    the DeepStack part) and :meth:`Qwen3VLBackbone.forward` and the shadow stack
    (``routers.ShadowStack``) hand the extra streams to the decoder's own DeepStack injection
    with every row marked visual: adding a zero row is exact, so this equals HF's injection at
    the visual rows only.

Positions (interleaved M-RoPE)
    ``get_rope_index`` splits a video into one (1, h, w) block per temporal patch: text
    advances all three axes together, a unit starting at p whose merged grid is gh x gw takes
    (p, p + r, p + c), the text after it continues at p + max(gh, gw): the same placement as
    Qwen2.5-VL's images, so ``qwen2_5_vl.mrope_position_ids`` gives it, and a pooled unit is
    its pooled grid. The interleaving of t/h/w over the rotary frequencies is inside the
    decoder's rotary embedding, which the shadow stack copies.
"""
from __future__ import annotations

import contextlib
import pathlib
from typing import Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .base import (Backbone, CostShape, FrameSpec, VisionTokens, build_model, cache_kwargs,
                   deepstack_kwargs)
from .devices import pick_attn_implementation, resolve_device, resolve_dtype
from .files import check_weights_dir, load_hf_model
from .qwen2_5_vl import QwenGridPositions, special_ids, tiny_tokenizer, with_token_ids

QWEN3_TOKENS = VisionTokens("<|vision_start|>", "<|vision_end|>", "<|video_pad|>")
# Qwen3-VL's processor (Qwen3VLVideoProcessor image_mean / image_std).
QWEN3_MEAN = (0.5, 0.5, 0.5)
QWEN3_STD = (0.5, 0.5, 0.5)
FRAME_SIZE = (448, 448)


def unit_patches(pixel_values: torch.Tensor, patch_size: int = 16, merge_size: int = 2,
                 temporal_patch_size: int = 2) -> torch.Tensor:
    """Units [b, tp*3, H, W] (tp frames' channels side by side) -> the flattened patches
    ``Qwen3VLVideoProcessor.patchify`` makes of them: [b*(H/p)*(W/p), 3*tp*p*p], patch groups
    in (h/m, w/m, m, m) order, each patch (channel, temporal, p, p)."""
    b, ct, H, W = pixel_values.shape
    tp, p, m = temporal_patch_size, patch_size, merge_size
    c = ct // tp
    gh, gw = H // p, W // p
    x = pixel_values.reshape(b, tp, c, gh // m, m, p, gw // m, m, p)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)   # b, h/m, w/m, m, m, c, tp, p, p
    return x.reshape(b * gh * gw, c * tp * p * p)


def group_units(n: int, k: int) -> List[List[int]]:
    """Frame positions of each unit of ``k`` consecutive frames; the last one padded with the
    last frame (as the processor pads a video to a multiple of the temporal patch)."""
    return [[min(i + j, n - 1) for j in range(k)] for i in range(0, n, k)]


def unit_times(times: Sequence[float], k: int) -> List[float]:
    """The processor's timestamp of each unit: the mean of its first and last frame's times
    (``Qwen3VLProcessor._calculate_timestamps``)."""
    return [(float(times[g[0]]) + float(times[g[-1]])) / 2 for g in group_units(len(times), k)]


def timestamp(t: float) -> str:
    return f"<{t:.1f} seconds>"


def prompt_times(n: int, times: Optional[Sequence[float]], k: int) -> List[float]:
    """The times written before each of ``n`` units of ``k`` frames: ``times`` (one a unit), or
    without them (a frame tensor, or a caller without the clip) those of Qwen's default
    sampling, 2 frames a second, so unit i spans frames k*i .. k*i + k - 1."""
    if times is None:
        return unit_times([i / 2.0 for i in range(n * k)], k)
    times = [float(t) for t in times]
    if len(times) != n:
        raise ValueError(f"times: {len(times)} unit times for {n} units")
    return times


def check_units(pixel_values: torch.Tensor, chunk_size: int, frames_per_unit: int,
                frame_size: Tuple[int, int]) -> None:
    """Refuse anything but units [U, 3*k, H, W] of ``frame_size`` frames (k = ``frames_per_unit``,
    as ``Backbone.units`` groups them) and a chunk size >= 1."""
    k = frames_per_unit
    if pixel_values.ndim != 4 or pixel_values.shape[1] != 3 * k:
        raise ValueError(f"pixel_values: expected units [U, {3 * k}, H, W] ({k} frames each, "
                         f"Backbone.units), got {tuple(pixel_values.shape)}")
    if tuple(pixel_values.shape[-2:]) != tuple(frame_size):
        raise ValueError(f"pixel_values: this Qwen3-VL model takes frames of "
                         f"{frame_size[0]}x{frame_size[1]}, got "
                         f"{tuple(pixel_values.shape[-2:])}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size: expected an int >= 1, got {chunk_size!r}")


class VisionTrunk(nn.Module):
    """The frozen part of Qwen3-VL's vision path: the tower without its mergers (a view: the
    tower's own modules, so its ``parameters()`` are exactly what training freezes)."""

    def __init__(self, visual: nn.Module):
        super().__init__()
        self.patch_embed = visual.patch_embed
        self.pos_embed = visual.pos_embed
        self.rotary_pos_emb = visual.rotary_pos_emb
        self.blocks = visual.blocks


class StreamMergers(nn.ModuleList):
    """The trainable part of Qwen3-VL's vision path, one merger per stream of Z: the tower's
    merger (the main stream), then its DeepStack mergers (none on Qwen3.5's tower) -- the
    tower's own modules. A ModuleList itself, so its parameters and state-dict keys are those
    of the plain list (what Stage 3 trains and saves)."""

    @classmethod
    def of(cls, visual: nn.Module) -> "StreamMergers":
        return cls([visual.merger, *(getattr(visual, "deepstack_merger_list", None) or [])])

    def project(self, v: torch.Tensor, merge_size: int) -> torch.Tensor:
        """[b, N, S*4C] -> Z [b, N, S*D]: each stream through its own merger."""
        p = next(self.parameters())
        b, n, width = v.shape
        c4 = width // len(self)
        unit = merge_size ** 2
        v = v.to(device=p.device, dtype=p.dtype)
        z = [m(v[..., s * c4:(s + 1) * c4].reshape(b * n * unit, c4 // unit)).view(b, n, -1)
             for s, m in enumerate(self)]
        return torch.cat(z, -1)


@contextlib.contextmanager
def mergers_set_aside(visual: nn.Module, stand_in: nn.Module):
    """The tower with its merger and every DeepStack merger replaced by ``stand_in`` (a reshape
    into merge groups) for the block: it then runs exactly HF's forward up to the mergers,
    without copying that forward (its internals change between transformers releases). The
    caller holds the lock that keeps the swap to its one call."""
    main = visual.merger
    deep = getattr(visual, "deepstack_merger_list", None)
    visual.merger = stand_in
    if deep is not None:
        visual.deepstack_merger_list = nn.ModuleList([stand_in] * len(deep))
    try:
        yield visual
    finally:
        visual.merger = main
        if deep is not None:
            visual.deepstack_merger_list = deep


class Qwen3VLBackbone(QwenGridPositions, Backbone):
    family = "qwen3_vl"
    model_types = ("qwen3_vl",)
    vision_tokens = QWEN3_TOKENS
    placeholder_id_key = "video_token_id"   # the placeholder is <|video_pad|>, not the image's
    uses_frame_times = True
    resizes_frames = True   # at_resolution / budget_frame_size: the budget-resize baseline
    # transformers classes (names, imported on use) and the checkpoint layout of this family
    hf_model, hf_config, layout = ("Qwen3VLForConditionalGeneration", "Qwen3VLConfig",
                                   "Qwen3-VL-*-Instruct")
    preset = "tiny-qwen3-vl"

    def __init__(self, model, tokenizer, device, dtype, name):
        super().__init__(model, tokenizer, device, dtype, name)
        visual = model.model.visual
        self._init_grid(model, name, VisionTrunk(visual), FRAME_SIZE)
        self.frames_per_unit = self.temporal_patch_size
        # DeepStack streams (Qwen3-VL: 3; a tower without them, Qwen3.5's: none)
        vc = model.config.vision_config
        self.streams = 1 + len(getattr(vc, "deepstack_visual_indexes", None) or ())
        self._mergers = StreamMergers.of(visual)

    # ------------------------------------------------------------------ identity and parts
    @property
    def frame_spec(self) -> FrameSpec:
        return FrameSpec(size=self.frame_size, mean=QWEN3_MEAN, std=QWEN3_STD)

    def budget_frame_size(self, frames: int, budget: int) -> Tuple[int, int]:
        """The budget baseline's frame size on Qwen3-VL: the largest ``smart_resize`` size
        (factor 32, at least a 2x2 merged grid) of the full frame whose ceil(frames / 2) units
        fit ``budget`` tokens -- Qwen2.5-VL's rule (``qwen2_5_vl.budget_frame_size``) with
        Qwen3-VL's factor, counted in temporal patches."""
        from .qwen2_5_vl import budget_frame_size
        unit = self.patch_size * self.merge_size
        units = -(-int(frames) // self.frames_per_unit) if isinstance(frames, int) else frames
        return budget_frame_size(units, budget, size=FRAME_SIZE, factor=unit,
                                 min_pixels=(2 * unit) ** 2)

    @classmethod
    def spec_from_config(cls, config: dict) -> FrameSpec:
        return FrameSpec(size=FRAME_SIZE, mean=QWEN3_MEAN, std=QWEN3_STD)

    @classmethod
    def cost_shape(cls, config: dict) -> CostShape:
        """Qwen3-VL's tower on one temporal patch of 448x448 frames: 28x28 patches of 16 (x2
        frames in the patch embedding), full attention in every block, fc1 / GELU / fc2 MLPs,
        learned position embeddings; the merger (2x2 patches, two linears at 4x the tower's
        width; the three DeepStack mergers are the same size and not counted); then the LLM.
        Per *unit* (temporal patch): the cost model's frames are the routing units."""
        v, t = config["vision_config"], config["text_config"]
        patch, merge = int(v.get("patch_size", 16)), int(v.get("spatial_merge_size", 2))
        side = FRAME_SIZE[0] // patch
        d_vis = v["hidden_size"]
        return CostShape(d_vis=d_vis, vis_heads=v["num_heads"], vis_layers=v["depth"],
                         vis_ff=v["intermediate_size"], vis_tokens=side * side,
                         tokens_per_frame=(side // merge) ** 2,
                         d=t["hidden_size"], layers=t["num_hidden_layers"],
                         heads=t["num_attention_heads"],
                         kv_heads=t.get("num_key_value_heads", t["num_attention_heads"]),
                         ff=t["intermediate_size"], vocab=t["vocab_size"],
                         patch_dim=3 * int(v.get("temporal_patch_size", 2)) * patch * patch,
                         merge_hidden=merge * merge * d_vis, head_dim=int(t.get("head_dim") or 0))

    def decoder(self) -> nn.Module:
        return self.model.model.language_model   # Qwen3VLTextModel (takes the DeepStack streams)

    def projector(self) -> nn.Module:
        return self._mergers   # the merger and the DeepStack mergers (trainable in Stage 3)

    # ------------------------------------------------------------------ units
    def units(self, pixel_values: torch.Tensor, indices: Sequence[int],
              times: Optional[Sequence[float]]):
        """Decoded frames [T, 3, H, W] -> temporal patches [U, tp*3, H, W] (U = ceil(T / tp);
        the last padded with the last frame), each unit's first source frame, and the units'
        timestamps (None when the frames have no times)."""
        k = self.frames_per_unit
        if pixel_values.ndim != 4 or pixel_values.shape[1] != 3:
            raise ValueError(f"pixel_values: expected [T, 3, H, W] frames, got "
                             f"{tuple(pixel_values.shape)}")
        groups = group_units(int(pixel_values.shape[0]), k)
        flat = [i for g in groups for i in g]
        pv = pixel_values[flat].reshape(len(groups), 3 * k, *pixel_values.shape[-2:])
        idx = [int(indices[g[0]]) for g in groups]
        return pv, idx, None if times is None else unit_times(times, k)

    def unit_labels(self, labels: Sequence) -> list:
        """Per-frame 0/1 labels -> per unit: relevant if either of its frames is."""
        return [max(labels[i] for i in g) for g in group_units(len(labels), self.frames_per_unit)]

    # ------------------------------------------------------------------ vision
    def vision_features(self, pixel_values: torch.Tensor,
                        chunk_size: int = 16) -> Iterator[Tuple[int, torch.Tensor]]:
        """Per chunk of units [b, 6, 448, 448]: the tower up to its mergers -> [b, N, S*4C]:
        row k holds merged cell k's four pre-merger patch features (row-major 14x14 grid) of
        the last block, then of each DeepStack layer."""
        check_units(pixel_values, chunk_size, self.frames_per_unit, self.frame_size)
        visual = self.model.model.visual
        p = next(self._trunk.parameters())
        gh, gw = self.frame_size[0] // self.patch_size, self.frame_size[1] // self.patch_size
        n = self.grid[0] * self.grid[1]
        for i in range(0, pixel_values.shape[0], chunk_size):
            pv = pixel_values[i:i + chunk_size].to(device=p.device, dtype=p.dtype, non_blocking=True)
            b = pv.shape[0]
            grid_thw = torch.tensor([[1, gh, gw]] * b, dtype=torch.long, device=p.device)
            with self._swap, mergers_set_aside(visual, self._group):
                out = visual(unit_patches(pv, self.patch_size, self.merge_size,
                                          self.temporal_patch_size), grid_thw=grid_thw)
            streams = [out.pooler_output, *(getattr(out, "deepstack_features", None) or [])]
            del out
            yield i, torch.cat([s.reshape(b, n, -1) for s in streams], -1)

    def project(self, v: torch.Tensor) -> torch.Tensor:
        """[b, N, S*4C] -> Z [b, N, S*D]: each stream through its own merger."""
        return self._mergers.project(v, self.merge_size)

    def encode_frames(self, pixel_values: torch.Tensor, chunk_size: int = 16,
                      requires_grad: bool = False) -> torch.Tensor:
        """Units [U, 6, H, W] -> Z [U, N, S*D] (main stream, then the DeepStack streams)."""
        check_units(pixel_values, chunk_size, self.frames_per_unit, self.frame_size)
        p = next(self._mergers.parameters())
        H, W = self.grid
        U = pixel_values.shape[0]
        with torch.set_grad_enabled(requires_grad and torch.is_grad_enabled()):
            if requires_grad:
                return torch.cat([self.project(v.to(p.dtype))
                                  for _, v in self.vision_features(pixel_values, chunk_size)], 0)
            Z = torch.empty(U, H * W, self.streams * self.hidden_size, device=p.device,
                            dtype=p.dtype)
            for i, v in self.vision_features(pixel_values, chunk_size):
                z = self.project(v.to(p.dtype))
                Z[i:i + z.shape[0]].copy_(z)
                del v, z
        return Z

    def reference_inputs(self, ids: torch.Tensor, pixel_values: torch.Tensor) -> dict:
        """Keyword arguments of HF's own ``model(...)`` for prompt ``ids`` [L] holding every
        unit of ``pixel_values`` [U, 6, 448, 448] at window 1 (one video of U temporal patches)."""
        ids = ids.reshape(1, -1).to(self.device)
        gh, gw = self.frame_size[0] // self.patch_size, self.frame_size[1] // self.patch_size
        return {"input_ids": ids,
                "pixel_values_videos": unit_patches(pixel_values, self.patch_size,
                                                    self.merge_size,
                                                    self.temporal_patch_size).to(self.device),
                "video_grid_thw": torch.tensor([[pixel_values.shape[0], gh, gw]],
                                               dtype=torch.long, device=self.device),
                "mm_token_type_ids": (ids == self.image_token_id).int() * 2}

    # ------------------------------------------------------------------ prompt
    def _content(self, question: str, kept: Sequence[int], times: List[float]) -> str:
        vt = self.vision_tokens
        return "".join(f"{timestamp(times[i])}{vt.start}{vt.context}{vt.end}" for i in kept) + \
            question

    def build_prompt(self, question: str, counts: Sequence[int], system: Optional[str] = None,
                     times: Optional[Sequence[float]] = None):
        """Qwen3-VL's video prompt: per kept unit its timestamp and a block of ``counts[i]``
        placeholders, then the question, in the chat template -> (ids [L], first placeholder
        row of each kept unit)."""
        from .prompt import _check_question, render_chat
        question = _check_question(question, self.vision_tokens)
        counts = [int(c) for c in counts]
        if any(c < 0 for c in counts):
            raise ValueError(f"counts: every entry must be >= 0, got {counts}")
        times = prompt_times(len(counts), times, self.frames_per_unit)
        kept = [i for i, c in enumerate(counts) if c > 0]
        text = render_chat(self.tokenizer, self._content(question, kept, times), system)
        ids = torch.tensor(self.tokenizer(text, add_special_tokens=False)["input_ids"],
                           dtype=torch.long)
        is_ph = ids == self.image_token_id
        if int(is_ph.sum()) != len(kept):
            raise ValueError(f"prompt: found {int(is_ph.sum())} {self.vision_tokens.context} "
                             f"tokens for {len(kept)} kept units")
        repeats = torch.ones_like(ids)
        repeats[is_ph] = torch.tensor([counts[i] for i in kept], dtype=torch.long)
        starts = torch.cumsum(repeats, 0) - repeats
        return ids.repeat_interleave(repeats), starts[is_ph].tolist()

    def text_tokens(self, question: str, num_frames: int, system: Optional[str] = None,
                    kept: Optional[Sequence[int]] = None,
                    times: Optional[Sequence[float]] = None) -> int:
        """L_text: prompt tokens that are not placeholders (timestamps and delimiters count),
        with the ``kept`` units (default: all ``num_frames`` units)."""
        from .prompt import _check_question, render_chat
        question = _check_question(question, self.vision_tokens)
        times = prompt_times(int(num_frames), times, self.frames_per_unit)
        kept = range(int(num_frames)) if kept is None else list(kept)
        text = render_chat(self.tokenizer, self._content(question, kept, times), system)
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"]) - len(kept)

    # ------------------------------------------------------------------ generation
    def forward(self, *, inputs_embeds=None, input_ids=None, position_ids=None,
                past_key_values=None, logits_to_keep: int = 1, attention_mask=None):
        """One decoder pass. ``inputs_embeds`` may be wide ([B, L, S*D], from
        ``reconstruct_embeds``): the first D columns are the input, each further D the
        DeepStack stream the decoder adds after layer j (zero on text rows: every row is
        marked visual, and adding zero leaves a row exactly as it was)."""
        from transformers.modeling_outputs import CausalLMOutputWithPast
        lm = self.decoder()
        x = inputs_embeds if inputs_embeds is not None else lm.embed_tokens(input_ids)
        kw = deepstack_kwargs(x, self.hidden_size)
        x = x[..., :self.hidden_size]
        if position_ids is None:
            past = past_key_values.get_seq_length() if past_key_values is not None else 0
            position_ids = (torch.arange(past, past + x.shape[1], device=x.device)
                            .view(1, 1, -1).expand(3, x.shape[0], -1))
        if attention_mask is not None:
            kw["attention_mask"] = attention_mask
        if past_key_values is None:
            from transformers import DynamicCache
            past_key_values = DynamicCache(config=self.text_config)
        out = lm(inputs_embeds=x, position_ids=position_ids,
                 **cache_kwargs(lm, past_key_values), use_cache=True, return_dict=True, **kw)
        h = out.last_hidden_state
        h = h[:, -logits_to_keep:] if isinstance(logits_to_keep, int) and logits_to_keep > 0 \
            else (h if isinstance(logits_to_keep, int) else h[:, logits_to_keep])
        names = {f for f in CausalLMOutputWithPast.__dataclass_fields__}
        key = "cache" if "cache" in names else "past_key_values"
        return CausalLMOutputWithPast(logits=self.model.lm_head(h), **{key: past_key_values})

    # ------------------------------------------------------------------ construction
    @classmethod
    def _hf(cls, name: str):
        import transformers
        return getattr(transformers, name)

    @classmethod
    def load(cls, path, device="cpu", dtype=None,
             attn_implementation: Optional[str] = None) -> "Qwen3VLBackbone":
        """A local Qwen3-VL-*-Instruct directory (``layout``), in eval mode."""
        path = pathlib.Path(path).expanduser()
        check_weights_dir(path, cls.model_types[0], cls.layout)
        model, tok, dev, dt = load_hf_model(cls._hf(cls.hf_model), path, device, dtype,
                                            attn_implementation)
        return cls(model, tok, dev, dt, path.name)

    @classmethod
    def tiny_config(cls, vocab_size: int, ids) -> dict:
        return tiny_config_dict(vocab_size, ids)

    @classmethod
    def preset_config(cls, name: Optional[str] = None) -> dict:
        tok = tiny_tokenizer()
        return cls.tiny_config(len(tok), special_ids(tok))

    @classmethod
    def tiny(cls, device="cpu", dtype=None, attn_implementation: Optional[str] = None,
             seed: int = 0) -> "Qwen3VLBackbone":
        """The family's tiny preset (``preset``): :meth:`tiny_config`, deterministic random
        weights (built and filled on the CPU, then moved)."""
        tok = tiny_tokenizer()
        cfg = cls.tiny_config(len(tok), special_ids(tok))
        return cls._build(cfg, tok, cls.preset, device, dtype, seed, attn_implementation,
                          build_on_cpu=True)

    @classmethod
    def from_config(cls, config, device="cpu", dtype=None, seed: int = 0,
                    attn_implementation: Optional[str] = None,
                    name: str = "config") -> "Qwen3VLBackbone":
        """Random weights of a shape preset (config.json layout), paired with the tiny
        tokenizer (token ids rewritten to its ids), for latency benchmarks."""
        if not isinstance(config, dict):
            raise ValueError(f"config: expected a path or a dict, got {type(config).__name__}")
        want = cls.model_types[0]
        if config.get("model_type", want) != want:
            raise ValueError(f"config: model_type {config.get('model_type')!r}, expected {want!r}")
        tok = tiny_tokenizer()
        cfg = with_token_ids(config, special_ids(tok), len(tok))
        return cls._build(cfg, tok, name, device, dtype, seed, attn_implementation)

    @classmethod
    def _build(cls, cfg: dict, tok, name, device, dtype, seed, attn_implementation,
               build_on_cpu: bool = False) -> "Qwen3VLBackbone":
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        attn = pick_attn_implementation(attn_implementation, dev, dt)
        where = torch.device("cpu") if build_on_cpu else dev
        model = build_model(cls._hf(cls.hf_model), cls._hf(cls.hf_config).from_dict(cfg),
                            dt, attn, bool(attn_implementation), where, seed)
        return cls(model.to(dev).eval(), tok, dev, dt, name)


class Qwen3VLMoeBackbone(Qwen3VLBackbone):
    """Qwen3-VL's MoE checkpoints (``Qwen3VLMoeForConditionalGeneration``, e.g. 30B-A3B): the
    same vision tower, DeepStack, video prompt and positions; the LLM's MLPs are sparse
    mixture-of-experts blocks. The shadow stack copies the first k layers whatever their MLP
    (``AutoModel.from_config`` of the MoE text config, experts and router included)."""
    family = "qwen3_vl_moe"
    model_types = ("qwen3_vl_moe",)
    hf_model, hf_config, layout = ("Qwen3VLMoeForConditionalGeneration", "Qwen3VLMoeConfig",
                                   "Qwen3-VL-*-A*-Instruct")
    preset = "tiny-qwen3-vl-moe"

    @classmethod
    def tiny_config(cls, vocab_size: int, ids) -> dict:
        """``tiny-qwen3-vl``'s config with a sparse LLM: 4 experts of width 64, 2 a token, in
        every layer (the 30B-A3B's 128 of 768, 8 a token, scaled down)."""
        cfg = tiny_config_dict(vocab_size, ids)
        cfg["model_type"] = "qwen3_vl_moe"
        cfg["architectures"] = ["Qwen3VLMoeForConditionalGeneration"]
        cfg["vision_config"]["model_type"] = "qwen3_vl_moe"
        cfg["text_config"].update(model_type="qwen3_vl_moe_text", moe_intermediate_size=64,
                                  num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1)
        return cfg

    @classmethod
    def cost_shape(cls, config: dict) -> CostShape:
        """As the dense model's, with the MLP width of the experts a token goes through
        (``num_experts_per_tok`` x ``moe_intermediate_size``): the active compute."""
        t = config["text_config"]
        active = int(t["num_experts_per_tok"]) * int(t["moe_intermediate_size"])
        dense = dict(config, text_config=dict(t, intermediate_size=active))
        return super().cost_shape(dense)


class Qwen35Backbone(Qwen3VLBackbone):
    """Qwen3.5 (``Qwen3_5ForConditionalGeneration``): natively multimodal with Qwen3-VL's vision
    tower (no DeepStack: one stream) and video prompt, over a hybrid LLM whose layers are Gated
    DeltaNet (linear attention, a recurrent state) and full attention, 3:1. The shadow stack
    copies the first k layers whatever their kind (``layer_types`` sliced), and since Gated
    DeltaNet is causal, the cached [Z_t] prefix of the Image Router stays exact.

    What differs from an attention-only LLM: a right-padded batched prefill would feed the
    padding into a shorter prompt's recurrent state (``pads_exactly`` False: the runtime answers
    such a batch one request at a time); decoding with the static KV cache ("static", "graph")
    is refused (``static_kv_cache`` False); the cost model prices a Gated DeltaNet layer linear
    in tokens (``cost_shape``'s ``layer_kinds``)."""
    family = "qwen3_5"
    model_types = ("qwen3_5",)
    hf_model, hf_config, layout = ("Qwen3_5ForConditionalGeneration", "Qwen3_5Config",
                                   "Qwen3.5-*")
    preset = "tiny-qwen3.5"
    pads_exactly = False
    static_kv_cache = False   # a Gated DeltaNet layer's state is no keys and values

    @classmethod
    def cost_shape(cls, config: dict) -> CostShape:
        """Qwen3-VL's tower, then the hybrid LLM: each layer's kind (``layer_types``, or every
        ``full_attention_interval``-th layer full) and the Gated DeltaNet widths, which the
        cost model prices linear in tokens."""
        import dataclasses
        t = config["text_config"]
        n = int(t["num_hidden_layers"])
        kinds = t.get("layer_types") or [
            "full_attention" if (i + 1) % int(t.get("full_attention_interval", 4)) == 0
            else "linear_attention" for i in range(n)]
        base = super().cost_shape(config)
        return dataclasses.replace(
            base, layer_kinds=tuple(kinds), lin_k_heads=int(t.get("linear_num_key_heads", 16)),
            lin_v_heads=int(t.get("linear_num_value_heads", 32)),
            lin_dk=int(t.get("linear_key_head_dim", 128)),
            lin_dv=int(t.get("linear_value_head_dim", 128)),
            lin_conv=int(t.get("linear_conv_kernel_dim", 4)))

    @classmethod
    def tiny_config(cls, vocab_size: int, ids) -> dict:
        """``tiny-qwen3.5``: the tiny Qwen3-VL geometry (448x448, patch 16, merge 2, temporal
        patch 2) without DeepStack, over 4 text layers of hidden 128: 3 Gated DeltaNet then 1
        full attention (``full_attention_interval`` 4, Qwen3.5's 3:1), heads of 32 with half
        the dimensions rotated, interleaved M-RoPE [2, 3, 3]."""
        cfg = tiny_config_dict(vocab_size, ids)
        v = cfg["vision_config"]
        v.pop("deepstack_visual_indexes")
        v["model_type"] = "qwen3_5_vision"
        t = cfg["text_config"]
        t.pop("rope_scaling")
        t.pop("rope_theta")
        t.update(model_type="qwen3_5_text", full_attention_interval=4,
                 linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=32,
                 linear_value_head_dim=32, linear_conv_kernel_dim=4,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000000,
                                  "mrope_section": [2, 3, 3], "mrope_interleaved": True,
                                  "partial_rotary_factor": 0.5})
        cfg.update(model_type="qwen3_5", architectures=["Qwen3_5ForConditionalGeneration"])
        return cfg


class Qwen35MoeBackbone(Qwen35Backbone):
    """Qwen3.5's MoE checkpoints (``Qwen3_5MoeForConditionalGeneration``): Qwen3.5 with sparse
    expert MLPs (plus a shared expert) in the hybrid LLM; the shadow stack copies them as any
    layer."""
    family = "qwen3_5_moe"
    model_types = ("qwen3_5_moe",)
    hf_model, hf_config, layout = ("Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeConfig",
                                   "Qwen3.5-*-A*")
    preset = "tiny-qwen3.5-moe"

    @classmethod
    def tiny_config(cls, vocab_size: int, ids) -> dict:
        """``tiny-qwen3.5`` with 4 experts of width 64 (2 a token) and a shared expert."""
        cfg = super().tiny_config(vocab_size, ids)
        cfg.update(model_type="qwen3_5_moe", architectures=["Qwen3_5MoeForConditionalGeneration"])
        cfg["vision_config"]["model_type"] = "qwen3_5_moe_vision"
        cfg["text_config"].update(model_type="qwen3_5_moe_text", moe_intermediate_size=64,
                                  shared_expert_intermediate_size=64, num_experts=4,
                                  num_experts_per_tok=2)
        return cfg

    @classmethod
    def cost_shape(cls, config: dict) -> CostShape:
        """Qwen3.5's, with the MLP width a token goes through: its experts and the shared one."""
        t = config["text_config"]
        active = int(t["num_experts_per_tok"]) * int(t["moe_intermediate_size"]) + \
            int(t.get("shared_expert_intermediate_size", 0))
        return super().cost_shape(dict(config, text_config=dict(t, intermediate_size=active)))


# ----------------------------------------------------------------------------- tiny preset
def tiny_config_dict(vocab_size: int, ids) -> dict:
    """Qwen3VLConfig (config.json layout, as the released checkpoints write it) of
    ``tiny-qwen3-vl``: the real geometry (448x448, patch 16, merge 2, temporal patch 2, 2304
    learned position embeddings, interleaved M-RoPE) with small widths and depths. Vision: 4
    blocks of hidden 64 in 4 heads, DeepStack from blocks 0, 1, 2 (the 8B's [8, 16, 24] of 27
    scaled down). Text: 4 layers, hidden 128, 4 heads of 32 (16 rotary frequencies) split
    [4, 6, 6] over t/h/w and interleaved, the 8B's [24, 20, 20] of 64 scaled down."""
    return {
        "model_type": "qwen3_vl",
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "tie_word_embeddings": False,
        "vision_config": {
            "model_type": "qwen3_vl", "depth": 4, "hidden_size": 64, "intermediate_size": 128,
            "num_heads": 4, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "out_hidden_size": 128, "hidden_act": "gelu_pytorch_tanh",
            "num_position_embeddings": 2304, "deepstack_visual_indexes": [0, 1, 2],
        },
        "text_config": {
            "model_type": "qwen3_vl_text",
            "vocab_size": vocab_size, "hidden_size": 128, "intermediate_size": 256,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 32, "hidden_act": "silu", "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6, "rope_theta": 5000000,
            "rope_scaling": {"rope_type": "default", "mrope_section": [4, 6, 6],
                             "mrope_interleaved": True},
            "attention_bias": False, "tie_word_embeddings": False,
            "bos_token_id": ids["<|im_start|>"], "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
    }


__all__ = ["Qwen3VLBackbone", "Qwen3VLMoeBackbone", "Qwen35Backbone", "Qwen35MoeBackbone", "QWEN3_TOKENS", "QWEN3_MEAN", "QWEN3_STD", "FRAME_SIZE",
           "unit_patches", "group_units", "unit_times", "timestamp", "prompt_times", "check_units",
           "StreamMergers", "mergers_set_aside", "tiny_config_dict"]
