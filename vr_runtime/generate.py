"""Greedy decoding after the prefill, for one request or a batch of them.

Three ways to run the decode steps (``VideoRouter(decoding=...)``), all giving the same tokens:

``dynamic``  transformers' growing ``DynamicCache``, one eager forward per token (the original
             path; the default on CPU, where there is no launch overhead to remove).
``static``   the prefill's keys and values copied into a preallocated ``StaticCache``; every
             decode step then has one fixed shape (``decode_one_token``), run eagerly.
``graph``    the static path with ``decode_one_token`` compiled by
             ``torch.compile(mode="reduce-overhead")``: CUDA graphs replay a whole step in one
             launch (the gpt-fast pattern), for CUDA, where decoding an 8B model eagerly is
             bound by the host (about 1,900 kernel launches a token). Opt-in until it has been
             measured on a GPU (bench/gpu_run.sh): ``auto`` stays ``dynamic`` everywhere,
             because the first answer of each cache size pays an unmeasured compile.

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
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from .backbones.base import output_cache

DECODING_MODES = ("auto", "dynamic", "static", "graph")


def resolve_decoding(mode: str, device: torch.device) -> str:
    """``auto`` -> ``dynamic`` (graph mode is opt-in until measured on a GPU: see the module
    docstring); other modes are checked."""
    if mode not in DECODING_MODES:
        raise ValueError(f"decoding: expected one of {', '.join(DECODING_MODES)}, got {mode!r}")
    if mode == "auto":
        return "dynamic"
    if mode == "graph" and torch.device(device).type != "cuda":
        raise ValueError("decoding 'graph': CUDA graphs need a CUDA device; use 'static' or "
                         "'dynamic' on " + torch.device(device).type)
    return mode


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

    def __init__(self, lm, mode: str = "auto", bucket: int = 1024,
                 graph_backend: str = "inductor"):
        """``bucket``: the static cache's length is ``prompt + max_new_tokens`` rounded up to a
        multiple (one captured graph per size). ``graph_backend`` (mode "graph"): "inductor"
        (``torch.compile(mode="reduce-overhead")``: fused kernels, then CUDA graphs) or
        "cudagraphs" (the eager kernels recorded into CUDA graphs: a much shorter compile)."""
        self.lm = lm
        self.mode = resolve_decoding(mode, lm.device)
        if self.mode != "dynamic" and not getattr(lm, "static_kv_cache", True):
            raise ValueError(f"decoding {mode!r}: backbone {lm.family!r} keeps a recurrent state "
                             f"besides keys and values, which the static KV cache does not hold; "
                             f"use 'dynamic' (or 'auto')")
        if not isinstance(bucket, int) or bucket < 1:
            raise ValueError(f"bucket: expected an int >= 1, got {bucket!r}")
        if graph_backend not in ("inductor", "cudagraphs"):
            raise ValueError(f"graph_backend: expected 'inductor' or 'cudagraphs', got "
                             f"{graph_backend!r}")
        self.bucket = bucket
        self.graph_backend = graph_backend
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

    def _step_fn(self):
        if self.mode != "graph":
            return decode_one_token
        if self._step is None:
            # reduce-overhead: CUDA graphs over the whole step; dynamic=False: one graph per
            # cache size and batch (the cache is reused, so its addresses stay fixed).
            if self.graph_backend == "cudagraphs":
                self._step = torch.compile(decode_one_token, backend="cudagraphs", dynamic=False)
            else:
                self._step = torch.compile(decode_one_token, mode="reduce-overhead",
                                           dynamic=False)
        return self._step

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
        try:
            return self._generate(embeds, max_new_tokens, position_ids, stop_ids, timer,
                                  on_token, lengths, prefix)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 -- any capture failure; redone eagerly below
            if self.mode != "graph":
                raise
            import warnings
            self.fallback = (f"CUDA-graph decoding failed ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:200] if str(e) else ''}); decoding "
                             f"with the static cache, eagerly")
            warnings.warn(self.fallback, RuntimeWarning, stacklevel=2)
            self.mode = "static"
            self.release()
            return self._generate(embeds, max_new_tokens, position_ids, stop_ids, timer,
                                  on_token, lengths, prefix)

    def _generate(self, embeds, max_new_tokens, position_ids, stop_ids, timer, on_token=None,
                  lengths=None, prefix=None):
        """One try of :meth:`generate`: the prefill (:func:`prefill`), then the decode steps."""
        from .telemetry.timing import StageTimer
        lm = self.lm
        packed = lengths is not None   # one right-padded [B, L, D] tensor, not a list
        lengths = _prompt_lengths(embeds, max_new_tokens, position_ids, lengths)
        timer = timer or StageTimer(lm.device)
        nxt_pos = [lm.next_position(p, n) for p, n in zip(position_ids, lengths)]
        with timer.stage("prefill"):
            x, pos = self._batch_prompts(embeds, position_ids, lengths, nxt_pos, packed)
            nxt, cache = prefill(lm, x, pos, lengths, prefix)
            del x
        with timer.stage("generate"):
            gens = self._decode(nxt, cache, lengths, nxt_pos, max_new_tokens, stop_ids, on_token)
        return gens

    def _decode(self, nxt, cache, lengths, nxt_pos, max_new_tokens, stop_ids, on_token):
        """Greedy steps from the prefill's first tokens ``nxt`` [B] and its ``cache`` until
        every row stops (a stop id, or its ``max_new_tokens``) -> the new ids of each row."""
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


__all__ = ["DECODING_MODES", "GreedyDecoder", "PrefixCache", "decode_one_token", "prefill",
           "generate", "resolve_decoding"]
