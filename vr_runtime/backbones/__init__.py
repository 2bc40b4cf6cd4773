"""Backbone registry: a local checkpoint directory (read by its config.json ``model_type``), a
preset name, or a shape preset (random weights) -> a :class:`~.base.Backbone`.

Adding a backbone is one module with a ``Backbone`` subclass (``load``, ``tiny``,
``from_config`` class methods) plus one registration: a line in each table below for the
package's own, or :func:`register_backbone` from outside the package.

The tables are plain data and the interface (``.base``, which imports torch) loads on first use,
so ``videorouter --help`` lists the families and presets from here without importing torch.
"""
from __future__ import annotations

import importlib
import json
import pathlib
from typing import TYPE_CHECKING, Optional, Union

from ..errors import ModelFilesError

if TYPE_CHECKING:
    from .base import Backbone, FrameSpec

# model_type in config.json -> "module:Class" (imported on first use: transformers is heavy)
MODEL_TYPES = {
    "internvl": "internvl3:InternVL3Backbone",
    "qwen2_5_vl": "qwen2_5_vl:Qwen25VLBackbone",
    "qwen3_vl": "qwen3_vl:Qwen3VLBackbone",
    "qwen3_vl_moe": "qwen3_vl:Qwen3VLMoeBackbone",
    "qwen3_5": "qwen3_vl:Qwen35Backbone",
    "qwen3_5_moe": "qwen3_vl:Qwen35MoeBackbone",
}
# model_type -> the checkpoints it names, for people (help, messages); a type registered from
# outside without one is shown by its model_type
FAMILY_NAMES = {
    "internvl": "InternVL3/InternVL3.5 -hf",
    "qwen2_5_vl": "Qwen2.5-VL",
    "qwen3_vl": "Qwen3-VL",
    "qwen3_vl_moe": "Qwen3-VL MoE",
    "qwen3_5": "Qwen3.5",
    "qwen3_5_moe": "Qwen3.5 MoE",
}
# preset name -> the model_type whose class builds it with ``.tiny()``
PRESETS = {
    "tiny": "internvl",
    "tiny-qwen2.5-vl": "qwen2_5_vl",
    "tiny-qwen3-vl": "qwen3_vl",
    "tiny-qwen3-vl-moe": "qwen3_vl_moe",
    "tiny-qwen3.5": "qwen3_5",
    "tiny-qwen3.5-moe": "qwen3_5_moe",
}


# model_type of a checkpoint people try that no backbone loads -> what to do instead
UNSUPPORTED = {
    "internvl_chat": "use the OpenGVLab/InternVL3-*-hf conversion, not the remote-code "
                     "'internvl_chat' checkpoint",
    "qwen2_vl": "Qwen2-VL is not supported; Qwen2.5-VL and the later Qwen families are",
}


def backbone_class(model_type: str):
    spec = MODEL_TYPES.get(model_type)
    if spec is None:
        hint = f"; {UNSUPPORTED[model_type]}" if model_type in UNSUPPORTED else ""
        raise ModelFilesError(f"model_type {model_type!r} is not supported; expected one of "
                              f"{families()}{hint}")
    if isinstance(spec, type):   # registered from outside the package (register_backbone)
        return spec
    mod, cls = spec.split(":")
    return getattr(importlib.import_module(f".{mod}", __name__), cls)


def register_backbone(cls, model_types=None, presets=()) -> type:
    """Make a :class:`Backbone` subclass loadable by ``load_backbone`` / ``--model``: checkpoint
    directories whose config.json ``model_type`` is one of ``model_types`` (default: the
    class's own ``model_types``) and the preset names in ``presets`` (built with
    ``cls.tiny()``). Usable as a class decorator: ``register_backbone(MyBackbone, presets=
    ("my-tiny",))``. A name already taken by another class is refused."""
    from .base import Backbone
    if not (isinstance(cls, type) and issubclass(cls, Backbone)):
        raise TypeError(f"register_backbone: expected a Backbone subclass, got {cls!r}")
    types = tuple(model_types if model_types is not None else cls.model_types)
    if not types:
        raise ValueError(f"register_backbone: {cls.__name__} names no model_type")
    for t in types:
        if t in MODEL_TYPES and MODEL_TYPES[t] is not cls:
            raise ValueError(f"register_backbone: model_type {t!r} is already registered")
    for p in presets:
        if p in PRESETS and PRESETS[p] not in types:
            raise ValueError(f"register_backbone: preset {p!r} is already registered")
    for t in types:
        MODEL_TYPES[t] = cls
    for p in presets:
        PRESETS[p] = types[0]
    return cls


def families() -> str:
    """Every registered family, for people: ``"internvl (InternVL3/InternVL3.5 -hf), ..."``."""
    return ", ".join(f"{t} ({FAMILY_NAMES[t]})" if t in FAMILY_NAMES else t for t in MODEL_TYPES)


MODEL_HINT = "a local checkpoint directory of a supported family ('videorouter ask --help')"


