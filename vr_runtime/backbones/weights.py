"""Strict copy of a loaded state dict into a module (safetensors in, never pickle)."""
from __future__ import annotations

from typing import Dict, Optional

import torch


def copy_state_strict(module: torch.nn.Module, state: Dict[str, torch.Tensor],
                      limit: int = 5) -> Optional[str]:
    """Copy ``state`` into ``module`` if the keys and shapes match exactly.

    Returns ``None`` after copying, or, copying nothing, a description of what does not fit
    (missing / unexpected keys, wrong shapes) for the caller's own error message."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    extra = sorted(set(state) - set(own))
    bad = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}"
           for k in sorted(set(state) & set(own)) if tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or extra or bad:
        return f"missing {missing[:limit]}, unexpected {extra[:limit]}, wrong shape {bad[:limit]}"
    with torch.no_grad():
        for k, v in state.items():
            own[k].copy_(v)
    return None


def nonfinite(named_tensors, limit: int = 3) -> Optional[str]:
    """``None`` when every floating-point tensor of ``named_tensors`` ((name, tensor) pairs, e.g.
    ``module.named_parameters()`` or ``state.items()``) is finite; else a description naming
    the first few that hold NaN or inf, for the caller's own error message."""
    items = [(name, t) for name, t in named_tensors
             if torch.is_tensor(t) and t.is_floating_point() and t.numel()]
    if _all_finite([t for _, t in items]):
        return None
    bad, n = [], 0
    for name, t in items:   # rare: name the culprits, one tensor at a time
        if not bool(torch.isfinite(t).all()):
            n += 1
            if len(bad) < limit:
                bad.append(name)
    if not n:
        return None
    more = ", ..." if n > len(bad) else ""
    return f"{n} tensor(s) hold NaN or inf ({', '.join(bad)}{more})"


@torch.no_grad()
def _all_finite(tensors) -> bool:
    """Whether every tensor is finite, from each one's largest magnitude (NaN and inf carry
    through the max, a finite value never overflows it): one batched reduction and one host
    sync per (device, dtype): an isfinite, an all and a sync per tensor cost a small model's
    load more than the arithmetic does (bench/results/ask_one_shot_cpu.md)."""
    groups: Dict[tuple, list] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t.detach())
    for group in groups.values():
        try:
            ok = torch.isfinite(torch.stack(torch._foreach_norm(group, ord=float("inf"))))
        except (RuntimeError, NotImplementedError, AttributeError):  # a dtype it lacks (fp8)
            ok = torch.stack([torch.isfinite(t).all() for t in group])
        if not bool(ok.all()):
            return False
    return True
