"""doc_to_* for the local synthetic Video-MME-layout task (videos under __VIDEOS__)."""
import os

from vr_runtime.eval.benchmarks import split_options
from vr_runtime.eval.prompting import PromptConfig, extract_answer, mc_prompt

VIDEOS = "__VIDEOS__"


def doc_to_visual(doc):
    return [os.path.join(VIDEOS, doc["videoID"] + ".mp4")]


def doc_to_text(doc, lmms_eval_specific_kwargs=None):
    kw = lmms_eval_specific_kwargs or {}
    cfg = PromptConfig(kw.get("pre_prompt", ""), kw.get("post_prompt", ""))
    return mc_prompt(doc["question"], split_options(doc["options"]), cfg)


def process_results(doc, results):
    # The tiny model answers with the option's text ("circle"): option-text scoring.
    pred = extract_answer(results[0], split_options(doc["options"]), "option-text")
    return {"accuracy": float(pred == doc["answer"])}
