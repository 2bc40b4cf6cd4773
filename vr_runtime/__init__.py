"""VideoRouter runtime (docs/CONTRACT.md sections 2 to 4, 7) over the model families registered
in :mod:`vr_runtime.backbones` (``MODEL_TYPES``, ``PRESETS``; ``videorouter ask --help`` lists
them)."""
from .errors import DeviceError, ModelFilesError, RouterWeightsError, VideoError


__all__ = ["BudgetError", "visual_budget", "plan_global", "plan_fragment", "plan_dense",
           "plan_budget", "plan_uniform", "plan_tokens", "uniform_sample", "VideoRouter",
           "Answer", "AnswerOptions", "Routers", "RouterConfig", "load_backbone", "backbone_from_config",
           "VideoError", "ModelFilesError", "RouterWeightsError", "DeviceError"]

# Keep `import vr_runtime` light: torch (through budget -> vr_kernels) and the model stack
# (transformers) load on first use, so `videorouter` reaches its Ctrl-C handler in
# milliseconds instead of after seconds of imports.
_BUDGET = ("BudgetError", "visual_budget", "plan_global", "plan_fragment", "plan_dense",
           "plan_budget", "plan_uniform", "plan_tokens", "uniform_sample")
_LAZY = {**{n: "planning.budget" for n in _BUDGET}, "VideoRouter": "runtime", "Answer": "runtime",
         "AnswerOptions": "request",
         "Routers": "routing.routers", "RouterConfig": "routing.routers", "load_backbone": "backbones",
         "backbone_from_config": "backbones"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'vr_runtime' has no attribute {name!r}")
