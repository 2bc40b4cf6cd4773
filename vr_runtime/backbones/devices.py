"""Device, dtype and attention-implementation choices shared by every backbone."""
from __future__ import annotations

import torch

from ..errors import DeviceError

_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
           "float16": torch.float16, "half": torch.float16, "fp32": torch.float32,
           "float32": torch.float32, "float": torch.float32}


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


def device_dtype(device=None, dtype=None):
    """``--device``/``--dtype`` resolved before anything loads, so asking for CUDA on a machine
    without it fails fast. None: CUDA when there is one, else the CPU; the device's default
    dtype."""
    dev = resolve_device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return dev, resolve_dtype(dtype, dev)


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
    from transformers.utils import is_flash_attn_2_available
    try:
        if not is_flash_attn_2_available():
            return False
        import flash_attn  # noqa: F401  (a wheel built for another torch fails here)
        return True
    except Exception:
        return False


__all__ = ["resolve_device", "resolve_dtype", "pick_attn_implementation"]
