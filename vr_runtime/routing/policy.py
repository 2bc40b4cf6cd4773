"""The policy stage: which planner answers a request. ``auto`` asks the Semantic Router (on the
question alone) and routes its class through the request's ``route_to``; any other policy is
the request's own. Untrained routers do not pretend to route: ``auto`` falls back to
:data:`~vr_runtime.planning.policies.UNTRAINED_AUTO_POLICY` and says so."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from ..planning.policies import AUTO, UNTRAINED_AUTO_POLICY, policy_from_logits


@dataclass(frozen=True)
class PolicyDecision:
    policy: str                    # the planner that runs
    probability: Optional[float]   # the Semantic Router's confidence, when it decided
    notes: tuple = ()


def decide_policy(req, routers, embed: Callable, timer) -> PolicyDecision:
    """``req``: the request (``policy``, ``route_to``, ``routed_question``); ``embed``: the
    question -> Emb(q); the Semantic Router's time goes to ``timer``'s "router"."""
    if req.policy != AUTO:
        return PolicyDecision(req.policy, None)
    if not getattr(routers, "trained", False):
        return PolicyDecision(req.route_to[UNTRAINED_AUTO_POLICY], None, (
            f"routers are untrained: policy 'auto' fell back to '{UNTRAINED_AUTO_POLICY}' "
            f"(pass trained router weights or an explicit --policy)",))
    with timer.stage("router"):
        q = embed(req.routed_question)
        cls, prob = policy_from_logits(routers.policy_logits(q[None])[0])
    return PolicyDecision(req.route_to[cls], prob)


__all__ = ["PolicyDecision", "decide_policy"]
