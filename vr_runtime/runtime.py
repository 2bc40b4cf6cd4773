"""VideoRouter: the inference path of the paper (Sections 3.1-3.2, Algorithm 1) over a backbone.

``answer`` is a list of stages with small typed results between them::

    request   AnswerOptions (vr_runtime.request) -> Request: every argument checked once (and
              the budget: it depends only on the question and T)
    frames    load_frames: sample + decode + preprocess T frames -> Frames (not part of TTFT,
              as in the paper)
    policy    the Semantic Router on the question (``auto``) -> PolicyDecision
    vision    frozen vision tower + projector -> Z [T, H*W, D]
    score     a FrameScorer (Image Router, cached, fixed, CLIP) -> FrameScores
    plan      the policy's planner, fitted exactly into max_length -> FittedPlan
    compress  the prompt with per-frame placeholder counts, pool_pack into inputs_embeds
    prefill   one decoder pass (last-row logits, KV cache)       TTFT = vision + router +
    generate  greedy decoding with the cache                            compress + prefill
    report    report.build_report (+ latency.latency_report with ttft_budget_s)

When the plan does not depend on Z (every policy but ``fragment``), it is made before the vision
stage and only the frames it keeps are encoded. The latency budget lives in
:mod:`vr_runtime.planning.latency`, option scoring (labels, evaluation) in
:mod:`vr_runtime.eval.option_scoring`: this class is the inference path alone. Everything
specific to a model family (frame spec, vision, prompt layout, positions, decoder) is behind
``self.lm``, a :class:`~vr_runtime.backbones.Backbone`.

Untrained routers (no weights given, none shipped): ``auto`` does not pretend to route -- it falls
back to :data:`~vr_runtime.planning.policies.UNTRAINED_AUTO_POLICY` and the report says so.
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
import pathlib
import time
import warnings
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch

import vr_kernels
from vr_kernels import pooled_counts

from .backbones import Backbone, backbone_from_config, load_backbone
from .backbones.tiny import ASSETS
from .errors import VideoError
from .generate import GreedyDecoder, PrefixCache
from .planning import budget
from .planning.latency import LatencyState, fit_latency, latency_report
from .planning.policies import (AUTO, SEMANTIC_CLASSES, UNTRAINED_AUTO_POLICY, FittedPlan,
                                get_planner, is_budgeted, kept_frames, plan_fitted,
                                policy_from_logits, policy_names)
from .reconstruct import reconstruct_embeds, reconstruct_embeds_batch
from .report import build_report, dropped_note, json_window
from .request import AnswerOptions, Request
from .routing.routers import RouterConfig, Routers, embed_question
from .routing.scorers import FixedRelevance, FrameScores, ScoringInput
from .telemetry.timing import StageTimer
from .video import frames as video_frames   # looked up per call: tests swap its functions
from .video.frames import FileSource, Frames, FrameSource, TensorSource

POLICIES = policy_names()  # the built-in ones; register_planner adds more at run time


@dataclass
class Answer:
    text: str
    report: dict = field(default_factory=dict)


@dataclass
class _Prepared:
    """One request after every stage before the prefill (``answer`` / ``answer_batch``)."""
    req: Request
    timer: StageTimer
    frames: Frames
    decision: "PolicyDecision"
    planner: object
    scores: Optional[FrameScores]
    fitted: FittedPlan
    ids: torch.Tensor
    embeds: Optional[torch.Tensor]
    position_ids: Optional[torch.Tensor]
    notes: list
    hit: bool
    # answer_batch: (Z of the kept frames, their windows, first rows) until the one pool_pack
    # of the whole batch; None after it (no Z outlives the packing)
    packing: Optional[tuple] = None
    # prefix_cache: (PrefixCache of the visual prefix, "hit" | "miss")
    prefix: Optional[tuple] = None


@dataclass(frozen=True)
class PolicyDecision:
    policy: str                    # the planner that runs
    probability: Optional[float]   # the Semantic Router's confidence, when it decided
    notes: tuple = ()


class VideoRouter:
    def __init__(self, lm: Backbone, routers: Optional[Routers] = None,
                 visual_cache_size: int = 1, warmup_frames: int = 256, decoding: str = "auto",
                 warm_request: Optional[bool] = None, prefix_cache: bool = False):
        """``decoding``: how tokens after the first are generated (vr_runtime.generate): "auto"
        (the eager dynamic cache; "graph", CUDA graphs over a static KV cache, is opt-in until
        measured on a GPU), "dynamic", "static" or "graph" -- the same greedy tokens in every mode.
        ``warm_request``: answer one throw-away request at load (:meth:`warm_up_request`);
        None = on CUDA only, where the first request otherwise pays for lazy module loading.
        ``prefix_cache``: with ``cache_visual``, keep the KV cache of the prompt up to the end of
        its visual tokens in the video's cache entry, and prefill only the rest for a later
        question with the same plan and the same prompt up to there (the question comes after
        the frames in the chat template). The same tokens (tests); the entry costs the
        prefix's KV memory while the video stays cached. Off by default: a TTFT measured with
        it is an amortised one."""
        self.lm = lm
        self.prefix_cache = bool(prefix_cache)
        self.greedy = GreedyDecoder(lm, decoding)   # checks ``decoding`` before any warm-up
        # Compile and autotune the pool_pack kernels now (CUDA; a no-op on CPU), for up to
        # ``warmup_frames`` frames, so that no request pays for compilation (0: skip).
        self.kernel_warmup = vr_kernels.warmup(lm.hidden_size, lm.dtype, lm.device, lm.grid,
                                               max_frames=warmup_frames) if warmup_frames else \
            {"skipped": "warmup_frames=0"}
        self.routers = routers if routers is not None else Routers.from_backbone(lm)
        self.routers.eval()
        self._last_question_emb: Optional[tuple] = None   # (question, Emb(q)): question_embeddings
        self._stop_ids = lm.stop_token_ids()
        # cache_visual: question-independent state of the last videos (LRU).
        self.visual_cache_size = int(visual_cache_size)
        self._vcache: "collections.OrderedDict[tuple, dict]" = collections.OrderedDict()
        # ttft_budget_s: the cost model of this backbone on this device, built (and probed) on
        # the first request that asks, then corrected by every answer (planning.latency)
        self.latency = LatencyState()
        if warm_request is None:
            warm_request = torch.device(lm.device).type == "cuda"
        self.request_warmup = self.warm_up_request() if warm_request else \
            {"skipped": "warm_request is off (the default off CUDA)"}

    @torch.inference_mode()
    def warm_up_request(self, num_frames: int = 8, max_new_tokens: int = 2) -> dict:
        """Answer one throw-away question on random frames, through every stage a request runs
        (vision, both routers, pool_pack, prefill, decode steps), then forget it (the visual
        cache is cleared). What the kernel warm-up cannot reach -- CUDA's lazy module loading,
        the GEMM and attention kernel choices at these shapes, the shadow stack's first call,
        the decoder's first steps -- is then paid at load, not by the first user (the measured
        cold start: 1.9 s of router stage in a fresh process). -> {"seconds", "frames"}."""
        spec = self.lm.frame_spec
        frames = torch.randn(num_frames, 3, *spec.size, generator=torch.Generator().manual_seed(0))
        relevant = [t % 2 == 0 for t in range(num_frames)]   # both windows of the Fragment plan
        dev = torch.device(self.lm.device)
        t0 = time.perf_counter()
        self.answer(frames, "What happens in the video?", num_frames=num_frames,
                    max_new_tokens=max_new_tokens, policy="fragment",
                    scorer=FixedRelevance(relevant, run_routers=True))
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        self.clear_visual_cache()
        return {"seconds": round(time.perf_counter() - t0, 6), "frames": num_frames,
                "max_new_tokens": max_new_tokens}

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(cls, path_or_name="tiny", routers=None, device="cpu", dtype=None,
                        attn_implementation=None, router_config: Optional[RouterConfig] = None,
                        **kw):
        """``path_or_name``: a local InternVL3-*-hf / Qwen2.5-VL-*-Instruct directory or a preset
        (``tiny``, ``tiny-qwen2.5-vl``). ``routers``: a safetensors path, a :class:`Routers`, or
        None; for ``"tiny"`` with None the shipped ``assets/tiny/routers.safetensors`` loads."""
        lm = load_backbone(path_or_name, device=device, dtype=dtype,
                           attn_implementation=attn_implementation)
        if routers is None and str(path_or_name) == "tiny":
            shipped = ASSETS / "routers.safetensors"
            if shipped.is_file():
                routers = shipped
        return cls(lm, cls._routers_for(lm, routers, router_config), **kw)

    @classmethod
    def from_config(cls, config, device="cpu", dtype=None, seed: int = 0, routers=None,
                    attn_implementation=None, router_config: Optional[RouterConfig] = None, **kw):
        """Random weights of a shape preset (``vr_runtime.backbones.backbone_from_config``)."""
        lm = backbone_from_config(config, device=device, dtype=dtype, seed=seed,
                                  attn_implementation=attn_implementation)
        return cls(lm, cls._routers_for(lm, routers, router_config), **kw)

    @staticmethod
    def _routers_for(lm, routers, router_config):
        if isinstance(routers, Routers):
            routers.positions = lm.router_position_ids
            return routers.to_model(lm.device, lm.dtype)
        if routers is not None:
            return Routers.load(pathlib.Path(routers), lm)  # built on the model's device/dtype
        return Routers.from_backbone(lm, router_config)

    @property
    def routers_trained(self) -> bool:
        return bool(getattr(self.routers, "trained", False))

    def clear_visual_cache(self) -> None:
        self._vcache.clear()

    def question_embeddings(self, question: str) -> torch.Tensor:
        """Emb(q) [Lq, D]: what both routers read (the bare question, no prompt around it).
        The Semantic Router and the scorer of one answer ask for the same question, so the last
        one is kept: one tokenizer call and one embedding gather an answer, not two."""
        last = self._last_question_emb
        if last is not None and last[0] == question:
            return last[1]
        emb = embed_question(self.lm.model, self.lm.tokenizer, question)
        self._last_question_emb = (question, emb)   # one tuple: a reader sees a whole pair
        return emb

    # ------------------------------------------------------------------ stage: request
    def request(self, video, question, options: Optional[AnswerOptions] = None,
                **kwargs) -> Request:
        """Check a call of :meth:`answer` (before any decoding) -> :class:`Request`.
        ``options`` or ``kwargs`` (the fields of :class:`~vr_runtime.request.AnswerOptions`);
        ``scales="auto"`` is resolved here, on this backbone."""
        if options is None:
            options = AnswerOptions(**kwargs)
        elif kwargs:
            raise ValueError(f"options: give an AnswerOptions or keywords, not both (got "
                             f"{', '.join(sorted(kwargs))} besides options=)")
        elif not isinstance(options, AnswerOptions):
            raise ValueError(f"options: expected a vr_runtime.AnswerOptions, got "
                             f"{type(options).__name__}")
        return Request.build(video, question, options, lm=self.lm)

    def check_budget(self, req: Request, num_frames: int) -> None:
        """The budget depends only on the question and the frame count: refuse a hopeless one
        before decoding (``BudgetError``: one frame's line + one frame at the coarse window must
        fit ``max_length`` with the generation and the margin)."""
        if not is_budgeted(req.policy, req.route_to) or req.budget is not None or num_frames < 1:
            return
        n_text = req.text_tokens(self.lm, num_frames, kept=[0])
        budget.visual_budget(req.max_length, n_text, req.max_new_tokens, req.margin,
                             grid=self.lm.grid, coarsest=req.windows.other_window)

    # ------------------------------------------------------------------ stage: frames
    @staticmethod
    def _video_key(video, num_frames, time_window, decoder="auto", seek="exact") -> tuple:
        """Identity of a video input for ``cache_visual``. Paths: file identity + sampling
        arguments. Tensors and clips: the object itself (held by the cache, so its id cannot be
        reused) and, for tensors, its in-place version counter."""
        if isinstance(video, (str, pathlib.Path)):
            # /proc/self/fd/N (a file the server opened once) resolves to the file itself
            p = pathlib.Path(video).resolve()
            try:
                st = p.stat()
                # device, inode and ctime too: a file rewritten in place keeping its size and
                # mtime (cp -p, rsync -t, tar) is a new key
                ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            except OSError:
                ident = None
            tw = tuple(time_window) if time_window is not None else None
            return ("path", str(p), ident, int(num_frames), tw, decoder, seek)
        key = getattr(video, "source_key", None)
        if key is not None:   # a clip decoded from a file: that file's key (vr_runtime.video.load)
            return ("path",) + tuple(key)
        if isinstance(video, torch.Tensor):
            return ("tensor", id(video), video._version, tuple(video.shape))
        return ("clip", id(video))

    def has_frames(self, video, num_frames: int, time_window=None, decoder="auto",
                   seek="exact") -> bool:
        """Whether the visual cache holds Z of ``video`` (a path) at these settings, so that
        answering it decodes nothing (the server opens the video off the model's lock
        otherwise). A read of the cache only; safe from another thread."""
        st = self._vcache.get(self._video_key(video, num_frames, time_window, decoder, seek))
        return st is not None and "Z" in st

    def video_state(self, req: Request) -> Optional[dict]:
        """The cached per-video state for ``cache_visual`` (a dict, ``{}`` on a miss), or None."""
        if not req.cache_visual:
            return None
        key = self._video_key(req.video, req.num_frames, req.time_window, req.decoder, req.seek)
        obj = None if key[0] == "path" else req.video
        st = self._vcache.get(key)
        if st is not None and st["obj"] is obj:
            self._vcache.move_to_end(key)
            st["hit"] = True
            return st
        st = {"key": key, "obj": obj, "hit": False}
        self._vcache[key] = st
        while len(self._vcache) > max(self.visual_cache_size, 1):
            self._vcache.popitem(last=False)
        return st

    def load_frames(self, req: Request, timer: StageTimer,
                    state: Optional[dict] = None) -> Frames:
        """The request's frames, opened (a file: checked, indexed and sampled, timed as
        "decode"; nothing is decoded before the vision stage streams it), or the video cache's
        (``state``); grouped into the backbone's routing units."""
        if state is not None and "frames" in state:
            f = state["frames"]
            return dataclasses.replace(f, notes=list(f.notes), decode_s=None, open_s=0.0)
        t0 = time.perf_counter()
        with timer.stage("decode"):
            source = self._open_frames(req.video, req.num_frames, req.time_window,
                                       req.decoder, req.seek)
        spec = self.lm.frame_spec
        if tuple(source.size) != tuple(spec.size):
            raise ValueError(f"video: frames are {tuple(source.size)}, the model expects "
                             f"{tuple(spec.size)}")
        if len(source) == 0:
            raise ValueError("video: no frames to answer from")
        notes = []
        if isinstance(req.video, torch.Tensor) and len(source) != req.num_frames:
            notes.append(f"{len(source)} frames were given as a tensor; "
                         f"num_frames={req.num_frames} was not applied")
        frames = Frames.of(source, self.lm.units, notes, time.perf_counter() - t0)
        if state is not None:
            state["frames"] = frames
        return frames

    def decode(self, req: Request, timer: StageTimer, state: Optional[dict] = None) -> Frames:
        """Deprecated: :meth:`load_frames` (the name said video decoding, not generation)."""
        warnings.warn("VideoRouter.decode is now VideoRouter.load_frames; the old name goes in "
                      "the next release", DeprecationWarning, stacklevel=2)
        return self.load_frames(req, timer, state)

    def _decode(self, video, num_frames, time_window, decoder="auto", seek="exact") -> Frames:
        """Deprecated: :meth:`_load_frames`."""
        warnings.warn("VideoRouter._decode is now VideoRouter._load_frames; the old name goes "
                      "in the next release", DeprecationWarning, stacklevel=2)
        return self._load_frames(video, num_frames, time_window, decoder, seek)

    def _load_frames(self, video, num_frames, time_window, decoder="auto",
                     seek="exact") -> Frames:
        """The units of a video input (opened, not decoded: see :meth:`load_frames`)."""
        return Frames.of(self._open_frames(video, num_frames, time_window, decoder, seek),
                         self.lm.units)

    def _open_frames(self, video, num_frames, time_window, decoder="auto",
                     seek="exact") -> FrameSource:
        """A :class:`~vr_runtime.video.frames.FrameSource` of a path (opened: checked, indexed,
        sampled), a FileSource, a [T,3,H,W] tensor, a VideoClip or a Future of one."""
        if isinstance(video, torch.Tensor):
            if time_window is not None:
                raise ValueError("time_window: only applies to a video file, not to a frame tensor")
            return TensorSource(video)
        if isinstance(video, FrameSource):
            return video
        spec = self.lm.frame_spec
        if isinstance(video, (str, pathlib.Path)):
            return video_frames.open_frames(
                str(video), num_frames=num_frames, time_window=time_window, size=spec.size[0],
                mean=spec.mean, std=spec.std, decoder=decoder, seek=seek)
        if isinstance(video, cf.Future):  # from vr_runtime.video.load.prefetch_video
            video = video.result()
        if hasattr(video, "pixel_values") and hasattr(video, "frame_indices"):
            return TensorSource(video.pixel_values, video.frame_indices, video.timestamps_s,
                                getattr(video, "note", None), getattr(video, "decoder", None),
                                getattr(video, "codec", None), getattr(video, "seek", None),
                                getattr(video, "decode_s", None))
        raise VideoError(f"video: expected a path, a VideoClip, a Future of one or a "
                         f"[T,3,H,W] tensor, got {type(video).__name__}")

    # ------------------------------------------------------------------ stage: policy
    def decide_policy(self, req: Request, timer: StageTimer) -> PolicyDecision:
        """``auto``: the Semantic Router's class, routed through ``req.route_to``."""
        if req.policy != AUTO:
            return PolicyDecision(req.policy, None)
        if not self.routers_trained:
            return PolicyDecision(req.route_to[UNTRAINED_AUTO_POLICY], None, (
                f"routers are untrained: policy 'auto' fell back to '{UNTRAINED_AUTO_POLICY}' "
                f"(pass trained router weights or an explicit --policy)",))
        with timer.stage("router"):
            q = self.question_embeddings(req.routed_question)
            cls, prob = policy_from_logits(self.routers.policy_logits(q[None])[0])
        return PolicyDecision(req.route_to[cls], prob)

    # ------------------------------------------------------------------ stage: vision
    def encode(self, frames: Frames, req: Request, timer: StageTimer, state: Optional[dict],
               keep: Optional[Sequence[int]] = None, retain: bool = False) -> torch.Tensor:
        """Z of the ``keep`` units (all when None), streamed: the frames are decoded and resized
        on worker threads while the tower encodes the chunk before, and dropped once encoded.
        With a video cache, Z of every unit is computed once and kept (a later question may
        keep other frames). ``retain``: keep the pixels too (a scorer that reads them)."""
        if state is not None:
            if "Z" not in state:
                state["Z"] = self._encode_stream(frames, req, timer, None, retain)
            else:
                timer.add("vision", 0.0)
            Z = state["Z"]
            return Z if keep is None else Z[list(keep)]
        return self._encode_stream(frames, req, timer, keep, retain)

    def _encode_stream(self, frames: Frames, req: Request, timer: StageTimer,
                       keep: Optional[Sequence[int]], retain: bool) -> Optional[torch.Tensor]:
        """The tower over ``frames.unit_chunks``: ``req.chunk_size`` units a call, the chunks
        ``encode_frames`` would make of the same units at once (so Z is the same). Time spent
        waiting for frames is "frames_wait"; the tower's own is "vision"."""
        units = list(range(frames.T)) if keep is None else list(keep)
        if not units:
            return None
        c, Z, row, kept_pixels = req.chunk_size, None, 0, [] if retain else None
        chunks = frames.unit_chunks(units, c, self.lm.device)
        try:
            while True:
                t0 = time.perf_counter()
                pv = next(chunks, None)
                timer.add("frames_wait", time.perf_counter() - t0)
                if pv is None:
                    break
                with timer.stage("vision"):
                    z = self.lm.encode_frames(pv, c)
                    if Z is None:
                        Z = z.new_empty(len(units), *z.shape[1:])
                    Z[row:row + z.shape[0]].copy_(z)
                row += z.shape[0]
                if kept_pixels is not None:
                    kept_pixels.append(pv.cpu())
                del pv, z
        finally:
            if hasattr(chunks, "close"):
                chunks.close()       # stops and joins the decoding workers, also on an error
        frames.finished()
        if kept_pixels is not None and keep is None:
            frames.pixel_values = torch.cat(kept_pixels)
        return Z

    # ------------------------------------------------------------------ stage: score
    def score_frames(self, req: Request, frames: Frames, Z, timer: StageTimer,
                     state: Optional[dict], budget: int) -> FrameScores:
        pixels = self._pixels(frames, req, timer) if req.scorer.needs_pixels else None
        inp = ScoringInput(req.routed_question, pixels, Z, budget, req.windows,
                           state, routers=self.routers, grid=self.lm.grid,
                           frame_spec=self.lm.frame_spec, embed=self.question_embeddings,
                           num_frames=frames.T)
        with timer.stage("router"):
            return req.scorer.score(inp)

    def _pixels(self, frames: Frames, req: Request, timer: StageTimer) -> torch.Tensor:
        """Every unit's pixels [T, 3k, H, W] on the CPU, for a scorer that reads them: kept by
        the vision stage when it ran, else streamed now (timed as "frames_wait")."""
        t0 = time.perf_counter()
        pixels = frames.all_pixels(req.chunk_size)
        timer.add("frames_wait", time.perf_counter() - t0)
        return pixels

    # ------------------------------------------------------------------ stage: plan
    def _times(self, times) -> dict:
        """``times=`` for a backbone whose prompt writes each unit's time."""
        return {"times": times} if self.lm.uses_frame_times and times is not None else {}

    def plan(self, req: Request, policy: str, T: int,
             relevant: Optional[Sequence[bool]] = None, times=None) -> FittedPlan:
        """Windows per frame for ``policy``, fitted exactly: the plan plus the prompt text it
        implies fits ``max_length - max_new_tokens - margin`` (a fixed ``req.budget`` instead
        bounds the visual tokens alone, as in the paper's controlled protocol)."""
        planner = get_planner(policy)
        grid, w = self.lm.grid, req.windows

        def text_for(kept):
            return req.text_tokens(self.lm, T, kept, **self._times(times))

        fitted = plan_fitted(planner, T, grid, relevant, w, text_for, req.max_length,
                             req.max_new_tokens, req.margin, budget=req.budget)
        if req.ttft_budget_s is not None and planner.budgeted:
            fitted = fit_latency(self, req, planner, T, relevant, fitted, text_for)
        if sum(pooled_counts(fitted.plan, grid)) == 0:
            raise budget.BudgetError(f"visual budget {fitted.budget} holds no frame under policy "
                                f"{policy!r}; raise max_length or lower max_new_tokens")
        return fitted

    @property
    def max_positions(self) -> Optional[int]:
        """The backbone's context: its decoder's ``max_position_embeddings`` (None if unset)."""
        n = getattr(self.lm.text_config, "max_position_embeddings", None)
        return int(n) if isinstance(n, int) and n > 0 else None

    def check_length(self, req: Request, policy: str, planner, T: int, fitted: FittedPlan) -> None:
        """Refuse, before the vision encoder runs, a prompt (plus its new tokens) longer than the
        model's context, and an unbudgeted (dense) one over ``max_length`` unless the request
        says ``allow_over_length``: the paper's Dense row has no budget, not no limit. The line
        gives the frame count that fits."""
        grid = self.lm.grid
        total = fitted.text_tokens + budget.plan_tokens(fitted.plan, grid) + req.max_new_tokens
        limits = []
        if self.max_positions is not None:
            limits.append((self.max_positions, "the model's context (max_position_embeddings)",
                           "use fewer frames (--frames)"))
        if not planner.budgeted and not req.allow_over_length:
            limits.append((req.max_length, "max_length",
                           "use fewer frames (--frames), raise --max-length, a budgeted policy, "
                           "or allow it explicitly (--allow-over-length)"))
        for limit, what, advice in limits:
            if total <= limit:
                continue
            fixed = req.text_tokens(self.lm, 0, kept=[])
            per_frame = max((total - req.max_new_tokens - fixed) / max(T, 1), 1.0)
            fit = max(int((limit - req.max_new_tokens - fixed) // per_frame), 0)
            raise budget.BudgetError(
                f"policy {policy!r} at {T} frames makes a prompt of "
                f"{total - req.max_new_tokens} tokens, which with {req.max_new_tokens} new tokens "
                f"is over {what} of {limit}: at most {fit} frames fit; {advice}")

    def _scoring_budget(self, req: Request, T: int) -> int:
        """The budget a rank-based scorer plans for: the fixed one, or the one with every
        frame's line counted (safe for any plan)."""
        if req.budget is not None:
            return req.budget
        n_text = req.text_tokens(self.lm, T)
        return max(req.max_length - n_text - req.max_new_tokens - req.margin, 0)

    # ------------------------------------------------------------------ stage: compress
    def compress(self, req: Request, plan: Sequence, Z: torch.Tensor, keep: Sequence[int],
                 timer: StageTimer, times=None, z_plan: Optional[Sequence] = None):
        """Prompt ids with per-frame placeholder counts; the kept frames of Z pooled straight
        into their rows of inputs_embeds. -> (ids [L], embeds [1, L, D], position_ids or None).
        ``z_plan``: the window of each row of Z (0 for a dropped frame, when Z holds every
        frame); None: Z holds the kept frames only."""
        lm = self.lm
        with timer.stage("compress"):
            ids, starts, kept_plan, pos = self._prompt(req, plan, keep, times)
            embeds = reconstruct_embeds(lm.model, ids, Z, kept_plan if z_plan is None else z_plan,
                                        lm.image_token_id, lm.grid, frame_starts=starts)
        return ids, embeds, pos

    def _prompt(self, req: Request, plan: Sequence, keep: Sequence[int], times=None):
        """The prompt of a plan: ids [L] with per-frame placeholder counts, the first row of
        each kept frame, the kept frames' windows, position ids (None: 1-D)."""
        lm = self.lm
        ids, starts = lm.build_prompt(req.question, pooled_counts(plan, lm.grid), req.system,
                                      **self._times(times))
        kept_plan = [plan[t] for t in keep]
        return ids, starts, kept_plan, lm.position_ids(ids, kept_plan, starts)

    def _pack_batch(self, done: Sequence["_Prepared"]):
        """One ``pool_pack`` for the whole batch: every request's kept frames pooled into one
        right-padded [B, L, D] inputs_embeds (reconstruct_embeds_batch) -> (embeds, lengths).
        Each request's Z is dropped as soon as it is packed."""
        lm = self.lm
        Zs = [p.packing[0] for p in done]
        plans = [p.packing[1] for p in done]
        starts = [p.packing[2] for p in done]
        for p in done:
            p.packing = None
        return reconstruct_embeds_batch(lm.model, [p.ids for p in done], Zs, plans,
                                        lm.image_token_id, lm.grid, starts)

    # ------------------------------------------------------------------ stage: generate
    @torch.inference_mode()
    def generate(self, embeds: torch.Tensor, max_new_tokens: int,
                 timer: Optional[StageTimer] = None,
                 position_ids: Optional[torch.Tensor] = None, on_token=None,
                 prefix=None) -> List[int]:
        """Prefill ``embeds`` [1, L, D] (logits of the last row only, KV cache on), then greedy
        decoding with the cache until a stop id or ``max_new_tokens`` (``self.greedy``: dynamic,
        static or graph-captured steps, the same tokens). Returns the new ids (the stop id
        excluded). Stages "prefill" and "generate" go to ``timer``. ``on_token(id)``: called
        with each new id as it is decided (streaming). ``prefix``: a decode.PrefixCache of the
        prompt's visual prefix (``prefix_cache``)."""
        each = None if on_token is None else (lambda row, i: on_token(i))
        return self.greedy.generate([embeds], [max_new_tokens], [position_ids], self._stop_ids,
                                    timer, each, prefix=prefix)[0]

    # ------------------------------------------------------------------ the pipeline
    @torch.inference_mode()
    def answer(self, video, question: str, options: Optional[AnswerOptions] = None, *,
               on_token=None, **kwargs) -> Answer:
        """Answer ``question`` about ``video`` (path | VideoClip | Future | [T,3,H,W] tensor).

        ``options``: an :class:`~vr_runtime.request.AnswerOptions` (frames, context, policy,
        scorer, windows, budget, cache, ...); or its fields as keywords, e.g.
        ``answer(video, q, num_frames=16, policy="global")``. ``on_token``: called with each
        generated id as it is decided (streaming; the answer is the same)."""
        req = self.request(video, question, options, **kwargs)             # request
        p = self._prepare(req)          # decode, policy, vision, score, plan, compress
        gen = self.generate(p.embeds, req.max_new_tokens, p.timer, p.position_ids,
                            on_token, prefix=p.prefix and p.prefix[0])     # prefill, generate
        return self._finish(p, gen)                                        # report

    def _prepare(self, req: Request, pack: bool = True) -> "_Prepared":
        """Every stage of :meth:`answer` before the prefill -> the prompt's embeddings and
        everything the report needs. ``pack=False`` (answer_batch): the prompt is built but
        its frames are not pooled yet (``packing`` holds what the batch's one pool_pack needs)."""
        req = self._with_rate(req)
        T_req = int(req.video.shape[0]) if isinstance(req.video, torch.Tensor) else req.num_frames
        self.check_budget(req, T_req)              # a hopeless budget fails before decoding
        timer = StageTimer(self.lm.device, resident=True)   # CPU: this request's resident peak
        state = self.video_state(req)
        hit = bool(state and state["hit"])
        frames = self.load_frames(req, timer, state)                                 # frames
        T, notes = frames.T, list(frames.notes)
        if hit:
            notes.append("visual cache hit: decoded frames, Z and the Image Router's "
                         "question-independent state were reused from an earlier question")
        decision = self.decide_policy(req, timer)                                    # policy
        notes += decision.notes
        planner = get_planner(decision.policy)
        scores, Z = None, None
        if planner.needs_relevance:   # vision first when the scorer reads Z, then score
            Z = self.encode(frames, req, timer, state, retain=req.scorer.needs_pixels) \
                if req.scorer.needs_z else None
            scores = self.score_frames(req, frames, Z, timer, state, self._scoring_budget(req, T))
            notes += scores.notes
        fitted = self.plan(req, decision.policy, T, scores.relevant if scores else None,
                           frames.times_s)                                          # plan
        self.check_length(req, decision.policy, planner, T, fitted)
        if scores is not None and not any(scores.relevant) and planner.when_none_relevant:
            notes.append("no frame was relevant: " + planner.when_none_relevant)
        notes += fitted.notes
        dropped = dropped_note(fitted.plan, self.lm.grid, fitted.budget, decision.policy,
                               scores.relevant if scores else None)
        if dropped and planner.budgeted:
            notes.append(dropped)
        keep = kept_frames(fitted.plan, self.lm.grid)
        if Z is None:   # plan-first policies encode only the frames they keep        # vision
            # (with a video cache, every frame once: the cached Z itself is packed below)
            Z = self.encode(frames, req, timer, state, None if state is not None else keep)
        # Z holds every frame (a relevance policy's, or the video cache's) or only the kept ones.
        # pool_pack skips a frame whose window is 0, so the kept rows are never copied out of Z
        z_plan = list(fitted.plan) if Z.shape[0] == T else [fitted.plan[t] for t in keep]
        packing = None
        if pack:
            ids, embeds, pos = self.compress(req, fitted.plan, Z, keep, timer,
                                             frames.times_s, z_plan)                # compress
        else:
            with timer.stage("compress"):
                ids, starts, kept_plan, pos = self._prompt(req, fitted.plan, keep,
                                                           frames.times_s)
            embeds, packing = None, (Z, z_plan, starts)
        del Z   # the pooled rows are in embeds (or the batch's packing): Z is not kept past here
        if not planner.budgeted and ids.numel() + req.max_new_tokens > req.max_length:
            # only with allow_over_length (check_length refuses it otherwise)
            notes.append(f"{decision.policy} has no budget: its prompt of {ids.numel()} tokens "
                         f"plus {req.max_new_tokens} new tokens exceeds max_length {req.max_length}")
        prefix = self._visual_prefix(state, fitted.plan, ids, pos) \
            if self.prefix_cache and state is not None and pack else None
        if prefix is not None and prefix[1] == "hit":
            notes.append(f"visual prefix cache hit: the KV cache of the prompt's first "
                         f"{prefix[0].length} tokens (up to the end of the visual tokens) was "
                         f"reused from an earlier question; prefill ran on the rest")
        return _Prepared(req, timer, frames, decision, planner, scores, fitted, ids, embeds, pos,
                         notes, hit, packing, prefix)

    def _with_rate(self, req: Request) -> Request:
        """``fps`` sampling: the file is opened now, its duration gives the frame count, and
        the request reads those frames of the opened file (the budget and ``scales="auto"``
        are then those of the real count)."""
        if req.fps is None:
            return req
        source = req.video
        if isinstance(source, (str, pathlib.Path)):
            spec = self.lm.frame_spec
            source = video_frames.open_frames(
                str(source), time_window=req.time_window, size=spec.size[0], mean=spec.mean,
                std=spec.std, decoder=req.decoder, seek=req.seek, fps=req.fps,
                min_frames=req.min_frames, max_frames=req.max_frames)
        elif not isinstance(source, FileSource):   # (a FileSource: opened by rate already)
            raise ValueError("fps: samples a video file by rate; give a path (frames given as "
                             "a tensor or a clip are already sampled)")
        opts = dataclasses.replace(req.options, num_frames=source.plan.num_frames, fps=None,
                                   time_window=None)
        return self.request(source, req.question, opts)

    def _visual_prefix(self, state: dict, plan: Sequence, ids: torch.Tensor, pos):
        """(PrefixCache, "hit" | "miss") for a prompt of this video (``state``: its visual cache
        entry), or None when the prompt has no visual token. The prefix runs to the last visual
        token; it is shared only when an earlier question had the same plan and exactly the
        same ids (system prompt, frame labels, placeholders) and positions up to there -- the
        same Z then gives the same embeddings. One entry a video: another plan replaces it."""
        rows = (ids == self.lm.image_token_id).nonzero()
        if not len(rows) or int(rows[-1]) + 1 >= ids.numel():
            return None
        P = int(rows[-1]) + 1
        key_plan = [json_window(w) for w in plan]
        head, head_pos = ids[:P], None if pos is None else pos[..., :P]
        old = state.get("prefix")
        if (old is not None and old["plan"] == key_plan and torch.equal(old["ids"], head)
                and ((old["pos"] is None and head_pos is None) or
                     (old["pos"] is not None and head_pos is not None
                      and torch.equal(old["pos"], head_pos)))):
            return old["kv"], "hit"
        entry = {"plan": key_plan, "ids": head.clone(),
                 "pos": None if head_pos is None else head_pos.clone(), "kv": PrefixCache(P)}
        state["prefix"] = entry
        return entry["kv"], "miss"

    def _finish(self, p: "_Prepared", gen: List[int], batch: int = 1) -> Answer:
        """The answer's text and report from the generated ids."""
        req, T = p.req, p.frames.T
        p.embeds = None
        text = self.lm.tokenizer.decode(gen, skip_special_tokens=True).strip()
        extra = None
        if req.ttft_budget_s is not None:
            # a reused prefix's prefill is not the model's prefill: not observed
            extra = latency_report(self, req, p.planner, T, p.fitted, p.timer,
                                   observe=batch == 1 and not (p.prefix and p.prefix[1] == "hit"))
        report = build_report(self.lm, self.routers, req, p.frames, p.decision, p.scores,
                              p.fitted, p.ids.numel(), len(gen), p.timer, p.notes,
                              ("hit" if p.hit else "miss") if req.cache_visual else None)
        report["decoding"] = self.greedy.mode
        if self.prefix_cache:
            report["prefix_cache"] = None if p.prefix is None else \
                {"status": p.prefix[1], "tokens": p.prefix[0].length}
        if self.greedy.fallback and self.greedy.fallback not in report["notes"]:
            report["notes"].append(self.greedy.fallback)
        if extra:
            report.update(extra)
        return Answer(text=text, report=report)

    @torch.inference_mode()   # as answer: no autograd graph (cached state is deep-copied)
    def answer_batch(self, videos: Sequence, questions, options=None, *,
                     batch_prefill: bool = True, **kwargs) -> List[Answer]:
        """``answer`` for several videos (``questions``: one string for all, or one per video).
        ``options``: one :class:`~vr_runtime.request.AnswerOptions` for every video, or one per
        video (an AnswerOptions, or a dict of its fields over ``kwargs``: e.g. each question's
        ``router_question`` and its own ``scorer``); ``kwargs``: AnswerOptions fields for all.

        Every stage before the prefill runs per video, decoding the next video file in the
        background while the model works on the current one. With ``batch_prefill`` (the
        default) the prompts are then prefilled in one decoder batch and decoded together
        (vr_runtime.generate: right-padded, every answer the one it gets alone); each report's
        "prefill" and "generate" are the batch's. ``batch_prefill=False``: one ``answer`` after
        another (the original path)."""
        videos = list(videos)
        qs, opts = self._batch_options(videos, questions, options, kwargs)
        if not self.lm.pads_exactly:   # a recurrent LLM: padding would enter a shorter state
            batch_prefill = False
        done = self._prepare_each(videos, qs, opts, batch_prefill)
        if not batch_prefill or not done:
            return done
        return self._generate_batch(done)

    @staticmethod
    def _batch_options(videos: list, questions, options, kwargs: dict):
        """``answer_batch``'s questions and options, one per video, every one checked before
        any decoding starts -> (questions, AnswerOptions)."""
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

    def _prepare_each(self, videos: list, qs: list, opts: list, batch_prefill: bool) -> list:
        """Every stage before the prefill for each video in turn (``batch_prefill``; else the
        whole answer). Every video file is opened (checked, indexed, sampled) before the first
        is answered, so a bad file fails the batch before any model work; each one's frames
        then stream through the tower in its turn."""
        spec = self.lm.frame_spec

        def opened(v, o):
            if isinstance(v, (str, pathlib.Path)):
                return video_frames.open_frames(
                    str(v), num_frames=o.num_frames, time_window=o.time_window,
                    size=spec.size[0], mean=spec.mean, std=spec.std, decoder=o.decoder, seek=o.seek)
            return v

        sources = [opened(v, o) for v, o in zip(videos, opts)]
        done: list = []
        for src, q, o in zip(sources, qs, opts):
            if isinstance(src, FileSource):   # the window was applied when it was opened
                o = dataclasses.replace(o, time_window=None)
            done.append(self._prepare(self.request(src, q, o), pack=False) if batch_prefill
                        else self.answer(src, q, o))
        return done

    def _generate_batch(self, done: List["_Prepared"]) -> List[Answer]:
        """One pool_pack, one prefill and the decode steps of the prepared requests together;
        each report's compress, prefill and generate times are the batch's."""
        timer = StageTimer(self.lm.device)
        with timer.stage("compress"):   # one pool_pack: every request's frames, one buffer
            embeds, lengths = self._pack_batch(done)
        gens = self.greedy.generate(embeds, [p.req.max_new_tokens for p in done],
                                    [p.position_ids for p in done], self._stop_ids, timer,
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
        return [self._finish(p, g, len(done)) for p, g in zip(done, gens)]


__all__ = ["VideoRouter", "Answer", "AnswerOptions", "Request", "Frames", "PolicyDecision", "POLICIES",
           "UNTRAINED_AUTO_POLICY", "SEMANTIC_CLASSES"]
