"""Old import paths of moved modules, kept for one release.

The modules were folded by pipeline stage (``vr_runtime.policies`` is now
``vr_runtime.planning.policies``, and so on: :data:`MOVED`). Importing an old path returns the
module at its new path itself, not a copy, so monkeypatching either name patches the same
module, and warns once with a :class:`DeprecationWarning` that names the new path. The finder
is installed by ``vr_runtime/__init__.py`` and does no work for any other import.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings

# old module path -> new module path
MOVED = {
    "vr_runtime.decoders": "vr_runtime.video.decoders",
    "vr_runtime.routers": "vr_runtime.routing.routers",
    "vr_runtime.scorers": "vr_runtime.routing.scorers",
    "vr_runtime.policies": "vr_runtime.planning.policies",
    "vr_runtime.budget": "vr_runtime.planning.budget",
    "vr_runtime.scales": "vr_runtime.planning.scales",
    "vr_runtime.latency": "vr_runtime.planning.latency",
    "vr_runtime.cost_model": "vr_runtime.planning.cost_model",
    "vr_runtime.prompt": "vr_runtime.backbones.prompt",
    "vr_runtime.tiny": "vr_runtime.backbones.tiny",
    "vr_runtime.weights": "vr_runtime.backbones.weights",
    "vr_runtime.devices": "vr_runtime.backbones.devices",
    "vr_runtime.decode": "vr_runtime.generate",
    "vr_runtime.training.synthetic": "vr_runtime.data.synthetic_videos",
    "vr_runtime.atomic": "vr_runtime.data.atomic",
    "vr_runtime.environment": "vr_runtime.fingerprint",
    "vr_runtime.plot": "vr_runtime.report",
    "vr_runtime.timing": "vr_runtime.telemetry.timing",
    "vr_runtime.nvml": "vr_runtime.telemetry.nvml",
    "vr_runtime.memory": "vr_runtime.telemetry.memory",
    "vr_runtime.progress": "vr_runtime.telemetry.progress",
    "vr_runtime.cli_common": "vr_runtime.cli_args",
}


class _MovedLoader(importlib.abc.Loader):
    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there (the old path goes in "
                      f"the next release)", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module):
        # The import system stamped the alias's spec on the module; give it back its own.
        module.__spec__ = module.__spec__.loader_state


class MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedLoader())


def install() -> None:
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedFinder())
