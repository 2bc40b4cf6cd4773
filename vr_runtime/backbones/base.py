"""The backbone interface: everything the VideoRouter pipeline needs that differs between model
families (InternVL3, Qwen2.5-VL), behind one class, one module per family (``internvl3.py``,
``qwen2_5_vl.py``), the way Liger-Kernel keeps one file per model.

The pipeline (``vr_runtime.runtime``) only talks to a :class:`Backbone`:

    frame_spec                    frame size, mean/std (decoding + preprocessing)
    vision_features / project     frozen vision tower -> pre-projector features; the trainable
                                  projector -> Z_t [H*W, D] on a row-major ``grid`` per frame
    encode_frames                 both, in chunks, into a preallocated Z [T, H*W, D]
    build_prompt / text_tokens    the prompt with per-frame placeholder counts (``vision_tokens``)
    position_ids                  per-token positions for a (compressed) prompt; None = 1-D
    router_position_ids           positions of [Z_t; q] in the shadow stack
    decoder / text_config         the decoder layers + rotary embedding the shadow stack copies
    forward                       prefill / decode step returning last-row logits and the cache
    stop_token_ids                generation stops
    cost_shape                    the dimensions the TTFT cost model needs (``--ttft-budget``)
    at_resolution / budget_frame_size   a view at another frame size and the family's budget
                                  rule for it (Qwen2.5-VL only; the default refuses)

A subclass sets the class attributes, implements the abstract methods, and registers itself in
``vr_runtime.backbones`` (model_type -> class, preset name -> loader).
"""
from __future__ import annotations

import abc
import contextlib
import dataclasses
import inspect
from dataclasses import dataclass
from typing import ClassVar, Iterator, Optional, Sequence, Tuple

import torch

from ..errors import ModelFilesError
from ..video.sampling import FrameSpec   # how a frame becomes input: the video's to say
from .prompt import VisionTokens, build_video_prompt, text_tokens  # the prompt owns its framing
from .tiny import init_weights_


@contextlib.contextmanager
def no_init_weights():
    """Skip transformers' weight initialisation while constructing (weights come right after)."""
    from transformers.initialization import no_init_weights as ctx  # transformers >= 5
    with ctx():
        yield


