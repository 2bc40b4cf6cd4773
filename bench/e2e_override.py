"""Run the real routers but impose a fixed decision: the benchmark's stand-in for trained routers.

Untrained routers make meaningless decisions, and ``VideoRouter.answer(relevant=...)`` forces
the Image Router's decisions by *skipping* the routers, so their cost would vanish from TTFT.
The paper's VideoRouter TTFT includes both routers (shadow-stack forward + heads). So, for the
duration of a ``with forced_routing(vr, relevant):`` block:

* ``routers.trained`` reads True, so ``policy="auto"`` runs the Semantic Router on the question
  instead of falling back to Global;
* ``routers.policy_logits`` runs its full forward and then returns logits for Fragment;
* ``routers.frame_probs`` runs its full forward over every frame ([Z_t; q] through the shadow
  stack and the Image Router head) and then returns 1.0 for the frames marked relevant, 0.0 for
  the others.

The forced outputs are computed *from* the real ones (``real * 0 + pattern``), so the device
has to finish the router work before the plan is made, and the runtime's synchronised "router"
stage times exactly that work. Everything is restored on exit. Reports produced inside the block
say ``routers_trained: true`` and carry the forced scores; the benchmark records that the
decisions were imposed (``router_mode`` in its results).
"""
from __future__ import annotations

import contextlib
from typing import Sequence

import torch


@contextlib.contextmanager
def forced_routing(vr, relevant: Sequence[bool]):
    routers = vr.routers
    pattern = [1.0 if r else 0.0 for r in relevant]
    trained = routers.trained
    real_policy, real_frames = routers.policy_logits, routers.frame_probs

    # *args/**kwargs: pass through whatever the runtime's signature is (it grows options).
    def policy_logits(*args, **kwargs):
        out = real_policy(*args, **kwargs)
        forced = torch.tensor([-20.0, 20.0], device=out.device, dtype=out.dtype)  # class 1: Fragment
        return out * 0 + forced

    def frame_probs(*args, **kwargs):
        probs = real_frames(*args, **kwargs)
        if probs.shape[0] != len(pattern):
            raise ValueError(f"relevant: {len(pattern)} entries for {probs.shape[0]} frames")
        return probs * 0 + torch.tensor(pattern, device=probs.device, dtype=probs.dtype)

    routers.trained = True
    routers.policy_logits, routers.frame_probs = policy_logits, frame_probs
    try:
        yield
    finally:
        routers.trained = trained
        # Drop the instance attributes so the class methods are visible again.
        del routers.policy_logits, routers.frame_probs


@contextlib.contextmanager
def routers_offloaded(vr, enabled: bool = True):
    """Baseline rows (Dense, Budget, Uniform) are plain InternVL3: no router in memory. On a GPU
    the VideoRouter object keeps its shadow stack resident (4 decoder layers: ~1.9 GB at the 8B
    shape), which would inflate the baselines' peak memory; so while a baseline row runs the
    routers wait on the CPU (the baselines never call them) and come back afterwards. The moves
    happen outside the timed calls."""
    routers = vr.routers
    try:
        home = next(routers.parameters()).device
    except StopIteration:
        home = None
    if not enabled or home is None or home.type == "cpu":
        yield
        return
    routers.to("cpu")
    try:
        yield
    finally:
        routers.to(home)
