"""Stage configurations: the paper's hyper-parameter table as JSON files.

``vr_runtime/configs/train_stage{1,2,3}.json`` hold the paper's values (the defaults). The
freezing flags are spelled as in the paper's table; two more make the remaining groups
explicit: ``freeze_mlp`` (the vision->LLM projector) and ``freeze_feature_extractor`` (the
router shadow stack E_1:4, trained in Stage 1, frozen in Stage 2).

A curriculum beyond the paper's keeps its options in a section of its own, named by its
extension (``"tiny": {...}``; ``curriculum.py``), checked here with the paper's keys.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import pathlib
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .curriculum import EXTENSIONS

# The paper's configs (train_stage*.json) live in vr_runtime/configs beside the model and
# launcher configs.
CONFIG_DIR = pathlib.Path(__file__).resolve().parent.parent / "configs"


class ConfigError(ValueError):
    """A training configuration with an unknown key or an out-of-range value."""


@dataclass
class TrainConfig:
    stage: int = 1
    model: str = "tiny"                 # an InternVL3-*-hf folder or "tiny"
    routers: Optional[str] = None       # router weights to start from (Stage 2/3: Stage 1's)
    train_data: Optional[str] = None    # JSONL (see vr_runtime.training.data)
    eval_data: Optional[str] = None
    output_dir: str = "runs/stage1"
    model_max_length: int = 12288
    num_frames: int = 64
    num_train_epochs: float = 1.0
    per_device_train_batch_size: int = 4
    gradient_accumulation_steps: int = 4
    learning_rate: float = 1e-5
    weight_decay: float = 0.0
    warmup_ratio: float = 0.03
    lr_scheduler_type: str = "cosine"
    max_grad_norm: float = 1.0
    freeze_vision_model: bool = True
    freeze_mlp: bool = True
    freeze_language_model: bool = True
    freeze_feature_extractor: bool = True
    freeze_Semantic_Router: bool = True
    freeze_Image_Router: bool = True
    dropout: float = 0.0
    global_window: int = 2                  # s_g: every frame under Global
    fragment_windows: List[int] = field(default_factory=lambda: [1, 4])   # [s_1, s_0]
    lambda_sem: float = 0.01
    lambda_img: float = 0.01
    pool_pack_backend: str = "auto"     # vr_kernels backend: auto / triton / torch / reference
    plan_from: str = "routers"          # Stage 3 plans: the routers' decisions, or "labels"
    plan_policy: str = "routers"        # Stage 3 plans: "routers" (Global/Fragment as decided
                                        # by plan_from) or any registered budgeted planner, e.g.
                                        # "uniform": the paper's "Data FT + Uniform Pooling"
                                        # control (routers unused; freeze them, lambdas 0)
    train_max_length: List[int] = field(default_factory=list)
                                        # [lo, hi]: Stage 3 training draws each example's
                                        # L_max uniformly from [lo, hi] (tight budgets drop
                                        # frames, as at inference); [] = model_max_length
    train_budget_fraction: List[float] = field(default_factory=list)
                                        # [lo, hi]: instead, a fixed visual budget of a fraction
                                        # drawn uniformly from [lo, hi] of the example's dense
                                        # tokens (T x tokens per frame): the same compression
                                        # for 8 and 64 frames (synthetic task v2; routing-eval
                                        # measures at a quarter); [] = off
    false_positive_prob: float = 0.0    # Stage 3 training, Fragment plans: probability of
                                        # marking one random irrelevant frame relevant (the
                                        # router's typical error at inference)
    eval_max_lengths: List[int] = field(default_factory=list)
                                        # Stage 3: also evaluate under these L_max values
    router_num_layers: int = 4
    router_dim: Optional[int] = None    # Image Router width (None: the RouterConfig default)
    router_heads: int = 8
    router_pool: int = 1                # window on Z_t before the Image Router (1 = paper)
    frames_per_example: int = 0         # > 0: L_img on all positives + random negatives up to
                                        # this many frames (frames are scored independently)
    margin: int = 100                   # eps reserved in the Stage 3 budget, as at inference
    gen_tokens: int = 64                # L_gen reserved in the Stage 3 budget, as at inference
    bf16: bool = False
    gradient_checkpointing: bool = False
    seed: int = 42
    logging_steps: int = 10
    save_steps: int = 0                 # 0: save at the end of each epoch only
    save_total_limit: int = 2           # keep the newest N complete checkpoints (and the one
                                        # resumed from); 0: keep every one
    max_steps: int = 0                  # > 0 overrides the epochs (tests, smoke runs)
    eval_limit: int = 0                 # > 0: evaluate on the first N held-out examples only
    report_to: List[str] = field(default_factory=lambda: ["tensorboard"])
    note: str = ""
    extensions: Dict[str, Any] = field(default_factory=dict)
                                        # name -> the options of a registered curriculum
                                        # (curriculum.py), a section "name": {...} of the file

    def validate(self) -> "TrainConfig":
        """Every key's type, range and the relations between keys; ``ConfigError`` naming the
        first bad key. Cheap (no file, no model): run before anything expensive."""
        _check_types(self)
        if self.stage not in (1, 2, 3):
            raise ConfigError(f"stage: expected 1, 2 or 3, got {self.stage!r}")
        self._check_ranges()
        self._check_relations()
        self._check_planning()
        self._check_stage3_options()
        _check_extensions(self)
        return self

    def _check_ranges(self) -> None:
        """Counts, sizes and rates within their ranges; a model and an output folder named."""
        for k in ("per_device_train_batch_size", "gradient_accumulation_steps", "num_frames",
                  "model_max_length"):
            if not isinstance(getattr(self, k), int) or getattr(self, k) < 1:
                raise ConfigError(f"{k}: expected an int >= 1, got {getattr(self, k)!r}")
        for k in ("logging_steps", "router_num_layers", "router_heads", "router_pool",
                  "global_window"):
            if getattr(self, k) < 1:
                raise ConfigError(f"{k}: expected an int >= 1, got {getattr(self, k)!r}")
        for k in ("save_steps", "save_total_limit", "max_steps", "eval_limit",
                  "frames_per_example", "margin",
                  "gen_tokens", "weight_decay", "max_grad_norm", "lambda_sem", "lambda_img"):
            if getattr(self, k) < 0:
                raise ConfigError(f"{k}: expected >= 0, got {getattr(self, k)!r}")
        if not self.learning_rate > 0:
            raise ConfigError(f"learning_rate: expected > 0, got {self.learning_rate!r}")
        if not self.num_train_epochs > 0:
            raise ConfigError(f"num_train_epochs: expected > 0 (max_steps > 0 overrides it), "
                              f"got {self.num_train_epochs!r}")
        if not self.model:
            raise ConfigError("model: expected a model folder, a cached Hub id or 'tiny'")
        if not self.output_dir:
            raise ConfigError("output_dir: expected a folder for checkpoints and outputs")

    def _check_relations(self) -> None:
        """The keys that constrain each other, the trackers and the schedule."""
        if self.router_dim is not None and (self.router_dim < 1 or
                                            self.router_dim % self.router_heads):
            raise ConfigError(f"router_dim: expected null or an int >= 1 divisible by "
                              f"router_heads ({self.router_heads}), got {self.router_dim!r}")
        if self.margin + self.gen_tokens >= self.model_max_length:
            raise ConfigError(f"model_max_length: expected > margin + gen_tokens "
                              f"({self.margin} + {self.gen_tokens}), got {self.model_max_length}")
        unknown = sorted(set(self.report_to) - set(TRACKERS))
        if unknown:
            raise ConfigError(f"report_to: expected a list of {', '.join(TRACKERS)} (or []), "
                              f"got {unknown}")
        if not 0 <= self.warmup_ratio < 1:
            raise ConfigError(f"warmup_ratio: expected in [0, 1), got {self.warmup_ratio!r}")
        if self.lr_scheduler_type not in ("cosine", "linear", "constant"):
            raise ConfigError(f"lr_scheduler_type: expected cosine, linear or constant, "
                              f"got {self.lr_scheduler_type!r}")

    def _check_planning(self) -> None:
        """Stage 3's kernel backend and where its plans come from."""
        # imported here, not at the top: the CLI imports this module to parse its arguments,
        # and --help must not load torch
        from vr_kernels.pool_pack import BACKENDS
        if self.pool_pack_backend not in BACKENDS:
            raise ConfigError(f"pool_pack_backend: expected one of {', '.join(BACKENDS)}, "
                              f"got {self.pool_pack_backend!r}")
        if self.plan_from not in ("routers", "labels"):
            raise ConfigError(f"plan_from: expected 'routers' or 'labels', got {self.plan_from!r}")
        if self.plan_policy != "routers":
            from vr_runtime.planning.policies import PLANNERS
            p = PLANNERS.get(self.plan_policy)
            if p is None or p.needs_relevance or not p.budgeted:
                ok = [n for n, q in PLANNERS.items() if q.budgeted and not q.needs_relevance]
                raise ConfigError(f"plan_policy: expected 'routers' or a budgeted planner that "
                                  f"needs no frame scores ({', '.join(ok)}), got "
                                  f"{self.plan_policy!r}")

    def _check_stage3_options(self) -> None:
        """Stage 3's training budgets, plan noise, evaluation lengths, scales and dropout."""
        if self.train_max_length and (len(self.train_max_length) != 2 or
                                      not 1 <= self.train_max_length[0] <= self.train_max_length[1]):
            raise ConfigError(f"train_max_length: expected [] or [lo, hi] with 1 <= lo <= hi, "
                              f"got {self.train_max_length!r}")
        if self.train_budget_fraction and (
                len(self.train_budget_fraction) != 2 or
                not 0 < self.train_budget_fraction[0] <= self.train_budget_fraction[1] <= 1):
            raise ConfigError(f"train_budget_fraction: expected [] or [lo, hi] with "
                              f"0 < lo <= hi <= 1, got {self.train_budget_fraction!r}")
        if self.train_budget_fraction and self.train_max_length:
            raise ConfigError("train_budget_fraction and train_max_length: set one of them "
                              "(both choose Stage 3's training budget)")
        if not 0.0 <= self.false_positive_prob <= 1.0:
            raise ConfigError(f"false_positive_prob: expected in [0, 1], "
                              f"got {self.false_positive_prob!r}")
        if any(not isinstance(v, int) or v < 1 for v in self.eval_max_lengths):
            raise ConfigError(f"eval_max_lengths: expected ints >= 1, got {self.eval_max_lengths!r}")
        if len(self.fragment_windows) != 2 or min(self.fragment_windows) < 1:
            raise ConfigError(f"fragment_windows: expected [s1, s0], got "
                              f"{self.fragment_windows!r}")
        if self.dropout != 0.0:
            raise ConfigError("dropout: the paper trains with dropout 0.0 and the routing plan "
                              "must not depend on dropout; set it to 0.0")

    def check_files(self, model: bool = True) -> "TrainConfig":
        """Every file the run reads exists (``model``: also the model argument, resolved
        without loading); ``ConfigError`` naming the key. Run before the model loads."""
        if not self.train_data:
            raise ConfigError("train_data: the stage config names no training JSONL; set it "
                              "with --set train_data=PATH")
        for k in ("train_data", "eval_data", "routers"):
            v = getattr(self, k)
            if v and not os.path.isfile(v):
                raise ConfigError(f"{k}: no such file {v!r} (fix the path in the config or "
                                  f"--set {k}=PATH)")
        if model:
            from vr_runtime.backbones import resolve_model
            from vr_runtime.errors import ModelFilesError
            try:
                resolve_model(self.model)
            except ModelFilesError as e:
                raise ConfigError(f"model: {e}") from None
        return self

    @property
    def trainable_groups(self) -> List[str]:
        flags = {"vision": self.freeze_vision_model, "projector": self.freeze_mlp,
                 "language": self.freeze_language_model,
                 "extractor": self.freeze_feature_extractor,
                 "semantic": self.freeze_Semantic_Router, "image": self.freeze_Image_Router}
        return [g for g, frozen in flags.items() if not frozen]

    def to_dict(self) -> dict:
        """The config as its file says it: each extension's options as a section."""
        d = dataclasses.asdict(self)
        d.update(d.pop("extensions"))
        return d


