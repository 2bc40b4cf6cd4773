"""lmms-eval plugin: the ``videorouter`` model (lmms-eval 0.7.x).

Registered through lmms-eval's entry point group ``lmms_eval.models`` (pyproject.toml)::

    [project.entry-points."lmms_eval.models"]
    videorouter = "vr_runtime.eval.lmms_plugin:manifest"

so, with ``pip install 'videorouter[lmms]'`` (docs/evaluation.md gives the install that keeps the
CPU torch) and the shipped Video-MME task written for a local copy
(:mod:`vr_runtime.eval.lmms_tasks`)::

    python -m vr_runtime.eval.lmms_tasks --data DATA --videos VIDEOS --out videomme_task
    python -m lmms_eval --model videorouter \\
        --model_args pretrained=PATH,routers=PATH,policy=auto,max_length=12288 \\
        --tasks videorouter_videomme --include_path videomme_task --batch_size 1

Model arguments: ``pretrained`` (a local InternVL3-*-hf / Qwen2.5-VL directory, a Hugging Face
id in the local cache, or ``tiny``),
``routers``, ``policy`` (any ``VideoRouter.answer`` policy), ``max_length``, ``num_frames``
(64), ``budget`` (a fixed B_img instead of one derived from ``max_length``), ``clip`` (a local
CLIP dir: CLIP relevance pooling) with ``clip_mode`` (``matched``, the default: as many frames
at s_1 as the Image Router marks relevant, as eval's ``clip`` and the paper's Table 2; ``fill``:
top CLIP frames until the budget is full, eval's ``clip-fill``), ``device``, ``dtype``, ``max_new_tokens`` (default: the
task's), ``scales`` (s_g:s_1:s_0 such as ``4:1:8``, or ``auto``: as ``--scales``, written with
colons because model arguments are split at commas), ``visual_tokens_log`` (a JSONL file: one line per sample with the visual tokens, the
policy and the per-frame ``windows``). Every sample's visual tokens are also logged (INFO) and its prompt
and generated token counts are returned to lmms-eval as ``TokenCounts``.

The routers read the bare question (the task document's ``question`` field when it has one),
the LLM the task's full prompt -- the same split as ``videorouter eval``.
"""
from __future__ import annotations


def manifest():
    """The entry point's payload (imported by lmms-eval's registry; keep it light)."""
    from lmms_eval.models.registry_v2 import ModelManifest
    return ModelManifest(model_id="videorouter",
                         chat_class_path="vr_runtime.eval.lmms_model.VideoRouterLMM")