def resolve_model(path_or_name: Union[str, pathlib.Path]) -> Union[str, pathlib.Path]:
    """Where a model argument points, checked without loading anything: a preset name (returned
    as is), a local directory, or a Hugging Face Hub id (``OpenGVLab/InternVL3-1B-hf``) found in
    the local Hugging Face cache -- its snapshot directory. ``ask``, ``serve``, ``eval``, the
    lmms-eval plugin and ``VideoRouter.from_pretrained`` all resolve through here. Nothing is
    downloaded: a Hub id not in the cache is a ``ModelFilesError`` giving the download command."""
    name = str(path_or_name)
    if name in PRESETS:
        return name
    path = pathlib.Path(name).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ModelFilesError(f"model {name!r}: not a directory; pass {MODEL_HINT}, a Hugging "
                              f"Face id in the local cache, or a preset ({', '.join(PRESETS)})")
    from .files import cached_snapshot, looks_like_hub_id
    if looks_like_hub_id(name):
        return cached_snapshot(name)
    raise ModelFilesError(f"model {name!r}: not a directory; pass {MODEL_HINT}, a Hugging Face "
                          f"id in the local cache (e.g. OpenGVLab/InternVL3-1B-hf), or a preset "
                          f"({', '.join(PRESETS)}); nothing is downloaded")


def check_model_arg(model: Union[str, pathlib.Path]) -> None:
    """``--model``, checked before anything loads (:func:`resolve_model`), its one line naming
    the flag."""
    try:
        resolve_model(model)
    except ModelFilesError as e:
        raise ModelFilesError(f"--{e}") from None   # "model 'X': ..." -> "--model 'X': ..."


def load_backbone(path_or_name: Union[str, pathlib.Path] = "tiny", device="cpu", dtype=None,
                  attn_implementation: Optional[str] = None) -> Backbone:
    """A preset (``tiny``, ``tiny-qwen2.5-vl``), a local checkpoint directory or a cached Hub id
    (see :func:`resolve_model`), in eval mode."""
    name = str(path_or_name)
    if name in PRESETS:
        return _finite(backbone_class(PRESETS[name]).tiny(
            device=device, dtype=dtype, attn_implementation=attn_implementation), name)
    path = resolve_model(path_or_name)
    from .files import read_model_type
    mtype = read_model_type(path) if (path / "config.json").is_file() else "internvl"
    # A directory without config.json goes to InternVL3's loader, which names what is missing;
    # a model_type no backbone loads is one line naming the supported ones.
    cls = backbone_class(mtype)
    lm = cls.load(path, device=device, dtype=dtype, attn_implementation=attn_implementation)
    if not pathlib.Path(name).expanduser().is_dir():
        lm.name = name   # a Hub id: reports name the model, not its snapshot's commit hash
    return _finite(lm, name)


def _finite(lm: Backbone, name: str) -> Backbone:
    """Refuse weights holding NaN or inf (a diverged fine-tuning's): every answer from them
    would be garbage with no sign of why."""
    from .weights import nonfinite
    bad = nonfinite(lm.model.named_parameters())
    if bad:
        raise ModelFilesError(f"model {name!r}: {bad}; the weights are damaged or come from a "
                              f"training that diverged")
    return lm


def backbone_class_for(path_or_name: Union[str, pathlib.Path]):
    """(backbone class, config dict) of a preset or checkpoint directory, from its config.json
    alone (no weights): what a caller needs to check a request before the model loads."""
    name = str(path_or_name)
    if name in PRESETS:
        cls = backbone_class(PRESETS[name])
        return cls, cls.preset_config(name)
    path = resolve_model(path_or_name)
    from .files import read_model_type
    if not (path / "config.json").is_file():
        raise ModelFilesError(f"model {name!r}: no config.json; pass {MODEL_HINT} (or a preset: "
                              f"{', '.join(PRESETS)})")
    cfg = json.loads((path / "config.json").read_text())
    return backbone_class(read_model_type(path)), cfg


def frame_spec_for(path_or_name: Union[str, pathlib.Path]) -> FrameSpec:
    """The frame spec of a preset or checkpoint directory from its config.json alone (no
    weights): decoding can start while the model loads."""
    cls, cfg = backbone_class_for(path_or_name)
    return cls.spec_from_config(cfg)


def backbone_from_config(config, device="cpu", dtype=None, seed: int = 0,
                         attn_implementation: Optional[str] = None) -> Backbone:
    """Random weights of a shape preset: a config.json path or dict (its ``model_type`` picks
    the backbone); paired with the tiny tokenizer. For latency benchmarks."""
    name = "config"
    if isinstance(config, (str, pathlib.Path)):
        p = pathlib.Path(config)
        if not p.is_file():
            raise ModelFilesError(f"config {str(config)!r}: no such file")
        name = p.stem
        config = json.loads(p.read_text())
    if not isinstance(config, dict):
        raise ValueError(f"config: expected a path or a dict, got {type(config).__name__}")
    cls = backbone_class(config.get("model_type", "internvl"))
    return cls.from_config(config, device=device, dtype=dtype, seed=seed,
                           attn_implementation=attn_implementation, name=name)


def __getattr__(name: str):
    # The interface's names load with torch on first use (see the module docstring).
    if name in ("Backbone", "FrameSpec", "VisionTokens"):
        from . import base
        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Backbone", "FrameSpec", "VisionTokens", "load_backbone", "backbone_from_config",
           "frame_spec_for", "resolve_model",
           "backbone_class", "register_backbone", "check_model_arg", "families", "MODEL_TYPES",
           "FAMILY_NAMES", "PRESETS"]
