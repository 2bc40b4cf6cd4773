"""``VideoRouter.answer_batch``: several videos, every stage before the prefill per video, then
one ``pool_pack`` of every request's kept frames, one batched prefill and the decode steps of all
prompts together (right-padded; each answer the one it gets alone: vr_runtime.generate)."""
from __future__ import annotations

import dataclasses
import pathlib
from typing import List, Sequence

from ..reconstruct import reconstruct_embeds_batch
from ..request import AnswerOptions
from ..telemetry.timing import StageTimer
from .prepared import Prepared
from ..video.frames import FileSource
from .inputs import open_source


def batch_options(videos: list, questions, options, kwargs: dict):
    """The questions and options, one per video, every one checked before any decoding starts
    -> (questions, AnswerOptions)."""
    qs = [questions] * len(videos) if isinstance(questions, str) else list(questions)
    if len(qs) != len(videos):
        raise ValueError(f"questions: expected 1 or {len(videos)} questions, got {len(qs)}")
    if options is None or isinstance(options, AnswerOptions):
        per = [options] * len(videos)
    else:
        per = list(options)
        if len(per) != len(videos):
            raise ValueError(f"options: expected {len(videos)} dicts (one per video), got "
                             f"{len(per)}")
    if kwargs and any(isinstance(o, AnswerOptions) for o in per):
        raise ValueError(f"options: give AnswerOptions or keywords, not both (got "
                         f"{', '.join(sorted(kwargs))} besides options=)")
    return qs, [o if isinstance(o, AnswerOptions) else AnswerOptions(**{**kwargs, **(o or {})})
                for o in per]


def prepare_each(vr, videos: list, qs: list, opts: list, batch_prefill: bool) -> list:
    """Every stage before the prefill for each video in turn (``batch_prefill``; else the
    whole answer). Every video file is opened (checked, indexed, sampled) before the first is
    answered, so a bad file fails the batch before any model work; each one's frames then
    stream through the tower in its turn."""
    sources = [open_source(vr.lm, v, o.sampling)
               if isinstance(v, (str, pathlib.Path)) and o.fps is None else v
               for v, o in zip(videos, opts)]
    done: list = []
    for src, q, o in zip(sources, qs, opts):
        if isinstance(src, FileSource) and o.fps is None:   # its window applied when opened
            o = dataclasses.replace(o, time_window=None)
        done.append(vr.prepare(vr.request(src, q, o), pack=False) if batch_prefill
                    else vr.answer(src, q, o))
    return done


def pack_batch(lm, done: Sequence[Prepared]):
    """One ``pool_pack`` for the whole batch: every request's kept frames pooled into one
    right-padded [B, L, D] inputs_embeds -> (embeds, lengths). Each request's Z is dropped as
    soon as it is packed."""
    packs = [p.packing for p in done]
    for p in done:
        p.packing = None
    return reconstruct_embeds_batch(lm.model, [p.ids for p in done], [k.Z for k in packs],
                                    [k.z_plan for k in packs], lm.image_token_id, lm.grid,
                                    [k.starts for k in packs])


def generate_batch(vr, done: List[Prepared]) -> list:
    """One pool_pack, one prefill and the decode steps of the prepared requests together; each
    report's compress, prefill and generate times are the batch's."""
    timer = StageTimer(vr.lm.device)
    with timer.stage("compress"):   # one pool_pack: every request's frames, one buffer
        embeds, lengths = pack_batch(vr.lm, done)
    gens = vr.greedy.generate(embeds, [p.req.max_new_tokens for p in done],
                              [p.position_ids for p in done], vr.stop_ids, timer,
                              lengths=lengths)
    del embeds
    for p in done:
        for stage in ("compress", "prefill", "generate"):
            p.timer.add(stage, timer.get(stage))
        p.timer.ended["prefill"] = timer.ended.get("prefill")   # the batch's first tokens
        if len(done) > 1:
            p.notes.append(f"packed (one pool_pack), prefilled and decoded in one batch of "
                           f"{len(done)} requests: compress's pooling, prefill and generate "
                           f"are the batch's times")
    return [vr.finish(p, g, len(done)) for p, g in zip(done, gens)]


__all__ = ["batch_options", "prepare_each", "pack_batch", "generate_batch"]
