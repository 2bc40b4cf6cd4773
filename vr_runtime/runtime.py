"""VideoRouter: the inference path of the paper (Sections 3.1-3.2, Algorithm 1) on InternVL3.

``answer`` runs, for one video and one question::

    decode    sample + preprocess T frames (vr_runtime.video; not part of TTFT, as in the paper)
    router    Semantic Router on the question (policy "auto"); Image Router on [Z_t; q] ("fragment")
    vision    ViT + pixel shuffle + projector -> Z [T, 256, D], in chunks
    compress  plan windows under the budget, build the prompt with per-frame placeholder counts,
              pool_pack straight into the rows of inputs_embeds
    prefill   one forward over inputs_embeds with logits_to_keep=1 and a KV cache
    generate  greedy decoding with the cache until <|im_end|>/EOS or max_new_tokens

TTFT = vision + router + compress + prefill (SPEC section 3). When the plan does not depend on Z
(every policy except a routed ``fragment``) it is made before the vision stage and only the
frames it keeps are encoded: a dropped frame's ViT pass would be thrown away.

Untrained routers (no weights given, none shipped): the runtime still runs, but ``auto`` does not
pretend to route -- it falls back to :data:`UNTRAINED_AUTO_POLICY` ("global": broad coverage,
the Semantic Router's class 0, needs no frame scores) and the report says so
(``routers_trained: false`` and a ``notes`` entry). ``fragment`` then uses the untrained Image
Router's scores, also noted, unless ``relevant=`` is given.
"""
from __future__ import annotations

import concurrent.futures as cf
import inspect
import pathlib
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch

from vr_kernels import pooled_counts
from vr_kernels.windows import normalize_window

from . import budget as B
from .model import LoadedModel, encode_frames, load_model, model_from_config
from .prompt import build_video_prompt, text_tokens
from .reconstruct import reconstruct_embeds
from .routers import RouterConfig, Routers, embed_question
from .timing import StageTimer

POLICIES = ("auto", "global", "fragment", "dense", "budget", "uniform")
UNTRAINED_AUTO_POLICY = "global"
SEMANTIC_CLASSES = ("global", "fragment")  # Semantic Router class 0 / 1 (paper: y_s)


@dataclass
class Answer:
    text: str
    report: dict = field(default_factory=dict)


def _json_window(w):
    nw = normalize_window(w)
    if nw is None:
        return 0
    return nw[0] if nw[0] == nw[1] else [nw[0], nw[1]]


