"""InternVL3 (Hugging Face format, ``InternVLForConditionalGeneration``): everything specific to it.

* Loading: a local ``OpenGVLab/InternVL3-*-hf`` directory with ``local_files_only=True``,
  safetensors and never ``trust_remote_code``; the ``tiny`` preset; random-weight shape presets
  (``vr_runtime/configs/internvl3_*.json``) for latency benchmarks, paired with the tiny tokenizer.
* Frames: 448x448, ImageNet mean/std. Vision: the InternViT tower (selected layer, CLS dropped),
  pixel shuffle 0.5 -> pre-projector features [b, 256, 4C]; the MLP projector -> Z_t [256, D] on
  a row-major 16x16 grid. The vision path is reimplemented from the config fields instead of
  calling ``get_image_features`` so that one chunk of ViT activations is alive at a time and the
  frozen tower and the trainable projector can be run apart (training caches the former);
  ``tests/backbones/test_model.py`` checks it against HF's own.
* Prompt: ``FrameN: <img><IMG_CONTEXT> x n</img>`` lines in the ChatML template; 1-D positions.
"""
from __future__ import annotations

import json
import pathlib
from typing import Dict, Iterator, Optional, Tuple

import torch

from .devices import pick_attn_implementation, resolve_device, resolve_dtype
from ..errors import ModelFilesError
from .prompt import INTERNVL_TOKENS
from .base import Backbone, CostShape, FrameSpec, build_model, check_pixels
from .files import check_weights_dir, load_dir_tokenizer

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def pixel_shuffle(x: torch.Tensor, scale_factor: float = 0.5) -> torch.Tensor:
    """InternVL's pixel shuffle: [B, W, H, C] -> [B, W*r, H*r, C/r^2] (same op as HF's)."""
    b, w, h, c = x.shape
    if h % int(1 / scale_factor) or w % int(1 / scale_factor):
        raise ValueError(f"pixel_shuffle: grid {w}x{h} is not divisible by 1/{scale_factor}")
    x = x.reshape(b, w, int(h * scale_factor), int(c / scale_factor))
    x = x.permute(0, 2, 1, 3).contiguous()
    x = x.reshape(b, int(h * scale_factor), int(w * scale_factor), int(c / (scale_factor ** 2)))
    return x.permute(0, 2, 1, 3).contiguous()


def _pair(v) -> Tuple[int, int]:
    return tuple(v) if isinstance(v, (list, tuple)) else (v, v)


