"""Fused variable-scale mean pooling + ragged packing for VideoRouter (docs/CONTRACT.md section 1).

``pool_pack`` dispatches to Triton kernels on CUDA (and on CPU under ``TRITON_INTERPRET=1``),
or to a vectorised PyTorch path on CPU; ``reference`` is the plain per-frame implementation.
"""
from . import reference
from .checks import PoolPackArgError
from .pool_pack import pool_pack, warmup
from .reference import pool_pack_reference
from .windows import normalize_window, pooled_counts, window_tokens

__all__ = ["pool_pack", "warmup", "pool_pack_reference", "pooled_counts", "normalize_window", "window_tokens",
           "reference", "PoolPackArgError"]
