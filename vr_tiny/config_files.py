"""The configs of the tiny room's own tools (Stage 0, the labeller): a dataclass from a JSON
file or a name in ``vr_tiny/configs``, read and checked by the trainer's config loader."""
from __future__ import annotations

import pathlib

from vr_runtime.training.config import ConfigError, config_fields

CONFIGS = pathlib.Path(__file__).resolve().parent / "configs"


def load_named_config(cls, name_or_path: str, what: str, overrides: dict):
    """A dataclass config from a JSON file or a name in ``vr_tiny/configs`` (``windows``, when
    the class has it, as a tuple of ints); ``ConfigError`` on a missing file or an unknown key.
    ``what`` names the config in the error ("stage 0 config")."""
    path = pathlib.Path(name_or_path)
    if not path.is_file():
        path = CONFIGS / f"{name_or_path}.json"
        if not path.is_file():
            raise ConfigError(f"{what} {name_or_path!r}: neither a file nor a name in {CONFIGS}")
    d = config_fields(path, cls, overrides)
    if "windows" in d:
        d["windows"] = tuple(int(w) for w in d["windows"])
    return cls(**d)
