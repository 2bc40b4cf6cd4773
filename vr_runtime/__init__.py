"""VideoRouter runtime on InternVL3 (SPEC sections 2 to 4)."""
from .budget import (BudgetError, plan_budget, plan_dense, plan_fragment, plan_global,
                     plan_tokens, plan_uniform, uniform_sample, visual_budget)

__all__ = ["BudgetError", "visual_budget", "plan_global", "plan_fragment", "plan_dense",
           "plan_budget", "plan_uniform", "plan_tokens", "uniform_sample", "VideoRouter"]


def __getattr__(name):  # keep `import vr_runtime` light: the model stack loads on first use
    if name == "VideoRouter":
        from .runtime import VideoRouter
        return VideoRouter
    raise AttributeError(f"module 'vr_runtime' has no attribute {name!r}")
