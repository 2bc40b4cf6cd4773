"""The lmms-eval chat model behind the ``videorouter`` plugin (see ``lmms_plugin``).

Imports lmms-eval at module level: only lmms-eval imports this module (``pip install
'videorouter[lmms]'``)."""
from __future__ import annotations

import json
from typing import List, Optional, Tuple

import torch
from accelerate import PartialState
from lmms_eval.api.instance import GenerationResult, Instance, TokenCounts
from lmms_eval.api.model import lmms
from lmms_eval.protocol import ChatMessages
from loguru import logger as eval_logger
from tqdm import tqdm

from ..backbones.devices import resolve_device, resolve_dtype
from ..errors import expected_one_of
from ..planning.policies import policy_names
from ..planning.scales import parse_scales
from ..request import AnswerOptions
from ..routing.scorers import CLIPScorer, TokenMatchedScorer
from ..runtime import VideoRouter
from ..video.sampling import MAX_FRAMES, MIN_FRAMES, NUM_FRAMES

_TRUE = ("1", "true", "yes")


def _opt_int(v) -> Optional[int]:
    return None if v in (None, "", "None", "none") else int(v)


# clip=PATH's protocol (model_args clip_mode=): "matched" = eval's `clip` (token-matched to the
# Image Router, the paper's Table 2), "fill" = eval's `clip-fill` (fills the budget).
CLIP_MODES = ("matched", "fill")


