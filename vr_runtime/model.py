"""Loading InternVL3 (Hugging Face format), random-weight shape presets, chunked vision encoding.

* :func:`load_model` -- a local ``InternVL3-*-hf`` directory (or ``"tiny"``), with
  ``local_files_only=True``, safetensors weights and never ``trust_remote_code``.
* :func:`model_from_config` -- random weights from a shape preset (HF config.json layout) for
  latency benchmarks. It is paired with the *tiny* tokenizer and ``image_token_id`` is pointed at
  that tokenizer's ``<IMG_CONTEXT>``: prefill/vision/router timings depend on sequence lengths and
  shapes, not on which token ids are used, so a real 150K-entry tokenizer is not needed.
* :func:`encode_frames` -- vision tower + pixel shuffle + projector, ``chunk_size`` frames at a
  time into a preallocated ``Z [T, 256, D]``, so 64-256 frames never hold every ViT activation.
  It reimplements ``InternVLModel.get_image_features`` from the config fields instead of calling
  it, because that method's signature and return type changed across transformers 4.5x/5.x
  (tensor vs ``BaseModelOutputWithPooling``); ``tests/runtime/test_model.py`` checks it against
  the plain HF forward.
"""
from __future__ import annotations

import contextlib
import json
import pathlib
from dataclasses import dataclass
from typing import Any, Optional, Tuple, Union

import torch

from .errors import DeviceError, ModelFilesError

_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
           "float16": torch.float16, "half": torch.float16, "fp32": torch.float32,
           "float32": torch.float32, "float": torch.float32}


@dataclass
class LoadedModel:
    model: Any                      # InternVLForConditionalGeneration
    tokenizer: Any                  # PreTrainedTokenizerFast with a chat template
    image_token_id: int
    grid: Tuple[int, int]           # (16, 16) for 448 px / patch 14 / shuffle 0.5
    hidden_size: int                # D of the language model
    device: torch.device
    dtype: torch.dtype
    name: str

    @property
    def embed_tokens(self) -> torch.nn.Module:
        return self.model.get_input_embeddings()

    @property
    def language_model(self) -> torch.nn.Module:
        return language_model(self.model)


# ----------------------------------------------------------------------------- devices, dtypes
def resolve_device(device) -> torch.device:
    dev = torch.device(device if device is not None else "cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"device {str(device)!r}: CUDA was asked for but torch sees no CUDA "
                          f"device; use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise DeviceError(f"device {str(device)!r}: only {torch.cuda.device_count()} CUDA device(s)")
    if dev.type not in ("cpu", "cuda"):
        raise DeviceError(f"device {str(device)!r}: expected 'cpu' or 'cuda[:N]'")
    return dev


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    """None -> bf16 on CUDA (fp16 where bf16 is unsupported), fp32 on CPU."""
    if dtype is None:
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if isinstance(dtype, str):
        key = dtype.lower().replace("torch.", "")
        if key not in _DTYPES:
            raise ValueError(f"dtype {dtype!r}: expected one of bf16, fp16, fp32")
        dtype = _DTYPES[key]
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"dtype {dtype!r}: expected torch.bfloat16, torch.float16 or torch.float32")
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise DeviceError("dtype bf16: this CUDA device does not support bfloat16; use fp16")
    return dtype


def pick_attn_implementation(attn_implementation, device: torch.device, dtype: torch.dtype) -> str:
    """Explicit choice wins; else flash-attention 2 on CUDA in 16-bit when installed, else sdpa."""
    if attn_implementation:
        return attn_implementation
    if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and _flash_attn_2_usable():
        return "flash_attention_2"
    return "sdpa"


def _flash_attn_2_usable() -> bool:
    # Ask transformers, which checks the distribution name and version (>= 2.3.3) before it
    # accepts "flash_attention_2": an importable `flash_attn` alone (FA4 ships under that name,
    # or an old 2.x) would make model construction raise instead of falling back to sdpa.
    try:
        from transformers.utils import is_flash_attn_2_available
    except ImportError:
        is_flash_attn_2_available = None
    try:
        if is_flash_attn_2_available is not None and not is_flash_attn_2_available():
            return False
        import flash_attn  # noqa: F401  (a wheel built for another torch fails here)
        return True
    except Exception:
        return False


@contextlib.contextmanager
def _fast_init_ctx():
    """Skip torch/transformers weight init while constructing (weights come right after)."""
    ctx = None
    try:
        from transformers.initialization import no_init_weights as ctx  # transformers >= 5
    except ImportError:
        try:
            from transformers.modeling_utils import no_init_weights as ctx
        except ImportError:
            ctx = None
    if ctx is None:
        yield
    else:
        with ctx():
            yield


# ----------------------------------------------------------------------------- model parts
def _inner(model) -> torch.nn.Module:
    """InternVLModel inside InternVLForConditionalGeneration (or the model itself)."""
    inner = getattr(model, "model", None)
    return inner if inner is not None and hasattr(inner, "vision_tower") else model


