"""Greedy decoding after the prefill, for one request or a batch of them.

Four ways to run the decode steps (``VideoRouter(decoding=...)``), all giving the same tokens:

``dynamic``  transformers' growing ``DynamicCache``, one eager forward per token (the original
             path; the default on CPU, where there is no launch overhead to remove).
``static``   the prefill's keys and values copied into a preallocated ``StaticCache``; every
             decode step then has one fixed shape (``decode_one_token``), run eagerly.
``compiled`` the static path with ``decode_one_token`` compiled by inductor (fused kernels, no
             CUDA graphs): any device. At fp32 its tokens are dynamic's (tests, on CPU).
``graph``    the static path with ``decode_one_token`` compiled by
             ``torch.compile(mode="reduce-overhead")``: inductor's kernels, then CUDA graphs
             replay a whole step in one launch (the gpt-fast pattern), for CUDA, where decoding
             an 8B model eagerly is bound by the host (about 1,900 kernel launches a token).
             Opt-in until it has been measured on a GPU (bench/gpu_run.sh): ``auto`` stays
             ``dynamic`` everywhere (:data:`AUTO_DECODING`).

The compile of a step is paid once per static-cache size and process: :meth:`GreedyDecoder.
warm_up` pays it at load for the largest cache the runtime expects (a smaller request reuses that
cache, and so its graph), and inductor's caches on disk (:func:`use_compile_cache`) let a second
process skip most of it. dynamo's plain ``cudagraphs`` backend is not offered: it functionalises
the static cache's in-place write, so every step returns each layer's whole key and value cache
and copies it back (graph outputs 13 for a 4-layer model: the token and 12 caches), which made it
slower than eager on an H200 (23.2 against 19.2 ms a token, 2026-11-28).

The prefill itself is the same in every mode (a dynamic cache: sdpa keeps its causal flash path;
a prefill into the static cache would attend over the whole preallocated length with a mask).
The static cache is kept between requests (graphs replay only on the buffers they were captured
on): it holds ``bucket``-rounded ``prompt + max_new_tokens`` slots per layer, and costs that
memory for the life of the runtime (``VideoRouter.greedy.release()`` frees it).

Batches (``VideoRouter.answer_batch``): prompts of different lengths are right-padded to the
longest. Causal attention never lets a real token see the padding after it, so the prefill needs
no mask and every request's rows are computed as alone; each row's first token is read at its
own last position. Decoding then writes all rows at one cache slot a step, with per-row
positions (the next RoPE position of each prompt) and a padding mask that hides each row's
unused slots -- attention is invariant to where a key sits, so the tokens are those of the
request decoded alone.
"""
from __future__ import annotations

import copy
import os
import pathlib
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from .backbones.base import output_cache

DECODING_MODES = ("auto", "dynamic", "static", "compiled", "graph")
# ``auto`` per device type: dynamic until a GPU run of bench/gpu_run.sh measures graph decoding's
# warm start and tokens at the real shape (docs/gpu-run.md); its results set this.
AUTO_DECODING = {"cpu": "dynamic", "cuda": "dynamic"}
# Static-cache slots compiled at load by default: the CLI's default context and new tokens
# (12,288 + 64), rounded up to the cache's bucket by the decoder.
DEFAULT_WARM_SLOTS = 12288 + 64


def resolve_decoding(mode: str, device: torch.device) -> str:
    """``auto`` -> the device's :data:`AUTO_DECODING` (graph mode is opt-in until measured on
    a GPU: see the module docstring); other modes are checked."""
    if mode not in DECODING_MODES:
        raise ValueError(f"decoding: expected one of {', '.join(DECODING_MODES)}, got {mode!r}")
    if mode == "auto":
        return AUTO_DECODING.get(torch.device(device).type, "dynamic")
    if mode == "graph" and torch.device(device).type != "cuda":
        raise ValueError("decoding 'graph': CUDA graphs need a CUDA device; use 'static' or "
                         "'dynamic' on " + torch.device(device).type)
    return mode


