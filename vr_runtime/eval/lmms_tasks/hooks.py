"""The ``doc_to_*`` hooks of the shipped lmms-eval tasks. A document is one line of the task's
``videomme.jsonl`` as :func:`vr_runtime.eval.lmms_tasks.write_videomme_task` writes it:
``question_id``, ``video`` (an absolute path, checked when the task was written),
``question``, ``options`` (texts without letters), ``answer`` (letter), ``answer_mode``,
``duration``, ``domain``, ``task_type``.

Prompt and scoring are those of ``videorouter eval`` (:mod:`vr_runtime.eval.prompting`): the
LLM reads the question with lettered options and the task's post prompt, the routers read the
bare ``question`` (the plugin passes the document's ``question`` field as ``router_question``).
"""
from __future__ import annotations

from ..prompting import PromptConfig, extract_answer, mc_prompt


def doc_to_visual(doc):
    return [doc["video"]]


def doc_to_text(doc, lmms_eval_specific_kwargs=None):
    kw = lmms_eval_specific_kwargs or {}
    cfg = PromptConfig(kw.get("pre_prompt", ""), kw.get("post_prompt", ""))
    return mc_prompt(doc["question"], doc["options"], cfg)


def process_results(doc, results):
    pred = extract_answer(results[0] if results else "", doc["options"],
                          doc.get("answer_mode") or "letter")
    return {"accuracy": float(pred == doc["answer"]), "answered": float(pred is not None)}


__all__ = ["doc_to_visual", "doc_to_text", "process_results"]
