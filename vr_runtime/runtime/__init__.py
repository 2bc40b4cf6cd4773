"""The runtime: :class:`VideoRouter` (:mod:`.pipeline`, the sequence of stages), its visual
cache (:mod:`.cache`) and its batch path (:mod:`.batch`)."""
from ..planning.policies import SEMANTIC_CLASSES, UNTRAINED_AUTO_POLICY, policy_names
from ..request import AnswerOptions, Request
from ..routing.policy import PolicyDecision
from ..video.frames import Frames
from .pipeline import Answer, VideoRouter

POLICIES = policy_names()  # the built-in ones; register_planner adds more at run time

__all__ = ["VideoRouter", "Answer", "AnswerOptions", "Request", "Frames", "PolicyDecision",
           "POLICIES", "UNTRAINED_AUTO_POLICY", "SEMANTIC_CLASSES"]