def use_compile_cache(path=None) -> pathlib.Path:
    """Keep torch.compile's caches (inductor's compiled graphs and kernels, AOTAutograd's
    graphs, Triton's binaries) in ``path`` (default ``$XDG_CACHE_HOME/videorouter/compile``,
    ``~/.cache`` without it), so that a later process on this machine finds the compiled decode
    step and the compiled stages there instead of compiling again. Without ``path``, a
    directory the user named in ``TORCHINDUCTOR_CACHE_DIR`` or ``TRITON_CACHE_DIR`` is kept.
    Call before the first compile (inductor reads its directory at each use)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    explicit = path is not None
    if path is None:
        base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
        path = pathlib.Path(base) / "videorouter" / "compile"
    path = pathlib.Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"compile cache {str(path)!r}: cannot create it ({e.strerror}); name a "
                         f"writable directory") from None
    # Importing inductor's config (transformers does, while a model loads) names its default,
    # a temporary folder, in the environment: that one is not the user's choice.
    ours = os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, default_cache_dir())
    if explicit or ours:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path / "inductor")
    if explicit or "TRITON_CACHE_DIR" not in os.environ:
        os.environ["TRITON_CACHE_DIR"] = str(path / "triton")
    import torch._inductor.config as inductor_config
    inductor_config.fx_graph_cache = True          # both on by default in torch >= 2.5;
    inductor_config.autotune_local_cache = True    # said here so a user's config cannot drop them
    return pathlib.Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


def decode_one_token(lm, token: torch.Tensor, cache, position_ids: torch.Tensor,
                     attention_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """One greedy step of every row: token [B, 1] -> next token [B]. With a static cache every
    argument keeps its shape and address from step to step, so the step can be graph-captured."""
    out = lm.forward(input_ids=token, past_key_values=cache, position_ids=position_ids,
                     attention_mask=attention_mask)
    return out.logits[:, -1].argmax(-1)


def prefill(lm, x: torch.Tensor, position_ids: Optional[torch.Tensor],
            lengths: Optional[Sequence[int]] = None, prefix: Optional["PrefixCache"] = None):
    """One decoder pass over the prompts ``x`` [B, L, D] (right-padded to L; ``lengths``: each
    row's own length, default L) with the KV cache on -> (the first greedy token of each row
    [B], the cache). Each row's token is read at its own last position; only the logits of
    those positions are computed. ``prefix`` (one prompt): its first ``prefix.length`` rows
    come from (or fill) the :class:`PrefixCache`, the rest is prefilled after them."""
    B, L = int(x.shape[0]), int(x.shape[1])
    lengths = [L] * B if lengths is None else [int(n) for n in lengths]
    if prefix is not None:
        if B != 1 or not 0 < prefix.length < L:
            raise ValueError(f"generate: a prefix of {prefix.length} rows needs one "
                             f"prompt longer than it (got {B} of length {L})")
        out = _prefill_after(lm, prefix, x, position_ids)
        nxt = out.logits[:, -1].argmax(-1)
    elif any(n != L for n in lengths):   # each row's first token at its own last position
        last = torch.tensor(lengths, device=x.device) - 1
        keep = torch.unique(last)
        out = lm.forward(inputs_embeds=x, position_ids=position_ids, logits_to_keep=keep)
        rows = torch.searchsorted(keep, last)
        nxt = out.logits[torch.arange(B, device=x.device), rows].argmax(-1)
    else:
        out = lm.forward(inputs_embeds=x, position_ids=position_ids)
        nxt = out.logits[:, -1].argmax(-1)
    return nxt, output_cache(out)


def _prefill_after(lm, prefix: "PrefixCache", x, pos):
    """The prefill of one prompt ``x`` [1, L, D] in two passes: its first ``prefix.length``
    rows (only when ``prefix.cache`` is empty: the cache is then kept there), then the rest
    over a copy of that cache (the copy grows; the prefix's own stays as it is)."""
    P = prefix.length
    if prefix.cache is None:
        out = lm.forward(inputs_embeds=x[:, :P],
                         position_ids=None if pos is None else pos[..., :P])
        prefix.cache = output_cache(out)
        del out
    # 1-D positions (pos None) continue from the cache's length, as they would in one pass
    return lm.forward(inputs_embeds=x[:, P:], position_ids=None if pos is None else pos[..., P:],
                      past_key_values=copy.deepcopy(prefix.cache))


def generate(lm, embeds: torch.Tensor, max_new_tokens: int, stop_ids=(),
             position_ids: Optional[torch.Tensor] = None, mode: str = "auto") -> List[int]:
    """Greedy tokens of one prompt ``embeds`` [1, L, D] on backbone ``lm``: the prefill, then
    decode steps until a stop id or ``max_new_tokens`` (the stop id excluded). The runtime keeps
    one :class:`GreedyDecoder` instead (its static cache and graphs outlive a request)."""
    return GreedyDecoder(lm, mode).generate([embeds], [max_new_tokens], [position_ids],
                                            stop_ids)[0]


def _prompt_lengths(embeds, max_new_tokens, position_ids, lengths) -> List[int]:
    """Each prompt's length, checked against the token limits and positions given: ``embeds``
    a list of [1, L_b, D], or one right-padded [B, L, D] tensor with its ``lengths``."""
    packed = lengths is not None
    B = int(embeds.shape[0]) if packed else len(embeds)
    if B < 1 or len(max_new_tokens) != B or len(position_ids) != B:
        raise ValueError(f"generate: {B} prompts, {len(max_new_tokens)} token limits and "
                         f"{len(position_ids)} position tensors")
    if not packed:
        return [int(e.shape[1]) for e in embeds]
    lengths = [int(n) for n in lengths]
    if len(lengths) != B or embeds.ndim != 3 or max(lengths) != embeds.shape[1]:
        raise ValueError(f"generate: packed embeds {tuple(embeds.shape)} do not hold "
                         f"rows of lengths {lengths}")
    return lengths


def _take(ids: Sequence[int], gens: List[List[int]], done: List[bool], max_new_tokens,
          stop_ids, on_token) -> None:
    """Append each running row's new id to its answer (``on_token(row, id)`` as it is decided),
    or mark the row done at a stop id or its token limit."""
    for b, i in enumerate(ids):
        if done[b]:
            continue
        if len(gens[b]) >= max_new_tokens[b] or i in stop_ids:
            done[b] = True
            continue
        gens[b].append(i)
        if on_token is not None:
            on_token(b, i)
        done[b] = len(gens[b]) >= max_new_tokens[b]


@dataclass
class _Prompts:
    """The prompts of one :meth:`GreedyDecoder.generate` call, as it takes them."""
    embeds: Sequence[torch.Tensor]
    max_new_tokens: Sequence[int]
    position_ids: Sequence[Optional[torch.Tensor]]
    lengths: Optional[Sequence[int]] = None


@dataclass
class PrefixCache:
    """The KV cache of a prompt's first ``length`` rows, shared by later prompts that begin with
    the same rows (``VideoRouter(prefix_cache=True)``: the visual prefix of questions on one
    video with one plan). ``cache`` is None until a prefill fills it.

    A prompt with a prefix is always prefilled in two passes -- the prefix (skipped once cached),
    then the rest over a copy of the prefix's cache -- so its logits do not depend on whether
    the prefix was cached: the first question and the later ones are computed the same way."""
    length: int
    cache: object = None


class GreedyDecoder:
    """Prefill + greedy decoding over a backbone ``lm`` in one of :data:`DECODING_MODES`."""

    def __init__(self, lm, mode: str = "auto", bucket: int = 1024):
        """``bucket``: the static cache's length is ``prompt + max_new_tokens`` rounded up to a
        multiple (one compiled step per size; a request that fits the cache already there
        reuses it)."""
        self.lm = lm
        self.mode = resolve_decoding(mode, lm.device)
        if self.mode != "dynamic" and not getattr(lm, "static_kv_cache", True):
            raise ValueError(f"decoding {mode!r}: backbone {lm.family!r} keeps a recurrent state "
                             f"besides keys and values, which the static KV cache does not hold; "
                             f"use 'dynamic' (or 'auto')")
        if not isinstance(bucket, int) or bucket < 1:
            raise ValueError(f"bucket: expected an int >= 1, got {bucket!r}")
        self.bucket = bucket
        self._cache = None          # the reused StaticCache
        self._cache_key = None      # (batch, max_cache_len)
        self._step = None           # compiled decode_one_token (graph mode)
        self.fallback: Optional[str] = None  # why graph mode fell back to static, if it did

    def release(self) -> None:
        """Free the static cache and the captured graphs (the next request rebuilds them)."""
        self._cache = self._cache_key = self._step = None

    # ------------------------------------------------------------------ static cache
    def _static_cache(self, batch: int, length: int):
        """A StaticCache for ``batch`` rows of at least ``length`` slots, reset; reused while it
        is big enough (same addresses -> captured graphs stay valid)."""
        from transformers import StaticCache
        size = -(-length // self.bucket) * self.bucket
        key = self._cache_key
        if key is None or key[0] != batch or key[1] < length:
            self.release()
            self._cache = StaticCache(config=self.lm.text_config, max_cache_len=size)
            self._cache_key = (batch, size)
        else:
            self._cache.reset()
        return self._cache

    @property
    def compiles(self) -> bool:
        """The decode step is compiled (modes "compiled" and "graph")."""
        return self.mode in ("compiled", "graph")

    def _step_fn(self):
        if not self.compiles:
            return decode_one_token
        if self._step is None:
            # reduce-overhead: CUDA graphs over the whole step; dynamic=False: one graph per
            # cache size and batch (the cache is reused, so its addresses stay fixed).
            kw = {"mode": "reduce-overhead"} if self.mode == "graph" else {}
            self._step = torch.compile(decode_one_token, dynamic=False, **kw)
        return self._step

    @torch.inference_mode()
    def warm_up(self, slots: int = DEFAULT_WARM_SLOTS, steps: int = 3) -> dict:
        """Compile (and in graph mode capture) the decode step now, for a static cache of at
        least ``slots`` slots, batch 1, on a short random prompt: a later request whose prompt
        and new tokens fit reuses that cache and its compiled step. The seconds it took (0 in
        the eager modes, which compile nothing)."""
        if not self.compiles:
            return {"mode": self.mode, "seconds": 0.0}
        if not isinstance(slots, int) or slots <= 8 + steps:
            raise ValueError(f"slots: expected an int > {8 + steps}, got {slots!r}")
        t0 = time.perf_counter()
        g = torch.Generator().manual_seed(0)
        x = torch.randn(1, 8, self.lm.hidden_size, generator=g).to(self.lm.device, self.lm.dtype)
        # the prompt's length plus the steps ask for the whole cache: it is made at ``slots``
        self._generate(_Prompts([x], [slots - 8], [None]), stop_ids=set(), timer=None,
                       max_steps=steps)
        if torch.device(self.lm.device).type == "cuda":
            torch.cuda.synchronize(self.lm.device)
        return {"mode": self.mode, "slots": self._cache_key[1] if self._cache_key else None,
                "seconds": round(time.perf_counter() - t0, 3)}

    # ------------------------------------------------------------------ the loop
    @torch.inference_mode()
    def generate(self, embeds: Sequence[torch.Tensor], max_new_tokens: Sequence[int],
                 position_ids: Sequence[Optional[torch.Tensor]], stop_ids,
                 timer=None, on_token=None,
                 lengths: Optional[Sequence[int]] = None,
                 prefix: Optional[PrefixCache] = None) -> List[List[int]]:
        """Greedy decoding of B requests: ``embeds`` [1, L_b, D] each, ``position_ids`` as the
        backbone builds them for that prompt (None: 1-D 0..L_b-1). Returns the new ids of each
        request (its stop id excluded). Stages "prefill" and "generate" go to ``timer``.

        ``lengths``: ``embeds`` is instead one tensor [B, L, D], already right-padded (rows past
        ``lengths[b]`` zero, as this class pads: ``reconstruct_embeds_batch`` packs the whole
        batch into it), so the prefill reads it without another copy.

        ``prefix`` (one request): its first ``prefix.length`` rows are the cached prefix's (see
        :class:`PrefixCache`); filled here on first use.

        If graph capture fails (a torch.compile error on this model or library version), the
        request is redone with the static cache run eagerly -- the same tokens -- and so is
        every later one; ``self.fallback`` says why and the runtime's report notes it.

        ``on_token(row, id)``, if given, is called with each new id as it is decided (streaming;
        the stop id is not passed). A redone request calls it again from its first token."""
        prompts = _Prompts(embeds, max_new_tokens, position_ids, lengths)
        try:
            return self._generate(prompts, stop_ids, timer, on_token, prefix)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 -- any capture failure; redone eagerly below
            if not self.compiles:
                raise
            import warnings
            what = "CUDA-graph" if self.mode == "graph" else "compiled"
            self.fallback = (f"{what} decoding failed ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:200] if str(e) else ''}); decoding "
                             f"with the static cache, eagerly")
            warnings.warn(self.fallback, RuntimeWarning, stacklevel=2)
            self.mode = "static"
            self.release()
            return self._generate(prompts, stop_ids, timer, on_token, prefix)

    def _generate(self, prompts: "_Prompts", stop_ids, timer, on_token=None, prefix=None,
                  max_steps=None):
        """One try of :meth:`generate`: the prefill (:func:`prefill`), then the decode steps."""
        from .telemetry.timing import StageTimer
        lm = self.lm
        embeds, max_new_tokens, position_ids = (prompts.embeds, prompts.max_new_tokens,
                                                prompts.position_ids)
        packed = prompts.lengths is not None   # one right-padded [B, L, D] tensor, not a list
        lengths = _prompt_lengths(embeds, max_new_tokens, position_ids, prompts.lengths)
        timer = timer or StageTimer(lm.device)
        nxt_pos = [lm.next_position(p, n) for p, n in zip(position_ids, lengths)]
        with timer.stage("prefill"):
            x, pos = self._batch_prompts(embeds, position_ids, lengths, nxt_pos, packed)
            nxt, cache = prefill(lm, x, pos, lengths, prefix)
            del x
        with timer.stage("generate"):
            gens = self._decode(nxt, cache, lengths, nxt_pos, max_new_tokens, stop_ids, on_token,
                                max_steps)
        return gens

    def _decode(self, nxt, cache, lengths, nxt_pos, max_new_tokens, stop_ids, on_token,
                max_steps=None):
        """Greedy steps from the prefill's first tokens ``nxt`` [B] and its ``cache`` until
        every row stops (a stop id, or its ``max_new_tokens``) -> the new ids of each row.
        ``max_steps`` (warm-up): stop after that many steps whatever the rows' limits."""
        lm = self.lm
        B, L = len(lengths), max(lengths)
        limit = max(max_new_tokens)
        cache, mask = self._decode_cache(cache, lengths, limit)
        step_pos = self._step_positions(nxt_pos, B)
        step = self._step_fn()
        token = torch.empty(B, 1, dtype=torch.long, device=lm.device)
        gens: List[List[int]] = [[] for _ in range(B)]
        done = [False] * B
        slot = L
        while True:
            # one host sync per step: stopping on EOS needs the ids
            _take(nxt.tolist(), gens, done, max_new_tokens, stop_ids, on_token)
            if all(done):
                break
            token.copy_(nxt.view(B, 1))
            m = None
            if mask is not None:
                mask[:, slot] = 1
                m = mask if self.mode != "dynamic" else mask[:, :slot + 1]
            if self.mode == "graph":
                torch.compiler.cudagraph_mark_step_begin()
            nxt = step(lm, token, cache, step_pos, m).clone()
            step_pos += 1
            slot += 1
            if max_steps is not None and slot - L >= max_steps:
                break
        del cache
        return gens

    def _decode_cache(self, cache, lengths, limit: int):
        """The cache the decode steps write (the prefill's, or in static and graph modes the
        reused static cache filled with it) and, for right-padded rows, the attention mask that
        hides each row's padding (None: no padding, or no step to run)."""
        B, L = len(lengths), max(lengths)
        if self.mode != "dynamic" and limit > 1:
            static = self._static_cache(B, L + limit)
            for i, layer in enumerate(cache.layers):
                static.update(layer.keys, layer.values, i)
            cache = static
        mask = None
        if any(n != L for n in lengths) and limit > 1:
            size = self._cache_key[1] if self.mode != "dynamic" else L + limit
            mask = torch.zeros(B, size, dtype=torch.long, device=self.lm.device)
            for b, n in enumerate(lengths):
                mask[b, :n] = 1
        return cache, mask

    def _batch_prompts(self, embeds, position_ids, lengths, nxt_pos, packed=False):
        """Right-pad B prompts to the longest: embeds [B, L, D] and positions (the padding rows
        continue each prompt's positions; causal attention keeps them out of the real rows).
        ``packed``: ``embeds`` is that [B, L, D] tensor already."""
        B, L = len(lengths), max(lengths)
        if B == 1:
            return (embeds if packed else embeds[0]), position_ids[0]
        if packed:
            x = embeds
        else:
            x = embeds[0].new_zeros(B, L, embeds[0].shape[-1])
            for b, e in enumerate(embeds):
                x[b, :lengths[b]] = e[0]
        if all(p is None for p in position_ids):
            return x, None   # the decoder's 1-D 0..L-1 is every row's own
        rows = []
        for p, n, nx in zip(position_ids, lengths, nxt_pos):
            p = self._explicit_positions(p, n)
            pad = torch.arange(nx, nx + L - n, device=p.device, dtype=p.dtype)
            rows.append(torch.cat([p, pad.expand(*p.shape[:-1], L - n)], -1))
        return x, torch.cat(rows, -2)

    def _explicit_positions(self, p, n):
        if p is not None:
            return p.to(self.lm.device)
        step = self.lm.step_position_ids(0)
        shape = (1, n) if step is None else (*step.shape[:-1], n)
        return torch.arange(n, device=self.lm.device).expand(shape)

    def _step_positions(self, nxt_pos: Sequence[int], B: int) -> torch.Tensor:
        """Positions of the B rows' first decoded tokens, as a tensor the loop advances in place
        (a decoded token is text: every axis of M-RoPE at the same value)."""
        step = self.lm.step_position_ids(0)
        shape = (B, 1) if step is None else (*step.shape[:-2], B, 1)
        pos = torch.tensor(nxt_pos, dtype=torch.long, device=self.lm.device).view(B, 1)
        return pos.expand(shape).contiguous()


__all__ = ["AUTO_DECODING", "DECODING_MODES", "DEFAULT_WARM_SLOTS", "GreedyDecoder", "PrefixCache",
           "decode_one_token", "generate", "prefill", "resolve_decoding", "use_compile_cache"]