class InternVL3Backbone(Backbone):
    family = "internvl3"
    model_types = ("internvl",)
    vision_tokens = INTERNVL_TOKENS

    # ------------------------------------------------------------------ identity and parts
    @property
    def _hf(self):
        return self.model.model  # InternVLModel: vision_tower, multi_modal_projector, language_model

    @property
    def grid(self) -> Tuple[int, int]:
        vc = self.model.config.vision_config
        img, patch = _pair(vc.image_size), _pair(vc.patch_size)
        r = self.model.config.downsample_ratio
        return int(img[0] // patch[0] * r), int(img[1] // patch[1] * r)

    @classmethod
    def spec_from_config(cls, config: dict) -> FrameSpec:
        size = (config.get("vision_config") or {}).get("image_size", 448)
        return FrameSpec(size=_pair(size), mean=IMAGENET_MEAN, std=IMAGENET_STD)

    @classmethod
    def cost_shape(cls, config: dict) -> CostShape:
        """InternViT (patches + CLS, full attention, fc1 / GELU / fc2) and the pixel-shuffle
        projector (4 tokens merged, two linears at the LLM's width) before the Qwen2 LLM."""
        v, t = config["vision_config"], config["text_config"]
        img = _pair(v.get("image_size", 448))[0]
        patch = _pair(v.get("patch_size", 14))[0]
        side = img // patch
        ratio = config.get("downsample_ratio", 0.5)
        return CostShape(d_vis=v["hidden_size"], vis_heads=v.get("num_attention_heads", 16),
                         vis_layers=v["num_hidden_layers"], vis_ff=v["intermediate_size"],
                         vis_tokens=side * side + 1, tokens_per_frame=int(side * ratio) ** 2,
                         d=t["hidden_size"], layers=t["num_hidden_layers"],
                         heads=t["num_attention_heads"],
                         kv_heads=t.get("num_key_value_heads", t["num_attention_heads"]),
                         ff=t["intermediate_size"], vocab=t["vocab_size"],
                         patch_dim=3 * patch * patch,
                         head_dim=int(t.get("head_dim") or 0))   # Qwen3 (InternVL3.5): its own

    def decoder(self):
        return self._hf.language_model

    def lm_head(self):
        return self.model.lm_head

    def vision_tower(self):
        return self._hf.vision_tower

    def projector(self):
        return self._hf.multi_modal_projector

    # ------------------------------------------------------------------ vision
    def vision_features(self, pixel_values: torch.Tensor,
                        chunk_size: int = 16) -> Iterator[Tuple[int, torch.Tensor]]:
        """Per chunk: the tower's selected layer, CLS dropped, pixel-shuffled -> [b, H*W, 4C]."""
        check_pixels(pixel_values, chunk_size)
        cfg = self.model.config
        vt = self.vision_tower()
        layer = cfg.vision_feature_layer
        if not isinstance(layer, int):
            raise ValueError(f"vision_feature_layer {layer!r}: only a single layer is supported")
        p = next(vt.parameters())
        for i in range(0, pixel_values.shape[0], chunk_size):
            pv = pixel_values[i:i + chunk_size].to(device=p.device, dtype=p.dtype, non_blocking=True)
            out = vt(pixel_values=pv, output_hidden_states=(layer != -1), return_dict=True)
            feats = out.last_hidden_state if layer == -1 else out.hidden_states[layer]
            del out
            if cfg.vision_feature_select_strategy == "default":
                feats = feats[:, 1:, :]  # drop CLS
            b, n, c = feats.shape
            side = int(round(n ** 0.5))
            feats = pixel_shuffle(feats.reshape(b, side, side, c), cfg.downsample_ratio)
            yield i, feats.reshape(b, -1, feats.shape[-1])

    def project(self, v: torch.Tensor) -> torch.Tensor:
        proj = self.projector()
        p = next(proj.parameters())
        return proj(v.to(device=p.device, dtype=p.dtype))

    # ------------------------------------------------------------------ construction
    @classmethod
    def load(cls, path: pathlib.Path, device="cpu", dtype=None,
             attn_implementation: Optional[str] = None) -> "InternVL3Backbone":
        """A local InternVL3-*-hf directory, in eval mode."""
        from transformers import AutoTokenizer, InternVLForConditionalGeneration
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        attn = pick_attn_implementation(attn_implementation, dev, dt)
        check_weights_dir(path, "internvl", "InternVL3-*-hf",
                          "use the OpenGVLab/InternVL3-*-hf conversion, not the remote-code "
                          "'internvl_chat' checkpoint")
        kw = dict(local_files_only=True, use_safetensors=True, attn_implementation=attn,
                  device_map={"": str(dev)})
        try:
            model = InternVLForConditionalGeneration.from_pretrained(str(path), dtype=dt, **kw)
        except (ImportError, ValueError) as e:
            if attn == "sdpa" or attn_implementation:
                raise ModelFilesError(f"model {str(path)!r}: could not be loaded ({e})") from e
            # flash-attention present but unusable for some sub-model: sdpa is always supported.
            kw["attn_implementation"] = "sdpa"
            model = InternVLForConditionalGeneration.from_pretrained(str(path), dtype=dt, **kw)
        except OSError as e:
            raise ModelFilesError(f"model {str(path)!r}: could not be loaded ({e})") from e
        tok = load_dir_tokenizer(path, AutoTokenizer)
        return cls(model.eval(), tok, dev, dt, path.name)

    @classmethod
    def preset_config(cls, name: str = "tiny") -> dict:
        from .tiny import ASSETS
        path = ASSETS / "config.json"
        if not path.is_file():
            raise ModelFilesError(f"tiny preset: {path} is missing; run scripts/tiny/make_tiny_assets.py")
        return json.loads(path.read_text())

    @classmethod
    def tiny(cls, device="cpu", dtype=None, attn_implementation: Optional[str] = None,
             weights: Optional[str] = None) -> "InternVL3Backbone":
        """The ``tiny`` preset with its shipped (trained) weights, or a deterministic fill."""
        from .tiny import ASSETS, load_safetensors_into, load_tiny_tokenizer, init_weights_
        from transformers import InternVLConfig, InternVLForConditionalGeneration
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        attn = pick_attn_implementation(attn_implementation, dev, dt)
        cfg = InternVLConfig.from_dict(cls.preset_config())
        # Built and filled on the CPU, then moved: the same weights on every device (a CUDA
        # generator would draw different numbers from the same seed).
        model = build_model(InternVLForConditionalGeneration, cfg, dt, attn,
                            bool(attn_implementation), torch.device("cpu"))
        wpath = pathlib.Path(weights) if weights else ASSETS / "model.safetensors"
        if wpath.is_file():
            load_safetensors_into(model, wpath)
        elif weights:
            raise ModelFilesError(f"tiny weights {wpath} not found")
        else:
            init_weights_(model, 0)
        return cls(model.to(dev).eval(), load_tiny_tokenizer(), dev, dt, "tiny")

    @classmethod
    def from_config(cls, config: dict, device="cpu", dtype=None, seed: int = 0,
                    attn_implementation: Optional[str] = None,
                    name: str = "config") -> "InternVL3Backbone":
        """Random weights of a shape preset (HF config.json layout), for latency benchmarks.

        Built on ``device`` in ``dtype`` with transformers' init skipped, then filled by
        ``tiny.init_weights_`` there (an 8B shape takes seconds on a GPU). Paired with the tiny
        tokenizer: ``image_token_id`` and the eos/pad/bos ids are rewritten to its ids (timings
        depend on shapes and lengths, not on token identities)."""
        from transformers import InternVLConfig, InternVLForConditionalGeneration
        from .tiny import load_tiny_tokenizer, special_ids
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        attn = pick_attn_implementation(attn_implementation, dev, dt)
        tok = load_tiny_tokenizer()
        ids = special_ids(tok)
        cfg = dict(config)
        cfg["image_token_id"] = ids["<IMG_CONTEXT>"]
        text = dict(cfg.get("text_config") or {})
        if text.get("vocab_size", 0) < len(tok):
            raise ValueError(f"config: text_config.vocab_size {text.get('vocab_size')} is smaller "
                             f"than the tiny tokenizer ({len(tok)} ids)")
        text.update(eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
                    bos_token_id=ids["<|im_start|>"])
        cfg["text_config"] = text

        model = build_model(InternVLForConditionalGeneration, InternVLConfig.from_dict(cfg), dt,
                            attn, bool(attn_implementation), dev, seed)
        return cls(model.eval(), tok, dev, dt, name)


def tiny_config_dict(vocab_size: int, special_ids: Dict[str, int]) -> dict:
    """The InternVLConfig (HF config.json layout) of the ``tiny`` preset (scripts/tiny/make_tiny_assets.py)."""
    return {
        "model_type": "internvl",
        "architectures": ["InternVLForConditionalGeneration"],
        "image_token_id": special_ids["<IMG_CONTEXT>"],
        "image_seq_length": 256,
        "downsample_ratio": 0.5,
        "projector_hidden_act": "gelu",
        "vision_feature_layer": -1,
        "vision_feature_select_strategy": "default",
        "tie_word_embeddings": False,
        "vision_config": {
            "model_type": "internvl_vision",
            "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 128, "image_size": [448, 448], "patch_size": [14, 14],
            "hidden_act": "gelu", "norm_type": "layer_norm", "layer_norm_eps": 1e-6,
            "use_qk_norm": False, "attention_bias": True, "layer_scale_init_value": 0.1,
            "use_absolute_position_embeddings": True, "use_mean_pooling": True,
        },
        "text_config": {
            "model_type": "qwen2",
            "vocab_size": vocab_size, "hidden_size": 128, "intermediate_size": 256,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "use_sliding_window": False, "tie_word_embeddings": False,
            "bos_token_id": special_ids["<|im_start|>"], "eos_token_id": special_ids["<|im_end|>"],
            "pad_token_id": special_ids["<|endoftext|>"],
        },
    }


__all__ = ["InternVL3Backbone", "tiny_config_dict", "pixel_shuffle", "IMAGENET_MEAN", "IMAGENET_STD"]