def language_model(model) -> torch.nn.Module:
    """The Qwen2Model decoder (embed_tokens, layers, norm, rotary_emb)."""
    return _inner(model).language_model


def lm_head(model) -> torch.nn.Module:
    return model.lm_head


def frame_grid(config) -> Tuple[int, int]:
    vc = config.vision_config
    img = vc.image_size if isinstance(vc.image_size, (list, tuple)) else (vc.image_size,) * 2
    patch = vc.patch_size if isinstance(vc.patch_size, (list, tuple)) else (vc.patch_size,) * 2
    r = config.downsample_ratio
    return int(img[0] // patch[0] * r), int(img[1] // patch[1] * r)


def _check_weights_dir(path: pathlib.Path) -> None:
    if not path.is_dir():
        raise ModelFilesError(f"model {str(path)!r}: not a directory; pass a local InternVL3-*-hf "
                              f"directory (or 'tiny'); nothing is downloaded")
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not (list(path.glob("*.safetensors")) or (path / "model.safetensors.index.json").is_file()):
        missing.append("*.safetensors")
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        missing.append("tokenizer.json / tokenizer_config.json")
    if missing:
        raise ModelFilesError(f"model {str(path)!r}: missing {', '.join(missing)}; expected an "
                              f"InternVL3-*-hf checkpoint directory")
    try:
        mtype = json.loads((path / "config.json").read_text()).get("model_type")
    except (OSError, json.JSONDecodeError) as e:
        raise ModelFilesError(f"model {str(path)!r}: unreadable config.json ({e})") from None
    if mtype != "internvl":
        raise ModelFilesError(f"model {str(path)!r}: config.json has model_type {mtype!r}, expected "
                              f"'internvl' (use the OpenGVLab/InternVL3-*-hf conversion, not the "
                              f"remote-code 'internvl_chat' checkpoint)")


# ----------------------------------------------------------------------------- loading
def load_model(path_or_name: Union[str, pathlib.Path] = "tiny", device="cpu", dtype=None,
               attn_implementation: Optional[str] = None) -> LoadedModel:
    """Load ``"tiny"`` or a local InternVL3-*-hf directory; returns a :class:`LoadedModel` in eval."""
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    attn = pick_attn_implementation(attn_implementation, dev, dt)
    if str(path_or_name) == "tiny":
        from .tiny import build_tiny_model, load_tiny_tokenizer
        tok = load_tiny_tokenizer()
        model = build_tiny_model(dev, dt, attn_implementation=attn)
        return _wrap(model, tok, dev, dt, "tiny")

    path = pathlib.Path(path_or_name).expanduser()
    _check_weights_dir(path)
    from transformers import AutoTokenizer, InternVLForConditionalGeneration
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
    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelFilesError(f"model {str(path)!r}: tokenizer could not be loaded ({e})") from e
    if not getattr(tok, "chat_template", None):
        tok.chat_template = _dir_chat_template(path)
    model.eval()
    return _wrap(model, tok, dev, dt, path.name)


def _dir_chat_template(path: pathlib.Path) -> Optional[str]:
    """The checkpoint's chat template when it lives with the processor, not the tokenizer
    (``chat_template.jinja`` or ``chat_template.json``); None -> prompt.py's plain ChatML."""
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text()
    for name in ("chat_template.json", "processor_config.json"):
        f = path / name
        if f.is_file():
            try:
                tpl = json.loads(f.read_text()).get("chat_template")
            except (OSError, json.JSONDecodeError, AttributeError):
                continue
            if isinstance(tpl, str):
                return tpl
    return None


def _wrap(model, tok, dev, dt, name) -> LoadedModel:
    cfg = model.config
    image_token_id = int(cfg.image_token_id)
    for t in ("<img>", "</img>", "<IMG_CONTEXT>"):
        ids = tok.encode(t, add_special_tokens=False)
        if len(ids) != 1:
            raise ModelFilesError(f"model {name!r}: the tokenizer does not hold {t!r} as one token")
    if tok.convert_tokens_to_ids("<IMG_CONTEXT>") != image_token_id:
        raise ModelFilesError(f"model {name!r}: config.image_token_id {image_token_id} is not the "
                              f"tokenizer's <IMG_CONTEXT> id {tok.convert_tokens_to_ids('<IMG_CONTEXT>')}")
    return LoadedModel(model=model, tokenizer=tok, image_token_id=image_token_id,
                       grid=frame_grid(cfg), hidden_size=int(cfg.text_config.hidden_size),
                       device=dev, dtype=dt, name=name)


def model_from_config(config, device="cpu", dtype=None, seed: int = 0,
                      attn_implementation: Optional[str] = None) -> LoadedModel:
    """Random-weight InternVL model of a shape preset (path to a config.json, or a dict).

    Built directly on ``device`` in ``dtype`` with transformers' init skipped, then filled by
    :func:`vr_runtime.tiny.init_weights_` on the device (an 8B shape takes seconds on a GPU).
    Paired with the tiny tokenizer; ``image_token_id`` and the eos/pad ids are rewritten to that
    tokenizer's ids (timings do not depend on token identities; every tiny id is < the preset's
    vocab size)."""
    from transformers import InternVLConfig, InternVLForConditionalGeneration
    from .tiny import SPECIAL_TOKENS, init_weights_, load_tiny_tokenizer
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    attn = pick_attn_implementation(attn_implementation, dev, dt)
    name = "config"
    if isinstance(config, (str, pathlib.Path)):
        p = pathlib.Path(config)
        if not p.is_file():
            raise ModelFilesError(f"config {str(config)!r}: no such file")
        name = p.stem
        config = json.loads(p.read_text())
    if not isinstance(config, dict):
        raise ValueError(f"config: expected a path or a dict, got {type(config).__name__}")
    tok = load_tiny_tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    cfg = dict(config)
    cfg["image_token_id"] = ids["<IMG_CONTEXT>"]
    text = dict(cfg.get("text_config") or {})
    if text.get("vocab_size", 0) < len(tok):
        raise ValueError(f"config: text_config.vocab_size {text.get('vocab_size')} is smaller than "
                         f"the tiny tokenizer ({len(tok)} ids)")
    text.update(eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
                bos_token_id=ids["<|im_start|>"])
    cfg["text_config"] = text
    config = InternVLConfig.from_dict(cfg)
    try:
        with _fast_init_ctx(), torch.device(dev):
            model = InternVLForConditionalGeneration._from_config(config, dtype=dt, attn_implementation=attn)
    except (ImportError, ValueError):
        if attn == "sdpa" or attn_implementation:
            raise
        # flash-attention chosen automatically but refused by transformers: sdpa always works.
        config = InternVLConfig.from_dict(cfg)
        with _fast_init_ctx(), torch.device(dev):
            model = InternVLForConditionalGeneration._from_config(config, dtype=dt, attn_implementation="sdpa")
    init_weights_(model, seed)
    model.eval()
    return _wrap(model, tok, dev, dt, name)


# ----------------------------------------------------------------------------- vision encoding
def pixel_shuffle(x: torch.Tensor, scale_factor: float = 0.5) -> torch.Tensor:
    """InternVL's pixel shuffle: [B, W, H, C] -> [B, W*r, H*r, C/r^2] (same op as HF's)."""
    b, w, h, c = x.shape
    if h % int(1 / scale_factor) or w % int(1 / scale_factor):
        raise ValueError(f"pixel_shuffle: grid {w}x{h} is not divisible by 1/{scale_factor}")
    x = x.reshape(b, w, int(h * scale_factor), int(c / scale_factor))
    x = x.permute(0, 2, 1, 3).contiguous()
    x = x.reshape(b, int(h * scale_factor), int(w * scale_factor), int(c / (scale_factor ** 2)))
    return x.permute(0, 2, 1, 3).contiguous()


def _check_pixels(pixel_values: torch.Tensor, chunk_size: int) -> None:
    if pixel_values.ndim != 4 or pixel_values.shape[1] != 3:
        raise ValueError(f"pixel_values: expected [T, 3, H, W], got {tuple(pixel_values.shape)}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size: expected an int >= 1, got {chunk_size!r}")


def vision_feature_chunks(model, pixel_values: torch.Tensor, chunk_size: int = 16):
    """Yield ``(start, feats)`` per chunk of ``chunk_size`` frames: the vision tower's selected
    layer, CLS dropped, pixel-shuffled: ``[b, H*W, 4*C]`` (pre-projector) in the tower's dtype.

    One chunk of ViT activations is alive at a time; callers project or copy and drop it."""
    _check_pixels(pixel_values, chunk_size)
    cfg = model.config
    vt = _inner(model).vision_tower
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


def encode_frames(model, pixel_values: torch.Tensor, chunk_size: int = 16,
                  requires_grad: bool = False) -> torch.Tensor:
    """Frames [T, 3, 448, 448] -> Z [T, 256, D] in the model's dtype on its device.

    Processes ``chunk_size`` frames at a time and copies each chunk's projected tokens into one
    preallocated output, so peak activation memory is that of one chunk of the ViT."""
    _check_pixels(pixel_values, chunk_size)
    cfg = model.config
    proj = _inner(model).multi_modal_projector
    p = next(proj.parameters())
    H, W = frame_grid(cfg)
    T = pixel_values.shape[0]
    Z = torch.empty(T, H * W, cfg.text_config.hidden_size, device=p.device, dtype=p.dtype)
    with torch.set_grad_enabled(requires_grad and torch.is_grad_enabled()):
        chunks = []
        for i, feats in vision_feature_chunks(model, pixel_values, chunk_size):
            z = proj(feats.to(p.dtype))
            if requires_grad:
                chunks.append(z)
            else:
                Z[i:i + z.shape[0]].copy_(z)
            del feats, z
        if requires_grad:
            Z = torch.cat(chunks, 0)
    return Z


__all__ = ["LoadedModel", "load_model", "model_from_config", "encode_frames", "vision_feature_chunks", "pixel_shuffle",
           "language_model", "lm_head", "frame_grid", "resolve_device", "resolve_dtype",
           "pick_attn_implementation"]
