"""Fused variable-scale mean pooling + ragged packing for VideoRouter (SPEC section 1)."""
from .windows import normalize_window, pooled_counts, window_tokens
from . import reference

# Placeholder until the Triton implementation lands: the reference honours the contract.
from .reference import pool_pack_reference as pool_pack  # noqa: F401

__all__ = ["pool_pack", "pooled_counts", "normalize_window", "window_tokens", "reference"]
