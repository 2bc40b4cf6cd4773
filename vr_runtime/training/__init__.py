"""Three-stage VideoRouter curriculum (paper Sec. 4.2), its data formats and label construction.

Entry point: ``python -m vr_runtime.training --help``. Importing this package is light; the
model stack loads when a stage runs. A curriculum beyond the paper's plugs into Stage 3 through
``curriculum.py`` (the tiny model's: the package ``vr_tiny``, which this one never imports).
"""
from .config import ConfigError, TrainConfig, load_config
from .data import DataFormatError, Example, read_jsonl
from .policy_labels import policy_labels

__all__ = ["TrainConfig", "load_config", "ConfigError", "DataFormatError", "Example",
           "read_jsonl", "policy_labels"]