class Backbone(abc.ABC):
    """One loaded model of a family, in eval mode, on ``device`` in ``dtype``."""

    family: ClassVar[str] = ""                 # "internvl3", "qwen2_5_vl"
    # at_resolution / budget_frame_size implemented: the vision tower takes other frame sizes
    # (Qwen2.5-VL). A class attribute, so a caller can refuse budget-resize before loading.
    resizes_frames: ClassVar[bool] = False
    model_types: ClassVar[Tuple[str, ...]] = ()  # config.json model_type values it loads
    vision_tokens: ClassVar[VisionTokens]
    # Decoded frames per routing unit (what the routers score, the planner pools and the prompt
    # keeps or drops): 1, or k for a tower that embeds k consecutive frames together (Qwen3-VL's
    # temporal patch of 2). ``units`` groups the decoded frames; every stage after it sees units.
    frames_per_unit: int = 1
    # Streams of width D side by side in Z (Qwen3-VL: the main one and its DeepStack streams)
    streams: int = 1
    # the config field holding the placeholder's token id (``vision_tokens.context``)
    placeholder_id_key: ClassVar[str] = "image_token_id"
    # build_prompt / text_tokens take ``times=`` (each unit's time in seconds: a prompt with
    # timestamps); the runtime passes the decoded frames' times only to such a backbone.
    uses_frame_times: ClassVar[bool] = False
    # A right-padded batched prefill gives each request what it gets alone (attention-only
    # LLMs). False for an LLM with recurrent layers (padding would enter a shorter prompt's
    # state): the runtime then answers a batch one request at a time.
    pads_exactly: ClassVar[bool] = True
    # Every layer's decoding state is keys and values, so the static KV cache (decoding
    # "static" / "graph") holds it; False for a recurrent LLM: those modes are refused.
    static_kv_cache: ClassVar[bool] = True

    def __init__(self, model, tokenizer, device: torch.device, dtype: torch.dtype, name: str):
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.dtype = dtype
        self.name = name
        self.image_token_id = self._check_tokens()

    # ------------------------------------------------------------------ identity
    @property
    @abc.abstractmethod
    def grid(self) -> Tuple[int, int]:
        """Per-frame token grid (rows, cols) of Z_t: (16, 16) at 448x448 for both families."""

    @property
    def frame_spec(self) -> FrameSpec:
        return type(self).spec_from_config(self.model.config.to_dict())

    def at_resolution(self, height: int, width: int) -> "Backbone":
        """A view of the same weights whose frames are ``height`` x ``width`` (frame spec, grid,
        vision call, prompt counts and positions follow). Only a family whose vision tower
        takes other sizes implements it (Qwen2.5-VL); the default refuses."""
        raise ValueError(f"backbone {self.family!r} ({self.name}) cannot run at {height}x{width}: "
                         f"its vision tower takes {self.frame_spec.size[0]}x"
                         f"{self.frame_spec.size[1]} frames only; a reduced-resolution baseline "
                         f"(budget-resize) needs a Qwen2.5-VL or Qwen3-VL model")

    def budget_frame_size(self, frames: int, budget: int) -> Tuple[int, int]:
        """The largest frame size (this family's own resize rule) at which ``frames`` frames fit
        ``budget`` visual tokens; families that cannot resize refuse (see ``at_resolution``)."""
        raise ValueError(f"backbone {self.family!r} ({self.name}) has no reduced-resolution "
                         f"budget rule: its vision tower takes {self.frame_spec.size[0]}x"
                         f"{self.frame_spec.size[1]} frames only; budget-resize needs a "
                         f"Qwen2.5-VL or Qwen3-VL model (InternVL3's budget baseline is `budget`)")

    @classmethod
    @abc.abstractmethod
    def spec_from_config(cls, config: dict) -> FrameSpec:
        """The frame spec from a config.json dict: known before the weights load, so decoding
        can start while the model loads (the CLI's prefetch)."""

    @classmethod
    def cost_shape(cls, config: dict) -> CostShape:
        """The cost model's dimensions from a config.json dict (``--ttft-budget`` needs them).
        A backbone without one cannot take a latency budget."""
        raise ValueError(f"ttft_budget_s: backbone {cls.family!r} gives no cost shape "
                         f"({cls.__name__}.cost_shape); run without --ttft-budget")

    @property
    def text_config(self):
        return self.model.config.text_config

    @property
    def hidden_size(self) -> int:
        return int(self.text_config.hidden_size)

    @property
    def embed_tokens(self) -> torch.nn.Module:
        return self.model.get_input_embeddings()

    def _check_tokens(self) -> int:
        tok, vt = self.tokenizer, self.vision_tokens
        for t in (vt.start, vt.end, vt.context):
            if len(tok.encode(t, add_special_tokens=False)) != 1:
                raise ModelFilesError(f"model {self.name!r}: the tokenizer does not hold {t!r} as "
                                      f"one token")
        key = self.placeholder_id_key
        image_token_id = int(getattr(self.model.config, key))
        if tok.convert_tokens_to_ids(vt.context) != image_token_id:
            raise ModelFilesError(f"model {self.name!r}: config.{key} {image_token_id} is "
                                  f"not the tokenizer's {vt.context} id "
                                  f"{tok.convert_tokens_to_ids(vt.context)}")
        return image_token_id

    # ------------------------------------------------------------------ units
    def units(self, pixel_values: torch.Tensor, indices: Sequence[int],
              times: Optional[Sequence[float]]):
        """Decoded frames [T, 3, H, W], their source indices and times -> the routing units'
        pixel values, first source index and time (``frames_per_unit``). One frame a unit here."""
        return pixel_values, list(indices), None if times is None else list(times)

    def unit_labels(self, labels: Sequence) -> list:
        """Per-frame relevance labels -> per unit (training data label sampled frames)."""
        return list(labels)

    # ------------------------------------------------------------------ parts
    @abc.abstractmethod
    def decoder(self) -> torch.nn.Module:
        """The text decoder (``layers``, ``rotary_emb``, ``norm``): the shadow stack copies its
        first k layers and its rotary embedding."""

    @abc.abstractmethod
    def lm_head(self) -> torch.nn.Module:
        ...

    @abc.abstractmethod
    def vision_tower(self) -> torch.nn.Module:
        """The frozen part of the vision path (everything before the projector)."""

    @abc.abstractmethod
    def projector(self) -> torch.nn.Module:
        """The trainable vision-language projector (InternVL's MLP, Qwen's patch merger)."""

    # ------------------------------------------------------------------ vision
    @abc.abstractmethod
    def vision_features(self, pixel_values: torch.Tensor,
                        chunk_size: int = 16) -> Iterator[Tuple[int, torch.Tensor]]:
        """Yield ``(start, v)`` per chunk of frames [b, 3, H, W]: pre-projector features in the
        tower's dtype, one chunk of activations alive at a time."""

    @abc.abstractmethod
    def project(self, v: torch.Tensor) -> torch.Tensor:
        """Pre-projector features of b frames -> Z [b, H*W, D] (row-major on ``grid``)."""

    def encode_frames(self, pixel_values: torch.Tensor, chunk_size: int = 16,
                      requires_grad: bool = False) -> torch.Tensor:
        """Frames [T, 3, H, W] -> Z [T, H*W, D] in the model's dtype on its device, one chunk
        of ViT activations alive at a time (copied into one preallocated Z)."""
        check_pixels(pixel_values, chunk_size)
        p = next(self.projector().parameters())
        H, W = self.grid
        T = pixel_values.shape[0]
        with torch.set_grad_enabled(requires_grad and torch.is_grad_enabled()):
            if requires_grad:
                return torch.cat([self.project(v.to(p.dtype))
                                  for _, v in self.vision_features(pixel_values, chunk_size)], 0)
            Z = torch.empty(T, H * W, self.hidden_size, device=p.device, dtype=p.dtype)
            for i, v in self.vision_features(pixel_values, chunk_size):
                z = self.project(v.to(p.dtype))
                Z[i:i + z.shape[0]].copy_(z)
                del v, z
        return Z

    def encode_chunk(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """One chunk of units [b, 3k, H, W] -> Z [b, H*W, D] in a single call of the tower and
        the projector, no grad: what a compiled vision stage traces (``backbones.encode``)."""
        (_, v), = self.vision_features(pixel_values, int(pixel_values.shape[0]))
        return self.project(v.to(next(self.projector().parameters()).dtype))

    # ------------------------------------------------------------------ prompt
    def build_prompt(self, question: str, counts: Sequence[int], system: Optional[str] = None):
        """-> (ids [L] int64 CPU, first placeholder row of each kept frame)."""
        return build_video_prompt(self.tokenizer, question, counts, self.image_token_id, system,
                                  tokens=self.vision_tokens)

    def text_tokens(self, question: str, num_frames: int, system: Optional[str] = None,
                    kept: Optional[Sequence[int]] = None) -> int:
        """L_text: prompt tokens that are not visual placeholders, with the lines of ``kept``
        frames (default: all ``num_frames``)."""
        return text_tokens(self.tokenizer, question, num_frames, system,
                           tokens=self.vision_tokens, kept=kept)

    # ------------------------------------------------------------------ positions
    def position_ids(self, ids: torch.Tensor, plan: Sequence, frame_starts: Sequence[int],
                     grid: Optional[Tuple[int, int]] = None) -> Optional[torch.Tensor]:
        """Positions of a prompt whose kept frames hold pooled grids (``plan``); None means the
        decoder's default 1-D positions 0..L-1."""
        return None

    def router_position_ids(self, tokens_grid: Tuple[int, int], num_text: int,
                            batch: int) -> Optional[torch.Tensor]:
        """Positions of [Z_t; q] (a ``tokens_grid`` of visual tokens then ``num_text`` question
        tokens) in the shadow stack; None means 1-D 0..L-1."""
        return None

    def next_position(self, position_ids: Optional[torch.Tensor], length: int) -> int:
        """First position after a prompt of ``length`` tokens with ``position_ids``."""
        return length if position_ids is None else int(position_ids.max()) + 1

    def step_position_ids(self, position: int) -> Optional[torch.Tensor]:
        """Positions of one decoded token at scalar ``position`` (None: the decoder's default)."""
        return None

    # ------------------------------------------------------------------ generation
    def forward(self, *, inputs_embeds=None, input_ids=None, position_ids=None,
                past_key_values=None, logits_to_keep: int = 1, attention_mask=None):
        """One decoder pass -> HF output (``logits`` of the last ``logits_to_keep`` rows; its
        KV cache via :func:`output_cache`). Vision inputs never go through here: frames are
        already in ``inputs_embeds``. ``attention_mask`` [B, kv length] (1 = a real token):
        only for batched requests of different lengths."""
        kw = {"position_ids": position_ids} if position_ids is not None else {}
        if attention_mask is not None:
            kw["attention_mask"] = attention_mask
        return self.model(inputs_embeds=inputs_embeds, input_ids=input_ids,
                          **cache_kwargs(self.model, past_key_values), use_cache=True,
                          return_dict=True, logits_to_keep=logits_to_keep, **kw)

    def stop_token_ids(self) -> set:
        tok, cfg = self.tokenizer, self.model.config
        ids = set()
        for src in (getattr(self.model, "generation_config", None), cfg.text_config):
            e = getattr(src, "eos_token_id", None) if src is not None else None
            if e is not None:
                ids.update(e if isinstance(e, (list, tuple)) else [e])
        if tok.eos_token_id is not None:
            ids.add(tok.eos_token_id)
        im_end = tok.convert_tokens_to_ids("<|im_end|>")
        if isinstance(im_end, int) and im_end != tok.unk_token_id:
            ids.add(im_end)
        return {int(i) for i in ids}


def cache_kwargs(module: torch.nn.Module, cache) -> dict:
    """The KV-cache keyword of ``module``'s forward: ``cache`` where the installed transformers
    has renamed it (newer 5.x releases warn on ``past_key_values``), else ``past_key_values``."""
    if cache is None:
        return {}
    name = _CACHE_NAMES.get(type(module))
    if name is None:   # once per class: a plain dict read is what a compiled decode step traces
        params = inspect.signature(type(module).forward).parameters
        name = _CACHE_NAMES[type(module)] = "cache" if "cache" in params else "past_key_values"
    return {name: cache}


_CACHE_NAMES: dict = {}


@dataclass(frozen=True)
class CostShape:
    """The dimensions ``vr_runtime.planning.cost_model`` needs, given by each backbone from its
    config.json (:meth:`Backbone.cost_shape`). The defaults describe InternViT + its MLP
    projector; a tower that differs says so in the last five fields."""
    d_vis: int              # vision tower width
    vis_heads: int
    vis_layers: int
    vis_ff: int             # vision MLP width
    vis_tokens: int         # tokens the tower sees per frame (patches, + CLS for InternViT)
    tokens_per_frame: int   # after the merge (pixel shuffle / 2x2 merger): 256 for 448 / 14 / 2
    d: int                  # LLM hidden size
    layers: int
    heads: int
    kv_heads: int
    ff: int                 # LLM MLP width
    vocab: int
    patch_dim: int = 3 * 14 * 14    # inputs of one patch embedding (x temporal patch for Qwen)
    vis_gated_mlp: bool = False     # gate / up / down (SwiGLU) instead of fc1 / GELU / fc2
    vis_window_tokens: int = 0      # tokens per attention window (0: full attention everywhere)
    vis_full_layers: int = 0        # with windows: the layers that still attend over the frame
    merge_hidden: int = 0           # projector's hidden width (0: the LLM's, as InternVL's)
    head_dim: int = 0               # LLM attention head width (0: d // heads; Qwen3 sets its own)
    # A hybrid LLM (Qwen3.5): each layer's kind, "linear_attention" (Gated DeltaNet: linear in
    # tokens, a recurrent state, no KV cache) or "full_attention"; () = all full attention.
    layer_kinds: Tuple[str, ...] = ()
    lin_k_heads: int = 0            # Gated DeltaNet key / value heads and their widths
    lin_v_heads: int = 0
    lin_dk: int = 0
    lin_dv: int = 0
    lin_conv: int = 4               # its causal convolution's kernel

    @property
    def hd(self) -> int:
        """The LLM's attention head width."""
        return self.head_dim or self.d // self.heads


def output_cache(out):
    """The KV cache of a transformers model output, by its current field name (reading the old
    ``past_key_values`` alias of a renamed field warns)."""
    names = {f.name for f in dataclasses.fields(out)} if dataclasses.is_dataclass(out) else set(out)
    return getattr(out, "cache" if "cache" in names else "past_key_values")


def build_model(model_cls, config, dtype: torch.dtype, attn: str, attn_explicit: bool,
                where: torch.device, seed: Optional[int] = None):
    """``model_cls._from_config(config)`` constructed on ``where`` directly in ``dtype`` (like
    from_pretrained, this keeps rotary inv_freq buffers in fp32) with transformers' init
    skipped; sdpa when an automatically chosen flash-attention is refused; then filled by
    ``tiny.init_weights_(seed)`` unless ``seed`` is None (weights come from a file)."""
    def build(impl):
        with no_init_weights(), torch.device(where):
            return model_cls._from_config(config, dtype=dtype, attn_implementation=impl)
    try:
        model = build(attn)
    except (ImportError, ValueError):
        if attn == "sdpa" or attn_explicit:
            raise
        model = build("sdpa")
    if seed is not None:
        init_weights_(model, seed)
    return model


def deepstack_kwargs(x: torch.Tensor, hidden_size: int) -> dict:
    """Decoder arguments for wide rows ``x`` [B, L, S*D] (S streams of width D side by side,
    see ``reconstruct.reconstruct_embeds``): a decoder with DeepStack inputs (Qwen3-VL's text
    model) adds stream j to its hidden states after layer j at ``visual_pos_masks``; every row
    is marked, text rows being zero there. {} for rows of width D."""
    width = x.shape[-1]
    if width == hidden_size:
        return {}
    if width % hidden_size:
        raise ValueError(f"inputs_embeds: width {width} is not a multiple of the hidden size "
                         f"{hidden_size}")
    B, L = x.shape[:2]
    ds = [x[..., j * hidden_size:(j + 1) * hidden_size].reshape(B * L, hidden_size)
          for j in range(1, width // hidden_size)]
    return {"visual_pos_masks": torch.ones(B, L, dtype=torch.bool, device=x.device),
            "deepstack_visual_embeds": ds}


def check_pixels(pixel_values: torch.Tensor, chunk_size: int) -> None:
    if pixel_values.ndim != 4 or pixel_values.shape[1] != 3:
        raise ValueError(f"pixel_values: expected [T, 3, H, W], got {tuple(pixel_values.shape)}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size: expected an int >= 1, got {chunk_size!r}")


__all__ = ["Backbone", "CostShape", "FrameSpec", "VisionTokens", "no_init_weights", "build_model",
           "check_pixels", "cache_kwargs", "output_cache", "deepstack_kwargs"]