def _check_extensions(cfg) -> None:
    """Each section's options: a registered extension's, of the right type and range; one
    section at most (a stage trains one curriculum)."""
    if len(cfg.extensions) > 1:
        raise ConfigError(f"{', '.join(sorted(cfg.extensions))}: one curriculum section at "
                          f"most; keep one")
    for name, options in cfg.extensions.items():
        ext = EXTENSIONS.get(name)
        if ext is None or not isinstance(options, ext.options):
            raise ConfigError(f"{name}: not the options of a registered curriculum "
                              f"({_registered()})")
        try:
            _check_types(options)
            options.validate()
        except ConfigError as e:
            raise ConfigError(f"{name}.{e}") from None


def _registered() -> str:
    return "registered: " + (", ".join(sorted(EXTENSIONS)) or "none") + \
        "; the package that defines one registers it when imported"


# Trackers the loop passes to accelerate (others are not installed with the project).
TRACKERS = ("tensorboard",)


def _type_ok(value, hint) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:   # Optional[X]
        return any(_type_ok(value, a) for a in args)
    if origin in (list, List):
        return isinstance(value, list) and all(_type_ok(v, args[0]) for v in value)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:   # JSON's true/false are not numbers here
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and math.isfinite(value))
    return isinstance(value, hint)


def _describe(hint) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        return " or ".join(_describe(a) for a in args)
    if origin in (list, List):
        return f"a list of {_describe(args[0]).split(' ', 1)[1]}s"
    return {int: "an int", float: "a finite number", bool: "a bool (true/false)",
            str: "a string", type(None): "a null"}.get(hint, f"a {hint.__name__}")