class VideoRouter:
    def __init__(self, lm: LoadedModel, routers: Optional[Routers] = None):
        self.lm = lm
        self.routers = routers if routers is not None else Routers.from_model(lm.model)
        self.routers.eval()
        sig = inspect.signature(lm.model.forward).parameters
        # transformers renamed num_logits_to_keep -> logits_to_keep (4.50).
        self._keep_kw = "logits_to_keep" if "logits_to_keep" in sig else "num_logits_to_keep"
        self._stop_ids = self._stop_token_ids()
        self._vcache = None  # cache_visual: the last video's question-independent state

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(cls, path_or_name="tiny", routers=None, device="cpu", dtype=None,
                        attn_implementation=None, router_config: Optional[RouterConfig] = None):
        """``routers``: a safetensors path, a :class:`Routers`, or None. For ``"tiny"`` with None,
        ``vr_runtime/assets/tiny/routers.safetensors`` is loaded when it exists."""
        lm = load_model(path_or_name, device=device, dtype=dtype,
                        attn_implementation=attn_implementation)
        if routers is None and str(path_or_name) == "tiny":
            from .tiny import ASSETS
            shipped = ASSETS / "routers.safetensors"
            if shipped.is_file():
                routers = shipped
        return cls(lm, cls._routers_for(lm, routers, router_config))

    @classmethod
    def from_config(cls, config, device="cpu", dtype=None, seed: int = 0, routers=None,
                    attn_implementation=None, router_config: Optional[RouterConfig] = None):
        """Random weights of a shape preset (see :func:`vr_runtime.model.model_from_config`)."""
        lm = model_from_config(config, device=device, dtype=dtype, seed=seed,
                               attn_implementation=attn_implementation)
        return cls(lm, cls._routers_for(lm, routers, router_config))

    @staticmethod
    def _routers_for(lm, routers, router_config):
        if isinstance(routers, Routers):
            return routers.to_model(lm.device, lm.dtype)
        if routers is not None:
            return Routers.load(pathlib.Path(routers), lm.model)  # built on the model's device/dtype
        return Routers.from_model(lm.model, router_config)

    def clear_visual_cache(self) -> None:
        self._vcache = None

    @staticmethod
    def _video_key(video, num_frames, time_window) -> tuple:
        """Identity of a video input for ``cache_visual``. Paths: file identity + sampling
        arguments. Tensors and clips: the object itself (held by the cache, so its id cannot be
        reused) and, for tensors, its in-place version counter."""
        if isinstance(video, (str, pathlib.Path)):
            p = pathlib.Path(video).resolve()
            try:
                st = p.stat()
                ident = (st.st_mtime_ns, st.st_size)
            except OSError:
                ident = None
            tw = tuple(time_window) if time_window is not None else None
            return ("path", str(p), ident, int(num_frames), tw)
        if isinstance(video, torch.Tensor):
            return ("tensor", id(video), video._version, tuple(video.shape))
        return ("clip", id(video))

    @property
    def routers_trained(self) -> bool:
        return bool(getattr(self.routers, "trained", False))

    def _stop_token_ids(self) -> set:
        tok, cfg = self.lm.tokenizer, self.lm.model.config
        ids = set()
        for src in (getattr(self.lm.model, "generation_config", None), cfg.text_config):
            e = getattr(src, "eos_token_id", None) if src is not None else None
            if e is not None:
                ids.update(e if isinstance(e, (list, tuple)) else [e])
        if tok.eos_token_id is not None:
            ids.add(tok.eos_token_id)
        im_end = tok.convert_tokens_to_ids("<|im_end|>")
        if isinstance(im_end, int) and im_end != tok.unk_token_id:
            ids.add(im_end)
        return {int(i) for i in ids}

    # ------------------------------------------------------------------ the pipeline
    def _decode(self, video, num_frames, time_window):
        """-> (pixel_values [T,3,S,S], frame_indices, frame_times_s or None, notes, decode_s)."""
        from .errors import VideoError
        if isinstance(video, torch.Tensor):
            if video.ndim != 4 or video.shape[1] != 3:
                raise ValueError(f"video: a tensor must be [T, 3, H, W] frames, got {tuple(video.shape)}")
            if time_window is not None:
                raise ValueError("time_window: only applies to a video file, not to a frame tensor")
            T = video.shape[0]
            return video, list(range(T)), None, [], None
        if isinstance(video, (str, pathlib.Path)):
            from .video import load_video
            clip = load_video(str(video), num_frames=num_frames, time_window=time_window)
        elif isinstance(video, cf.Future):  # from vr_runtime.video.prefetch_video
            clip = video.result()
        elif hasattr(video, "pixel_values") and hasattr(video, "frame_indices"):
            clip = video
        else:
            raise VideoError(f"video: expected a path, a VideoClip, a Future of one or a "
                             f"[T,3,H,W] tensor, got "
                             f"{type(video).__name__}")
        notes = [clip.note] if getattr(clip, "note", None) else []
        return (clip.pixel_values, list(clip.frame_indices), list(clip.timestamps_s), notes,
                getattr(clip, "decode_s", None))

    def answer_batch(self, videos: Sequence, questions, num_frames: int = 64, time_window=None,
                     **kw) -> List[Answer]:
        """``answer`` for several videos (``questions``: one string for all, or one per video).

        Runs them one after another -- each prefill is already a large GPU batch -- and overlaps
        the decoding of the next video file with the model work on the current one (background
        prefetch), so decode time leaves the critical path after the first video."""
        videos = list(videos)
        qs = [questions] * len(videos) if isinstance(questions, str) else list(questions)
        if len(qs) != len(videos):
            raise ValueError(f"questions: expected 1 or {len(videos)} questions, got {len(qs)}")

        def start(v):
            if isinstance(v, (str, pathlib.Path)):
                from .video import prefetch_video
                return prefetch_video(str(v), num_frames=num_frames, time_window=time_window)
            return v

        out: List[Answer] = []
        pending = start(videos[0]) if videos else None
        for i, q in enumerate(qs):
            cur = pending
            pending = start(videos[i + 1]) if i + 1 < len(videos) else None
            out.append(self.answer(cur, q, num_frames=num_frames,
                                   time_window=None if isinstance(cur, cf.Future) else time_window,
                                   **kw))
        return out

    def _plan(self, policy, T, budget, grid, relevant, high, low, global_scale):
        if policy == "dense":
            return B.plan_dense(T)
        if policy == "budget":
            return B.plan_budget(T, budget, grid)
        if policy == "uniform":
            return B.plan_uniform(T, budget, grid)
        if policy == "global":
            return B.plan_global(T, budget, grid, global_scale)
        return B.plan_fragment(relevant, budget, grid, high=high, low=low, global_scale=global_scale)

    @torch.inference_mode()
    def generate(self, embeds: torch.Tensor, max_new_tokens: int,
                 timer: Optional[StageTimer] = None) -> List[int]:
        """Prefill ``embeds`` [1, L, D] (logits of the last row only, KV cache on), then greedy
        decoding with the cache until a stop id or ``max_new_tokens``. Returns the new ids
        (the stop id excluded). Stages "prefill" and "generate" go to ``timer``."""
        lm = self.lm
        timer = timer or StageTimer(lm.device)
        keep = {self._keep_kw: 1}
        with timer.stage("prefill"):
            out = lm.model(inputs_embeds=embeds, use_cache=True, return_dict=True, **keep)
            nxt = out.logits[:, -1].argmax(-1)
        gen: List[int] = []
        with timer.stage("generate"):
            cache = out.past_key_values
            del out
            tok_id = int(nxt)  # one host sync per token is inherent to stopping on EOS
            while len(gen) < max_new_tokens and tok_id not in self._stop_ids:
                gen.append(tok_id)
                if len(gen) == max_new_tokens:
                    break
                o = lm.model(input_ids=nxt.view(1, 1), past_key_values=cache, use_cache=True,
                             return_dict=True, **keep)
                cache = o.past_key_values
                nxt = o.logits[:, -1].argmax(-1)
                tok_id = int(nxt)
            del cache
        return gen

    @torch.inference_mode()
    def answer(self, video, question: str, num_frames: int = 64, max_length: int = 12288,
               max_new_tokens: int = 64, policy: str = "auto", time_window=None,
               relevant: Optional[Sequence[bool]] = None, high=1, low=4, global_scale=2,
               margin: int = 100, chunk_size: int = 16, frame_batch: Optional[int] = None,
               system: Optional[str] = None, router_pool: Optional[int] = None,
               cache_visual: bool = False) -> Answer:
        """Answer ``question`` about ``video`` (path | VideoClip | [T,3,448,448] tensor).

        ``relevant`` forces the Image Router's decisions (one bool per sampled frame), for
        benchmarks and ablations; it is only used by ``fragment`` (and ``auto`` -> fragment).
        ``router_pool``: window applied to Z_t before the Image Router (None: the routers'
        configured value, 1 = the paper; 2 = 2x2 pooling, ~4x cheaper routing).
        ``cache_visual``: keep the question-independent work on this video (decoded frames, Z of
        every frame, the Image Router's shadow-stack state over each Z_t) and reuse it when the
        next question is about the same video; a new question then costs its text only. One
        video is kept (:meth:`clear_visual_cache` frees it); the report says "hit" or "miss"."""
        lm = self.lm
        if policy not in POLICIES:
            raise ValueError(f"policy {policy!r}: expected one of {', '.join(POLICIES)}")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens: expected an int >= 0, got {max_new_tokens!r}")
        if not isinstance(question, str) or not question.strip():
            raise ValueError("question: empty; ask a non-empty question about the video")
        timer = StageTimer(lm.device)
        notes: List[str] = []

        entry = None
        if cache_visual:
            key = self._video_key(video, num_frames, time_window)
            vc = self._vcache
            if vc is not None and vc["key"] == key and vc["obj"] is (video if key[0] != "path" else None):
                entry = vc
        hit = entry is not None
        with timer.stage("decode"):
            decoded = entry["decoded"] if hit else self._decode(video, num_frames, time_window)
        pv, frame_indices, frame_times, vnotes, decode_s = decoded
        if hit:
            decode_s = None  # nothing was decoded for this question
        notes += vnotes
        T = int(pv.shape[0])
        if T == 0:
            raise ValueError("video: no frames to answer from")
        size = lm.model.config.vision_config.image_size
        size = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
        if tuple(pv.shape[-2:]) != size:
            raise ValueError(f"video: frames are {tuple(pv.shape[-2:])}, the model expects {size}")
        if isinstance(video, torch.Tensor) and T != num_frames:
            notes.append(f"{T} frames were given as a tensor; num_frames={num_frames} was not applied")
        grid = lm.grid
        per_frame = grid[0] * grid[1]

        n_text = text_tokens(lm.tokenizer, question, T, system)
        try:
            budget = B.visual_budget(max_length, n_text, max_new_tokens, margin, grid=grid)
        except B.BudgetError:
            if policy != "dense":
                raise
            budget = None  # dense has no budget; report it as such

        # --- router stage 1: the Semantic Router (question only) -----------------------------
        policy_prob = None
        resolved = policy
        q_emb = None
        if policy == "auto":
            if self.routers_trained:
                with timer.stage("router"):
                    q_emb = embed_question(lm.model, lm.tokenizer, question)
                    probs = torch.softmax(self.routers.policy_logits(q_emb[None]).float(), -1)[0]
                    cls = int(probs.argmax())
                    policy_prob = float(probs[cls])
                resolved = SEMANTIC_CLASSES[cls]
            else:
                resolved = UNTRAINED_AUTO_POLICY
                notes.append(f"routers are untrained: policy 'auto' fell back to "
                             f"'{UNTRAINED_AUTO_POLICY}' (pass trained router weights or an "
                             f"explicit --policy)")
        routed = resolved == "fragment" and relevant is None
        trained_pool = self.routers.config.router_pool
        pool = trained_pool if router_pool is None else router_pool
        if routed and pool != trained_pool:
            notes.append(f"router_pool={pool} differs from the pooling the routers were built "
                         f"with ({trained_pool})")
        if relevant is not None:
            relevant = [bool(r) for r in relevant]
            if len(relevant) != T:
                raise ValueError(f"relevant: expected {T} entries (one per sampled frame), got {len(relevant)}")

        # --- vision (+ plan first when it does not need Z) ----------------------------------
        scores = None
        if cache_visual:
            if hit:
                Z = entry["Z"]
                timer.add("vision", 0.0)
                notes.append("visual cache hit: decoded frames, Z and the Image Router's "
                             "question-independent state were reused from an earlier question")
            else:
                with timer.stage("vision"):
                    Z = encode_frames(lm.model, pv, chunk_size)
                self._vcache = entry = {"key": key, "decoded": decoded, "Z": Z, "router": {},
                                        "obj": video if key[0] != "path" else None}
            keep = list(range(T))
            if routed:
                if not self.routers_trained:
                    notes.append("routers are untrained: the Image Router's frame scores come "
                                 "from untrained weights")
                with timer.stage("router"):
                    rkey = (id(self.routers), pool)
                    rc = entry["router"].get(rkey)
                    if rc is None:
                        rc = entry["router"][rkey] = (self.routers, self.routers.visual_cache(
                            Z, frame_batch, pool, grid))
                    if q_emb is None:
                        q_emb = embed_question(lm.model, lm.tokenizer, question)
                    probs = torch.sigmoid(self.routers.frame_logits_cached(rc[1], q_emb).float())
                    scores = probs.tolist()
                    relevant = [p > self.routers.config.threshold for p in scores]
            plan = self._plan(resolved, T, budget, grid, relevant, high, low, global_scale)
        elif routed:
            with timer.stage("vision"):
                Z = encode_frames(lm.model, pv, chunk_size)
            if not self.routers_trained:
                notes.append("routers are untrained: the Image Router's frame scores come from "
                             "untrained weights")
            with timer.stage("router"):
                if q_emb is None:
                    q_emb = embed_question(lm.model, lm.tokenizer, question)
                probs = self.routers.frame_probs(Z, q_emb, frame_batch, pool, grid)
                scores = probs.tolist()
                relevant = [p > self.routers.config.threshold for p in scores]
            plan = self._plan(resolved, T, budget, grid, relevant, high, low, global_scale)
            keep = list(range(T))
        else:
            plan = self._plan(resolved, T, budget, grid, relevant, high, low, global_scale)
            keep = [t for t in range(T) if plan[t] != 0]
            with timer.stage("vision"):
                Z = encode_frames(lm.model, pv[keep], chunk_size) if keep else None
        if resolved == "fragment" and not any(relevant):
            notes.append("no frame was relevant: the Global plan was used")
        counts = pooled_counts(plan, grid)
        if sum(counts) == 0:
            raise B.BudgetError(f"visual budget {budget} holds no frame under policy {resolved!r}; "
                                f"raise max_length or lower max_new_tokens")

        # --- compress: prompt with per-frame placeholders, pool_pack into inputs_embeds ------
        with timer.stage("compress"):
            ids, starts = build_video_prompt(lm.tokenizer, question, counts, lm.image_token_id, system)
            embeds = reconstruct_embeds(lm.model, ids, Z, [plan[t] for t in keep], lm.image_token_id,
                                        grid, frame_starts=starts)

        if resolved == "dense" and ids.numel() + max_new_tokens > max_length:
            notes.append(f"dense has no budget: its prompt of {ids.numel()} tokens plus "
                         f"{max_new_tokens} new tokens exceeds max_length {max_length}")

        # --- prefill + greedy generation with the KV cache -----------------------------------
        gen = self.generate(embeds, max_new_tokens, timer)
        del embeds
        text = lm.tokenizer.decode(gen, skip_special_tokens=True).strip()

        t = timer.times
        timings = {k: round(t.get(k, 0.0), 6) for k in ("decode", "vision", "router", "compress",
                                                         "prefill", "generate")}
        if decode_s is not None and decode_s > 0:
            timings["decode"] = round(float(decode_s), 6)  # includes a prefetch that overlapped
        timings["ttft"] = round(sum(t.get(k, 0.0) for k in ("vision", "router", "compress", "prefill")), 6)
        report = {
            "model": lm.name,
            "device": str(lm.device),
            "dtype": str(lm.dtype).replace("torch.", ""),
            "policy": resolved,
            "policy_requested": policy,
            "policy_probability": policy_prob,
            "routers_trained": self.routers_trained,
            "num_frames_requested": int(num_frames),
            "num_frames_used": T,
            "frame_indices": [int(i) for i in frame_indices],
            "frame_times_s": None if frame_times is None else [round(float(x), 4) for x in frame_times],
            "frame_scores": None if scores is None else [round(float(s), 6) for s in scores],
            "router_pool": pool if routed else None,
            "visual_cache": ("hit" if hit else "miss") if cache_visual else None,
            "relevant": relevant if resolved == "fragment" else None,
            "scales": [_json_window(w) for w in plan],
            "frame_tokens": counts,
            "visual_tokens": int(sum(counts)),
            "dense_visual_tokens": T * per_frame,
            "budget": budget,
            "max_length": int(max_length),
            "text_tokens": int(n_text),
            "prompt_tokens": int(ids.numel()),
            "generated_tokens": len(gen),
            "timings_s": timings,
            "peak_memory_bytes": timer.torch_peak(),
            "peak_memory_nvml_bytes": timer.nvml_peak,
            "notes": notes,
        }
        return Answer(text=text, report=report)


__all__ = ["VideoRouter", "Answer", "POLICIES", "UNTRAINED_AUTO_POLICY", "SEMANTIC_CLASSES"]
