"""Assets shared by the tiny presets (``tiny``: InternVL3 architecture, built in
``backbones/internvl3.py``; ``tiny-qwen2.5-vl``: ``backbones/qwen2_5_vl.py``) and by the
random-weight shape presets: the local byte-level BPE tokenizer (built with ``tokenizers`` by
``scripts/tiny/make_tiny_assets.py``, shipped in ``assets/tiny/``), its ChatML template, the
deterministic weight fill (:func:`init_weights_`, independent of transformers' initialisers)
and the strict safetensors loader for shipped weights.

The ``tiny`` InternVL3 preset keeps everything that matters for the VideoRouter code paths at
real size -- 448x448 input, patch 14, pixel shuffle 0.5, so the same 16x16 = 256-token grid per
frame -- and shrinks only widths and depths: a 2-layer ViT (hidden 64) and a 4-layer Qwen2
decoder (hidden 128). Its weights are ``assets/tiny/model.safetensors`` when present (trained by
the tiny curriculum, ``vr_tiny``: ``scripts/tiny/train_tiny.sh``), otherwise the deterministic
fill.
"""
from __future__ import annotations

import functools
import pathlib
from typing import Dict

import torch

ASSETS = pathlib.Path(__file__).resolve().parents[1] / "assets" / "tiny"

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


@functools.lru_cache(maxsize=None)
def _tokenizer_json() -> str:
    path = ASSETS / "tokenizer.json"
    if not path.is_file():
        from ..errors import ModelFilesError
        raise ModelFilesError(f"tiny preset: {path} is missing; run scripts/tiny/make_tiny_assets.py")
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


def special_ids(tok) -> Dict[str, int]:
    """Ids of the tiny tokenizer's special tokens (shape presets rewrite their configs to them)."""
    return {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}


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


def load_safetensors_into(model: torch.nn.Module, path) -> None:
    """Strict load of a safetensors state dict (never pickle); a clear error on mismatch."""
    from safetensors.torch import load_file
    from ..errors import ModelFilesError
    from .weights import copy_state_strict
    state = load_file(str(path), device=str(next(model.parameters()).device))
    misfit = copy_state_strict(model, state)
    if misfit:
        raise ModelFilesError(f"{path}: weights do not fit the tiny model ({misfit}); "
                              f"retrain them with scripts/tiny/train_tiny.sh --install")


def num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["SPECIAL_TOKENS", "CHAT_TEMPLATE", "ASSETS", "load_tiny_tokenizer", "special_ids",
           "init_weights_", "load_safetensors_into", "num_params"]
