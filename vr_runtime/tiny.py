"""The ``tiny`` preset: a small InternVL3-architecture model that runs on a laptop CPU.

It keeps everything that matters for the VideoRouter code paths at real size -- 448x448 input,
patch 14, pixel shuffle 0.5, so the same 16x16 = 256-token grid per frame -- and shrinks only
the widths and depths: a 2-layer ViT (hidden 64) and a 4-layer Qwen2 decoder (hidden 128,
4 heads, 2 KV heads). The tokenizer is a byte-level BPE built locally with ``tokenizers``
(``scripts/make_tiny_assets.py``) and shipped in ``assets/tiny/`` with the config.

Weights: ``assets/tiny/model.safetensors`` when present (trained by ``vr_runtime.training``),
otherwise a deterministic fill from a fixed seed (:func:`init_weights_`), independent of the
transformers version's own initialisers.
"""
from __future__ import annotations

import functools
import pathlib
from typing import Dict, Optional

import torch

ASSETS = pathlib.Path(__file__).resolve().parent / "assets" / "tiny"

# Order fixes the ids 0..5 in the trained BPE vocabulary.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>")

# Qwen-style ChatML, like InternVL3-*-hf's template. Content may be a string or the HF list of
# {"type": "text", "text": ...} parts.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_config_dict(vocab_size: int, special_ids: Dict[str, int]) -> dict:
    """The InternVLConfig (HF config.json layout) of the tiny preset."""
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


@functools.lru_cache(maxsize=None)
def _tokenizer_json() -> str:
    path = ASSETS / "tokenizer.json"
    if not path.is_file():
        from .errors import ModelFilesError
        raise ModelFilesError(f"tiny preset: {path} is missing; run scripts/make_tiny_assets.py")
    return str(path)


def load_tiny_tokenizer():
    """The tiny BPE tokenizer as a ``PreTrainedTokenizerFast`` with a ChatML chat template."""
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast(tokenizer_file=_tokenizer_json(), eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", model_max_length=32768)
    tok.chat_template = CHAT_TEMPLATE
    for t in SPECIAL_TOKENS:  # the BPE must keep each special token as one id
        assert len(tok.encode(t, add_special_tokens=False)) == 1, t
    return tok


def tiny_config():
    """``InternVLConfig`` of the shipped tiny preset (``assets/tiny/config.json``)."""
    import json
    from transformers import InternVLConfig
    path = ASSETS / "config.json"
    if not path.is_file():
        from .errors import ModelFilesError
        raise ModelFilesError(f"tiny preset: {path} is missing; run scripts/make_tiny_assets.py")
    return InternVLConfig.from_dict(json.loads(path.read_text()))


@torch.no_grad()
def init_weights_(model: torch.nn.Module, seed: int = 0, std: float = 0.02) -> torch.nn.Module:
    """Deterministic in-place fill of every parameter (on its own device).

    Matrices and embeddings ~ N(0, std); 1-D ``weight``s of norms = 1; biases = 0; InternViT's
    layer-scale vectors (``lambda_*``) = 0.1 like its config default. We do not reuse
    transformers' initialisers because they change between versions and are slow for 8B shapes.
    Non-persistent buffers (rotary ``inv_freq``) are left as constructed."""
    gens = {}
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        dev = p.device
        if dev not in gens:
            g = torch.Generator(device=dev)
            g.manual_seed(seed)
            gens[dev] = g
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "bias":
            p.zero_()
        elif leaf.startswith("lambda"):
            p.fill_(0.1)
        elif p.ndim == 1:
            p.fill_(1.0)
        elif p.dtype.is_floating_point:
            if p.dtype in (torch.float32, torch.float64):
                p.normal_(0.0, std, generator=gens[dev])
            else:  # sample in fp32 chunks so bf16 rounding does not depend on the kernel
                flat = p.view(-1)
                step = 1 << 26
                for i in range(0, flat.numel(), step):
                    n = min(step, flat.numel() - i)
                    flat[i:i + n].copy_(torch.empty(n, device=dev).normal_(0.0, std, generator=gens[dev]))
    # CLS token / position embeddings are parameters of shape [1, n, C]: covered above.
    return model


def build_tiny_model(device="cpu", dtype=torch.float32, seed: int = 0, weights: Optional[str] = None,
                     attn_implementation: str = "sdpa"):
    """The tiny InternVLForConditionalGeneration, with shipped/trained weights when present."""
    from transformers import InternVLForConditionalGeneration
    from .model import _fast_init_ctx
    cfg = tiny_config()
    # Built and filled on the CPU, then moved: the same weights on every device (a CUDA
    # generator would draw different numbers from the same seed).
    with _fast_init_ctx(), torch.device("cpu"):
        model = InternVLForConditionalGeneration._from_config(
            cfg, dtype=dtype, attn_implementation=attn_implementation)
    path = pathlib.Path(weights) if weights else ASSETS / "model.safetensors"
    if path.is_file():
        load_safetensors_into(model, path)
    else:
        if weights:
            from .errors import ModelFilesError
            raise ModelFilesError(f"tiny weights {path} not found")
        init_weights_(model, seed)
    # Built directly in `dtype` (not cast afterwards): like from_pretrained, this keeps the
    # rotary inv_freq buffers in fp32 in a bf16/fp16 model. .to(device) keeps dtypes.
    return model.to(device).eval()


def load_safetensors_into(model: torch.nn.Module, path) -> None:
    """Strict load of a safetensors state dict (never pickle); a clear error on mismatch."""
    from safetensors.torch import load_file
    from .errors import ModelFilesError
    from .weights import copy_state_strict
    state = load_file(str(path), device=str(next(model.parameters()).device))
    misfit = copy_state_strict(model, state)
    if misfit:
        raise ModelFilesError(f"{path}: weights do not fit the tiny model ({misfit}); "
                              f"regenerate them with vr_runtime.training")


def num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["SPECIAL_TOKENS", "CHAT_TEMPLATE", "ASSETS", "tiny_config", "tiny_config_dict",
           "load_tiny_tokenizer", "build_tiny_model", "init_weights_", "load_safetensors_into",
           "num_params"]