class VideoRouterLMM(lmms):
    is_simple = False

    def __init__(self, pretrained: str = "tiny", routers: Optional[str] = None,
                 policy: str = "auto", max_length=12288, num_frames=NUM_FRAMES, budget=None,
                 clip: Optional[str] = None, device: Optional[str] = None,
                 dtype: Optional[str] = None, max_new_tokens=None, batch_size=1,
                 visual_tokens_log: Optional[str] = None, scales=None, clip_mode: str = "matched",
                 allow_over_length=False, seek: str = "exact", time_window=None,
                 fps=None, max_frames=MAX_FRAMES, min_frames=MIN_FRAMES, **kwargs) -> None:
        super().__init__()
        if kwargs:
            eval_logger.warning(f"videorouter: ignoring unknown model_args {sorted(kwargs)}")
        if int(batch_size) != 1:
            raise ValueError(f"videorouter: batch_size must be 1 (one video per prefill), got "
                             f"{batch_size}")
        if policy not in policy_names():
            raise ValueError(f"videorouter: policy {policy!r}: "
                             f"{expected_one_of(policy, policy_names())}")
        if clip_mode not in CLIP_MODES:
            raise ValueError(f"videorouter: clip_mode {clip_mode!r}: expected one of "
                             f"{', '.join(CLIP_MODES)} (matched: as many frames at s1 as the "
                             f"Image Router marks relevant, the paper's protocol; fill: top CLIP "
                             f"frames until the budget is full)")
        # model_args are split at commas, so scales are written 4:1:8 (or "auto")
        self.scales = parse_scales(scales, "videorouter: scales")
        if seek not in ("exact", "keyframe"):
            raise ValueError(f"videorouter: seek {seek!r}: expected exact or keyframe")
        self.seek = seek
        self.time_window = _time_window(time_window)
        dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
        state = PartialState(cpu=dev == "cpu")
        self._rank, self._world_size = state.process_index, state.num_processes
        if dev == "cuda" and state.num_processes > 1:
            dev = f"cuda:{state.local_process_index}"
        dev = resolve_device(dev)
        self.vr = VideoRouter.from_pretrained(pretrained, routers=routers, device=dev,
                                              dtype=resolve_dtype(dtype, dev),
                                              visual_cache_size=1)
        self.policy = policy
        self.max_length = int(max_length)
        self.num_frames = int(num_frames)
        # fps (model_args fps=2,max_frames=768): sample by rate, as Qwen's processors do
        self.fps = None if fps in (None, "", "None") else float(fps)
        self.max_frames, self.min_frames = int(max_frames), int(min_frames)
        self.budget = _opt_int(budget)
        self.max_new_tokens = _opt_int(max_new_tokens)
        # model_args arrive as strings: allow_over_length=True lets dense pass max_length
        self.allow_over_length = str(allow_over_length).strip().lower() in ("1", "true", "yes")
        self.scorer = None
        if clip:   # as `videorouter eval`'s clip / clip-fill methods
            inner = CLIPScorer.from_pretrained(clip, device=dev)
            self.scorer = TokenMatchedScorer(inner) if clip_mode == "matched" else inner
        self.visual_tokens_log = visual_tokens_log
        self.batch_size_per_gpu = 1
        self._device = dev

    # -- lmms properties
    @property
    def batch_size(self):
        return self.batch_size_per_gpu

    @property
    def device(self):
        return self._device

    @property
    def rank(self):
        return self._rank

    @property
    def world_size(self):
        return self._world_size

    # -- requests
    @staticmethod
    def _text_and_video(messages: ChatMessages) -> Tuple[str, Optional[str]]:
        images, videos, _ = messages.extract_media()
        if images:
            raise ValueError("videorouter: image inputs are not supported (video QA only)")
        if len(videos) != 1:
            raise ValueError(f"videorouter: expected exactly one video per sample, got "
                             f"{len(videos)}")
        parts = [c.text for m in messages.messages if m.role == "user" for c in m.content
                 if c.type == "text"]
        return "\n".join(p for p in parts if p), str(videos[0])

    def _respond(self, doc: dict, messages: ChatMessages, gen_kwargs: dict):
        """The model's answer (a ``VideoRouter`` result) to one lmms-eval request."""
        text, video = self._text_and_video(messages)
        bare = doc.get("question") if isinstance(doc, dict) else None
        max_new = self.max_new_tokens or int(gen_kwargs.get("max_new_tokens", 16) or 16)
        opts = AnswerOptions(num_frames=self.num_frames, max_length=self.max_length,
                             max_new_tokens=max_new, policy=self.policy, budget=self.budget,
                             cache_visual=True, scorer=self.scorer,
                             allow_over_length=self.allow_over_length,
                             seek=self.seek, time_window=self.time_window, fps=self.fps,
                             max_frames=self.max_frames, min_frames=self.min_frames,
                             router_question=bare if isinstance(bare, str) and bare.strip()
                             else None, scales=self.scales)
        return self.vr.answer(video, text, options=opts)

    def generate_until(self, requests: List[Instance]) -> List[GenerationResult]:
        out: List[GenerationResult] = []
        log = open(self.visual_tokens_log, "a") if self.visual_tokens_log else None
        try:
            for req in tqdm(requests, disable=self.rank != 0, desc="VideoRouter"):
                ctx, doc_to_messages, gen_kwargs, doc_id, task, split = req.args
                doc = self.task_dict[task][split][doc_id]
                messages = ChatMessages(messages=doc_to_messages(doc))
                res = self._respond(doc, messages, dict(gen_kwargs or {}))
                r = res.report
                until = (gen_kwargs or {}).get("until") or []
                text = res.text
                for stop in ([until] if isinstance(until, str) else until):
                    if stop:
                        text = text.split(stop)[0]
                rec = {"task": task, "doc_id": doc_id, "policy": r["policy"],
                       "visual_tokens": r["visual_tokens"],
                       "dense_visual_tokens": r["dense_visual_tokens"], "budget": r["budget"],
                       "frames": len(r["frame_indices"]),
                       "windows": [w if isinstance(w, int) else list(w) for w in r["windows"]],
                       "ttft_s": r["timings_s"].get("ttft")}
                eval_logger.info(f"videorouter sample {task}/{doc_id}: visual_tokens="
                                 f"{r['visual_tokens']} policy={r['policy']} "
                                 f"budget={r['budget']}")
                if log is not None:
                    log.write(json.dumps(rec) + "\n")
                    log.flush()
                out.append(GenerationResult(text=text, token_counts=TokenCounts(
                    input_tokens=int(r["prompt_tokens"]),
                    output_tokens=int(r["generated_tokens"]))))
        finally:
            if log is not None:
                log.close()
        return out

    def loglikelihood(self, requests) -> List[Tuple[float, bool]]:
        raise NotImplementedError("videorouter: loglikelihood is not supported; use "
                                  "generate_until tasks (multiple-choice video QA)")

    def generate_until_multi_round(self, requests) -> List[str]:
        raise NotImplementedError("videorouter: multi-round generation is not supported")


__all__ = ["VideoRouterLMM"]


def _time_window(v) -> Optional[tuple]:
    """model_args' ``time_window=START:END`` (seconds; commas split model_args), or a pair."""
    if v is None or v == "":
        return None
    try:
        start, end = (float(x) for x in (v.split(":") if isinstance(v, str) else v))
        if 0 <= start < end < float("inf"):
            return (start, end)
    except (TypeError, ValueError):
        pass
    raise ValueError(f"videorouter: time_window {v!r}: expected START:END in seconds with "
                     f"0 <= START < END")
