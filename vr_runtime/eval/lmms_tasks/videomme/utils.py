"""lmms-eval hooks of the ``videorouter_videomme`` task (copied into the task folder by
``python -m vr_runtime.eval.lmms_tasks``; the code lives in the installed package)."""
from vr_runtime.eval.lmms_tasks.hooks import doc_to_text, doc_to_visual, process_results  # noqa: F401
