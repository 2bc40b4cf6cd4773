"""VideoRouter runtime on InternVL3 and Qwen2.5-VL (SPEC sections 2 to 4, 7)."""
from .budget import (BudgetError, plan_budget, plan_dense, plan_fragment, plan_global,
                     plan_tokens, plan_uniform, uniform_sample, visual_budget)
from .errors import DeviceError, ModelFilesError, RouterWeightsError, VideoError

__all__ = ["BudgetError", "visual_budget", "plan_global", "plan_fragment", "plan_dense",
           "plan_budget", "plan_uniform", "plan_tokens", "uniform_sample", "VideoRouter",
           "Answer", "Routers", "RouterConfig", "load_backbone", "backbone_from_config",
           "VideoError", "ModelFilesError", "RouterWeightsError", "DeviceError"]

# Keep `import vr_runtime` light: the model stack (transformers) loads on first use.
_LAZY = {"VideoRouter": "runtime", "Answer": "runtime", "Routers": "routers",
         "RouterConfig": "routers", "load_backbone": "backbones",
         "backbone_from_config": "backbones"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'vr_runtime' has no attribute {name!r}")
