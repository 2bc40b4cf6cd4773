"""The policy names ``--policy`` and ``policy=`` accept, importable without the planners (which
import torch), so ``--help`` lists them at once. ``planning.policies`` registers a planner under
each but ``auto``; tests/planning/test_policy_names.py holds the two equal."""

AUTO = "auto"
# The paper's: auto (the Semantic Router picks global or fragment) and its baselines.
PAPER_POLICIES = (AUTO, "global", "fragment", "dense", "budget", "uniform")
# Beyond the paper: the literal Algorithm 1 (docs/PAPER.md) and the long-prompt planners.
MORE_POLICIES = ("fragment-literal", "fragment-long", "global-long", "fragment-long-16",
                 "global-long-16", "fragment-long-mid", "fragment-long-16-mid")
POLICY_NAMES = PAPER_POLICIES + MORE_POLICIES
