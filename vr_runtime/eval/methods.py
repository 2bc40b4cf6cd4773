"""The paper's methods as a registry: a name -> the keyword arguments of ``VideoRouter.answer``
(and, for ``data-ft``, which model answers). Adding a method is one :func:`register_method`
call; nothing branches on method names in the runtime.

| method | what it is | ``answer`` arguments |
|---|---|---|
| ``dense`` | every frame at full resolution, no budget | ``policy="dense"`` |
| ``budget`` | InternVL3*: as many full-resolution frames as the budget holds | ``policy="budget"`` |
| ``uniform`` | one window for every frame, the finest that fits | ``policy="uniform"`` |
| ``global`` | Global policy only | ``policy="global"`` |
| ``fragment`` | Fragment policy only (Image Router) | ``policy="fragment"`` |
| ``auto`` | VideoRouter: the Semantic Router chooses | ``policy="auto"`` |
| ``clip`` | CLIP relevance pooling (Appendix D) | ``policy="fragment", scorer=CLIPScorer`` |
| ``no-image-router`` | ablation: Semantic Router decides, Fragment -> uniform pooling | ``policy="auto", route_to={"fragment": "uniform"}`` |
| ``no-semantic-router`` | ablation: always Fragment | ``policy="fragment"`` |
| ``data-ft`` | "Data FT + Uniform Pooling": the backbone fine-tuned on the same QA data without routing, evaluated with uniform pooling | ``policy="uniform"`` on the ``--data-ft-model`` checkpoint |
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple


class MethodError(ValueError):
    """An unknown method, or one whose resources (--clip, --data-ft-model) were not given."""


@dataclass(frozen=True)
class Method:
    name: str
    policy: str
    description: str
    budgeted: bool = True                  # False: one row whatever the budget (dense)
    model: str = "main"                    # which model answers: "main" or a resource name
    route_to: Optional[Dict[str, str]] = None
    scorer: Optional[Callable] = None      # resources -> FrameScorer (e.g. CLIP)
    needs: Tuple[str, ...] = ()            # resources it needs: "clip", "data_ft_model"
    kwargs: Dict[str, object] = field(default_factory=dict)

    def answer_kwargs(self, resources: dict) -> dict:
        kw = {"policy": self.policy, **self.kwargs}
        if self.route_to:
            kw["route_to"] = dict(self.route_to)
        if self.scorer is not None:
            kw["scorer"] = self.scorer(resources)
        return kw


METHODS: Dict[str, Method] = {}

# What each resource is, for the error when it is missing.
RESOURCE_FLAGS = {"clip": "--clip PATH (a local CLIPModel / SiglipModel directory)",
                  "data_ft_model": "--data-ft-model PATH (the Data FT checkpoint, e.g. "
                                   "runs/tiny/data_ft/hf)"}


def register_method(name: str, policy: str, description: str, **kw) -> Method:
    if name in METHODS:
        raise MethodError(f"method {name!r} is already registered")
    METHODS[name] = m = Method(name, policy, description, **kw)
    return m


def get_method(name: str) -> Method:
    m = METHODS.get(name)
    if m is None:
        raise MethodError(f"--methods: unknown method {name!r}; expected some of "
                          f"{', '.join(METHODS)}")
    return m


def parse_methods(text: str, resources: dict) -> list:
    """``"dense,auto,clip"`` -> Methods, checked for their resources (before any model loads)."""
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    if not names:
        raise MethodError("--methods: empty; give a comma-separated list")
    if len(set(names)) != len(names):
        raise MethodError(f"--methods: {text!r} names a method twice")
    methods = [get_method(n) for n in names]
    for m in methods:
        for need in m.needs:
            if resources.get(need) is None:
                raise MethodError(f"--methods: {m.name!r} needs {RESOURCE_FLAGS[need]}")
    return methods


def _clip_scorer(resources):
    return resources["clip_scorer"]


register_method("dense", "dense", "every frame at full resolution, no budget", budgeted=False)
register_method("budget", "budget", "InternVL3*: full-resolution frames, as many as fit")
register_method("uniform", "uniform", "one window for every frame, the finest that fits")
register_method("global", "global", "Global policy only")
register_method("fragment", "fragment", "Fragment policy only (Image Router)")
register_method("auto", "auto", "VideoRouter: the Semantic Router picks Global or Fragment")
register_method("clip", "fragment", "CLIP relevance pooling (paper Appendix D)",
                scorer=_clip_scorer, needs=("clip",))
register_method("no-image-router", "auto", "ablation: Fragment falls back to uniform pooling",
                route_to={"fragment": "uniform"})
register_method("no-semantic-router", "fragment", "ablation: always Fragment")
register_method("data-ft", "uniform", "Data FT + Uniform Pooling (backbone fine-tuned on the "
                "QA data without routing)", model="data_ft_model", needs=("data_ft_model",))

DEFAULT_METHODS = ("dense,budget,uniform,global,fragment,auto,no-image-router,"
                   "no-semantic-router")

__all__ = ["Method", "METHODS", "MethodError", "register_method", "get_method", "parse_methods",
           "DEFAULT_METHODS"]