def _check_types(cfg) -> None:
    """Each field against its annotation, so that a string where a number belongs (``--set
    learning_rate=abc``) is named here rather than failing inside the optimizer."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        if f.name == "extensions":   # sections: each checked against its own options
            continue
        v = getattr(cfg, f.name)
        if not _type_ok(v, hints[f.name]):
            raise ConfigError(f"{f.name}: expected {_describe(hints[f.name])}, got {v!r}")


def load_config(path_or_name: str, **overrides) -> TrainConfig:
    """A JSON file, or a name: the paper's ``stage1``..``stage3``, or a config in a registered
    curriculum's folder (``curriculum.Extension.configs``). ``overrides``: keys to set; a
    section's as ``name.key`` or ``name={key: value}`` (merged into the file's section)."""
    p = config_path(path_or_name)
    return TrainConfig(**config_fields(p, TrainConfig, overrides)).validate()


def config_path(path_or_name) -> pathlib.Path:
    """A config file, found as given or by its name (``stage1``: ``train_stage1.json``)."""
    p = pathlib.Path(path_or_name)
    if p.is_file():
        return p
    folders = [(CONFIG_DIR, f"train_{path_or_name}.json")] + \
        [(pathlib.Path(e.configs), f"{path_or_name}.json") for e in EXTENSIONS.values()
         if e.configs]
    for folder, name in folders:
        if (folder / name).is_file():
            return folder / name
    names = ["stage1", "stage2", "stage3"] + sorted(
        q.stem for folder, _ in folders[1:] for q in folder.glob("*.json"))
    raise ConfigError(f"config: {str(path_or_name)!r} is neither a file nor one of "
                      f"{', '.join(names)}")


def read_config_file(path) -> dict:
    """The keys of a JSON config file, ``_comment``-style keys dropped; ``ConfigError`` for a
    file that is not a JSON object."""
    p = pathlib.Path(path)
    try:
        raw = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: unreadable ({e})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: expected a JSON object of key: value, got a "
                          f"{type(raw).__name__}")
    return {k: v for k, v in raw.items() if not k.startswith("_")}  # "_comment" keys


def _check_known(d: dict, known, where: str) -> None:
    unknown = sorted(set(d) - set(known))
    if unknown:
        near = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConfigError(f"{where}: unknown keys {unknown}{hint}; known keys: "
                          f"{sorted(known)}")


def config_fields(path, cls, overrides: dict) -> dict:
    """The keys of a JSON config file updated by ``overrides``, checked against the fields of
    dataclass ``cls``; ``ConfigError`` otherwise. For a ``TrainConfig``, each extension's
    section becomes its options, under ``extensions``."""
    raw = read_config_file(path)
    known = {f.name for f in dataclasses.fields(cls)} - {"extensions"}
    sections = {}
    if cls is TrainConfig:
        raw, sections = _sections(raw, str(path))
        overrides, more = _sections(overrides, "--set")
        for name, d in more.items():
            sections[name] = {**sections.get(name, {}), **d}
    for where, d in (("--set", overrides), (str(path), raw)):
        stray = [k for k, v in d.items() if isinstance(v, dict) and k not in known]
        if stray and cls is TrainConfig:
            raise ConfigError(f"{where}: {stray[0]}: a section of no registered curriculum "
                              f"({_registered()})")
        _check_known(d, known, where)
    raw.update(overrides)
    if sections:
        raw["extensions"] = {n: _options(n, d, str(path)) for n, d in sections.items()}
    return raw


def _sections(d: dict, where: str):
    """``d`` without its extension sections (``name: {...}`` or ``name.key``), and those
    sections; a key of a section at the top level is refused in one line naming its place."""
    flat, sections = {}, {}
    for k, v in d.items():
        name, dot, key = k.partition(".")
        if dot or k in EXTENSIONS:
            if name not in EXTENSIONS:
                raise ConfigError(f"{where}: {name}: no such section ({_registered()})")
            if not dot and not isinstance(v, dict):
                raise ConfigError(f"{where}: {name}: expected a section {{key: value}}, got "
                                  f"{v!r}")
            sections.setdefault(name, {}).update({key: v} if dot else v)
            continue
        moved = next((e.name for e in EXTENSIONS.values() if k in e.fields()), None)
        if moved:
            how = f"--set {moved}.{k}=VALUE" if where == "--set" else \
                f"put it in the \"{moved}\" section of {where}"
            raise ConfigError(f"{k} moved to {moved}.{k}: {how}")
        flat[k] = v
    return flat, sections


def _options(name: str, d: dict, where: str):
    ext = EXTENSIONS[name]
    _check_known(d, ext.fields(), f"{where}: {name}")
    return ext.options(**d)
