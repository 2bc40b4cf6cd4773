"""Accuracy evaluation (docs/CONTRACT.md section 5): benchmark readers, multiple-choice prompting, the
paper's methods as a registry, a data-parallel runner and the paper-style tables.
``python -m vr_runtime.eval`` = ``videorouter eval``; the lmms-eval plugin is
``vr_runtime.eval.lmms_plugin``."""
from .benchmarks import BenchmarkError, Question, load_benchmark
from .methods import METHODS, Method, register_method
from .prompting import PromptConfig, extract_answer, mc_prompt

__all__ = ["BenchmarkError", "Question", "load_benchmark", "METHODS", "Method",
           "register_method", "PromptConfig", "extract_answer", "mc_prompt"]
