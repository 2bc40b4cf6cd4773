"""The dual routers of VideoRouter (paper Section 3.1) and their safetensors format.

* :class:`ShadowStack` -- a separate copy of the first ``k`` decoder layers of the language model
  and its rotary embedding: ``H_q = E_1:k(Emb(q))`` and ``H_vq^t = E_1:k([Z_t; Emb(q)])``. It is a
  ``k``-layer instance of the backbone's own decoder class (``Qwen2Model`` for InternVL3), called
  with ``inputs_embeds``, so causal masks, padding masks and rotary positions are handled by
  transformers itself across versions. Its embedding table is dropped (inputs are embeddings)
  and its final norm is an identity: the features are the raw residual stream after layer ``k``.
* :class:`SemanticRouter` -- masked mean pooling over the question tokens, then
  LayerNorm -> Linear -> GELU -> Linear(2): logits over {0: Global, 1: Fragment}.
* :class:`ImageRouter` -- LayerNorm + projection D -> ``router_dim``, a learnable [CLS] token
  prepended, one pre-norm Transformer block, and a frame-score MLP on the [CLS] output -> one
  logit per frame; relevant iff sigmoid(logit) > ``threshold`` (0.5).
* :class:`Routers` -- the three together, ``save``/``load`` as safetensors with the
  :class:`RouterConfig` as JSON metadata (never pickle).
"""
from __future__ import annotations

import copy
import dataclasses
import json
import pathlib
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..backbones.base import cache_kwargs, deepstack_kwargs, output_cache
from ..errors import RouterWeightsError
from ..planning.policies import DEFAULT_THRESHOLD
from ..backbones.weights import copy_state_strict, nonfinite

FORMAT = "videorouter-routers-v1"

# Tokens per shadow-stack call when frame_batch is None. 8K tokens saturate a GPU while keeping
# the 8B MLP intermediates (8K x 18944 x 2 bytes, a few of them) near 1 GB, inside the 20 GB target.
MAX_ROUTER_TOKENS = 8192


def pool_frames(Z: torch.Tensor, window: int, grid=(16, 16)) -> torch.Tensor:
    """[T, H*W, D] -> [T, ceil(H/w)*ceil(W/w), D]: every frame mean-pooled with one window."""
    from vr_kernels import pool_pack, pooled_counts
    T, N, D = Z.shape
    if grid[0] * grid[1] != N:
        raise ValueError(f"grid: {grid} does not hold the {N} tokens of a frame")
    n = pooled_counts([window], grid)[0]
    kw = {"backend": "torch"} if Z.device.type == "cpu" else {}
    return pool_pack(Z.contiguous(), [window] * T, grid, **kw).view(T, n, D)


def pooled_grid(grid, window: int):
    return (-(-grid[0] // window), -(-grid[1] // window))


@dataclass
class RouterConfig:
    num_layers: int = 4            # k: decoder layers copied into the shadow stack
    hidden_size: int = 0           # D of the language model (filled in by from_backbone)
    router_dim: Optional[int] = None      # Image Router width (None: 256 if D <= 1024 else 1024)
    num_heads: int = 8             # heads of the Image Router's Transformer block
    ffn_mult: int = 4              # MLP width of that block = ffn_mult * router_dim
    semantic_hidden: Optional[int] = None  # Semantic Router MLP width (None: as router_dim)
    num_classes: int = 2           # 0 = Global, 1 = Fragment
    threshold: float = DEFAULT_THRESHOLD  # frame relevant iff sigmoid(logit) > threshold
    # Window (as in vr_kernels) applied to Z_t before the shadow stack. 1 = the paper: all 256
    # tokens of a frame. 2 = a 2x2 mean pool, 64 tokens: ~4x cheaper Image Router. Saved with
    # the weights because routers should be trained with the pooling they run with.
    router_pool: int = 1

    def resolved(self, hidden_size: int) -> "RouterConfig":
        c = dataclasses.replace(self, hidden_size=int(hidden_size))
        if c.router_dim is None:
            c.router_dim = 256 if hidden_size <= 1024 else 1024
        if c.semantic_hidden is None:
            c.semantic_hidden = c.router_dim
        for name in ("num_layers", "router_dim", "num_heads", "ffn_mult", "semantic_hidden",
                     "router_pool"):
            v = getattr(c, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"RouterConfig.{name}: expected an int >= 1, got {v!r}")
        if c.router_dim % c.num_heads:
            raise ValueError(f"RouterConfig.router_dim {c.router_dim} is not divisible by "
                             f"num_heads {c.num_heads}")
        if not 0.0 < c.threshold < 1.0:
            raise ValueError(f"RouterConfig.threshold: expected a probability in (0, 1), got {c.threshold}")
        return c

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "RouterConfig":
        d = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise RouterWeightsError(f"router config has unknown fields {unknown}")
        return cls(**d)


# ----------------------------------------------------------------------------- shadow stack
class ShadowStack(nn.Module):
    """E_1:k: a k-layer copy of the backbone decoder (weights copied when ``model`` is given)."""

    def __init__(self, text_config, num_layers: int, source: Optional[nn.Module] = None):
        super().__init__()
        from transformers import AutoModel
        n_src = int(text_config.num_hidden_layers)
        if num_layers > n_src:
            raise ValueError(f"num_layers: the shadow stack copies {num_layers} layers but the "
                             f"language model has only {n_src}")
        cfg = copy.deepcopy(text_config)
        cfg.num_hidden_layers = num_layers
        if getattr(cfg, "layer_types", None) is not None:
            cfg.layer_types = list(cfg.layer_types)[:num_layers]
        cfg.vocab_size = 1  # embeddings come in precomputed; do not allocate a vocab-sized table
        cfg.pad_token_id = None  # (a real pad id, e.g. 151643, is not a valid row of that table)
        kw = {}
        attn = getattr(text_config, "_attn_implementation", None)
        if attn:
            kw["attn_implementation"] = attn
        from ..backbones.base import no_init_weights
        dev, dt = torch.device("cpu"), torch.float32
        if source is not None:  # build on the source's device in its dtype (4 8B layers: ~2 GB)
            p = next(source.parameters())
            dev, dt = p.device, p.dtype
        with no_init_weights(), torch.device(dev):
            decoder = AutoModel.from_config(cfg, dtype=dt, **kw)
        decoder.embed_tokens = None
        decoder.norm = nn.Identity()  # features = residual stream after layer k (no final norm)
        self.decoder = decoder
        if source is not None:
            with torch.no_grad():
                for i in range(num_layers):
                    self.decoder.layers[i].load_state_dict(source.layers[i].state_dict())
            self.decoder.rotary_emb = copy.deepcopy(source.rotary_emb)

    @staticmethod
    def _pos(position_ids):
        return {} if position_ids is None else {"position_ids": position_ids}

    def _inputs(self, x: torch.Tensor) -> dict:
        """``inputs_embeds`` and, for wide rows [B, L, S*D] (a backbone whose Z carries
        DeepStack streams), the decoder's DeepStack arguments: the shadow stack adds them after
        its layers exactly as the backbone's LLM does."""
        D = int(self.decoder.config.hidden_size)
        kw = deepstack_kwargs(x, D)
        return {"inputs_embeds": x[..., :D] if kw else x, **kw}

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x [B, L, D] (or [B, L, S*D] with DeepStack streams) -> [B, L, D]; ``mask`` [B, L]
        (1 = token) or None for no padding; ``position_ids`` as the backbone's decoder takes
        them (None: 0..L-1)."""
        out = self.decoder(**self._inputs(x), attention_mask=mask, use_cache=False,
                           return_dict=True, **self._pos(position_ids))
        return out.last_hidden_state

    def prefix(self, x: torch.Tensor, position_ids: Optional[torch.Tensor] = None):
        """Run a (question-independent) prefix x [B, N, D]; -> (H [B, N, D], KV cache)."""
        out = self.decoder(**self._inputs(x), use_cache=True, return_dict=True,
                           **self._pos(position_ids))
        return out.last_hidden_state, output_cache(out)

    def extend(self, x: torch.Tensor, cache, position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Continue after :meth:`prefix`: x [B, L, D] at positions N..N+L-1 (or ``position_ids``)
        -> H [B, L, D]. Works on a deep copy, so one prefix cache serves any number of questions."""
        out = self.decoder(**self._inputs(x), **cache_kwargs(self.decoder, copy.deepcopy(cache)),
                           use_cache=True, return_dict=True, **self._pos(position_ids))
        return out.last_hidden_state


# ----------------------------------------------------------------------------- heads
class SemanticRouter(nn.Module):
    def __init__(self, cfg: RouterConfig):
        super().__init__()
        D, h = cfg.hidden_size, cfg.semantic_hidden
        self.norm = nn.LayerNorm(D)
        self.fc1 = nn.Linear(D, h)
        self.fc2 = nn.Linear(h, cfg.num_classes)

    def forward(self, H: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """H [B, L, D], mask [B, L] -> logits [B, num_classes] (masked mean pooling)."""
        if mask is None:
            pooled = H.float().mean(1)
        else:
            m = mask.to(torch.float32).unsqueeze(-1)
            pooled = (H.float() * m).sum(1) / m.sum(1).clamp_min(1.0)
        pooled = pooled.to(self.fc1.weight.dtype)
        return self.fc2(F.gelu(self.fc1(self.norm(pooled))))


class Block(nn.Module):
    """Pre-norm Transformer block (self-attention + GELU MLP) on [B, L, r]."""

    def __init__(self, dim: int, heads: int, ffn_mult: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, ffn_mult * dim)
        self.fc2 = nn.Linear(ffn_mult * dim, dim)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        B, L, C = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, L, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        am = None if mask is None else mask.bool()[:, None, None, :]
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=am)
        x = x + self.proj(a.transpose(1, 2).reshape(B, L, C))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ImageRouter(nn.Module):
    def __init__(self, cfg: RouterConfig):
        super().__init__()
        D, r = cfg.hidden_size, cfg.router_dim
        self.norm_in = nn.LayerNorm(D)
        self.proj = nn.Linear(D, r)
        self.cls = nn.Parameter(torch.zeros(1, 1, r))
        self.block = Block(r, cfg.num_heads, cfg.ffn_mult)
        self.norm_out = nn.LayerNorm(r)
        self.score = nn.Sequential(nn.Linear(r, r), nn.GELU(), nn.Linear(r, 1))

    def forward(self, H: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """H [B, L, D] (shadow-stack features of [Z_t; q]) -> frame logits [B]."""
        x = self.proj(self.norm_in(H))
        x = torch.cat([self.cls.expand(x.shape[0], 1, -1).to(x.dtype), x], 1)
        if mask is not None:
            mask = torch.cat([mask.new_ones(mask.shape[0], 1), mask], 1)
        x = self.block(x, mask)
        return self.score(self.norm_out(x[:, 0])).squeeze(-1)


def _init_head(module: nn.Module, generator: torch.Generator) -> None:
    """Deterministic init of the heads: N(0, 0.02) matrices, zero biases, unit norms."""
    with torch.no_grad():
        for name, p in sorted(module.named_parameters(), key=lambda kv: kv[0]):
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "bias":
                p.zero_()
            elif p.ndim == 1:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.02)


@dataclass
class VisualCache:
    """Shadow-stack state over each frame's visual tokens, per chunk of frames."""
    chunks: list          # [(H_z [b, N, D], KV cache of the decoder)], frames in order
    num_frames: int
    tokens: int           # N per frame (after router_pool)
    router_pool: int
    grid: tuple           # the pooled token grid of each frame


# ----------------------------------------------------------------------------- both routers
class Routers(nn.Module):
    """Shadow stack + Semantic Router + Image Router. ``trained`` is False until weights are
    loaded (or set by training); the runtime then refuses to let ``auto`` pretend to route.
    ``runner``: a :class:`~vr_runtime.routing.compiled.RouterRunner` that :meth:`frame_logits`
    hands its frames to (fixed shapes, compiled) when no ``frame_batch`` is asked for."""

    runner = None

    def __init__(self, cfg: RouterConfig, text_config, source: Optional[nn.Module] = None,
                 seed: int = 0, positions=None):
        super().__init__()
        self.config = cfg
        # The backbone's positions for [Z_t; q] (Backbone.router_position_ids), None = 1-D.
        self.positions = positions
        self.shadow = ShadowStack(text_config, cfg.num_layers, source)
        self.semantic = SemanticRouter(cfg)
        self.image = ImageRouter(cfg)
        g = torch.Generator().manual_seed(seed)
        _init_head(self.semantic, g)
        _init_head(self.image, g)
        p = next(self.shadow.parameters())
        self.semantic.to(device=p.device, dtype=p.dtype)
        self.image.to(device=p.device, dtype=p.dtype)
        self.trained = False

    def to_model(self, device, dtype) -> "Routers":
        """Move to ``device`` and cast *parameters* to ``dtype``. Unlike ``.to(dtype)`` this keeps
        the rotary ``inv_freq`` buffer in fp32, as in the backbone."""
        self.to(device)
        with torch.no_grad():
            for p in self.parameters():
                if p.dtype != dtype:
                    p.data = p.data.to(dtype)
        return self

    @classmethod
    def from_backbone(cls, bb, cfg: Optional[RouterConfig] = None, seed: int = 0) -> "Routers":
        """Routers for a :class:`~vr_runtime.backbones.Backbone`: the shadow stack is a deep copy
        of its decoder's first ``cfg.num_layers`` layers + rotary embedding (positions as the
        backbone lays out [Z_t; q]); the heads are new."""
        tcfg = bb.text_config
        cfg = (cfg or RouterConfig()).resolved(int(tcfg.hidden_size))
        routers = cls(cfg, tcfg, source=bb.decoder(), seed=seed,
                      positions=bb.router_position_ids).eval()
        routers.backbone = bb.family   # saved with the weights: loading checks it
        return routers

    def _positions(self, tokens_grid, num_text: int, batch: int, device):
        if self.positions is None:
            return None
        pos = self.positions(tokens_grid, num_text, batch)
        return None if pos is None else pos.to(device)

    # -- routing
    def policy_logits(self, q_embeds: torch.Tensor, q_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """q_embeds [B, Lq, D] (token embeddings of the question), q_mask [B, Lq] -> [B, 2]."""
        if q_embeds.ndim == 2:
            q_embeds = q_embeds.unsqueeze(0)
        if q_mask is not None and bool(q_mask.all()):
            q_mask = None  # no padding: let attention take the plain causal path
        H = self.shadow(q_embeds, q_mask)
        return self.semantic(H, q_mask)

    def frame_logits(self, Z: torch.Tensor, q_embeds: torch.Tensor,
                     frame_batch: Optional[int] = None, router_pool: Optional[int] = None,
                     grid=(16, 16)) -> torch.Tensor:
        """Z [T, N, D] and q_embeds [Lq, D] -> one logit per frame [T].

        Each frame's sequence is [Z_t; Emb(q)] through the shadow stack and the Image Router
        head, ``frame_batch`` frames per call (None: as many as fit ``MAX_ROUTER_TOKENS``).
        ``router_pool`` (None: ``config.router_pool``) mean-pools Z_t on its ``grid`` first."""
        if Z.ndim != 3 or q_embeds.ndim != 2 or Z.shape[-1] % q_embeds.shape[-1]:
            raise ValueError(f"frame_logits: expected Z [T, N, D] (or [T, N, S*D] with "
                             f"DeepStack streams) and q_embeds [Lq, D], got "
                             f"{tuple(Z.shape)} and {tuple(q_embeds.shape)}")
        pool = self.config.router_pool if router_pool is None else router_pool
        if not isinstance(pool, int) or isinstance(pool, bool) or pool < 1:
            raise ValueError(f"router_pool: expected an int window >= 1, got {pool!r}")
        if pool > 1:
            Z = pool_frames(Z, pool, grid)
        T, N, D = Z.shape
        Lq = q_embeds.shape[0]
        explicit_batch = frame_batch
        if frame_batch is None:
            frame_batch = max(1, MAX_ROUTER_TOKENS // (N + Lq))
        if not isinstance(frame_batch, int) or frame_batch < 1:
            raise ValueError(f"frame_batch: expected an int >= 1 or None, got {frame_batch!r}")
        q = q_embeds.to(Z.dtype)
        if D != q.shape[-1]:   # question rows carry no DeepStack stream: zeros there
            q = torch.cat([q, q.new_zeros(Lq, D - q.shape[-1])], -1)
        tg = pooled_grid(grid, pool)
        if self.runner is not None and self.runner.tokens == N and explicit_batch is None:
            return self.runner.logits(Z, q, tg)   # fixed shapes, compiled (routing.compiled)
        out = []
        for i in range(0, T, frame_batch):
            z = Z[i:i + frame_batch]
            x = torch.cat([z, q.unsqueeze(0).expand(z.shape[0], Lq, D)], 1)
            pos = self._positions(tg, Lq, z.shape[0], x.device)
            out.append(self.image(self.shadow(x, position_ids=pos)))
        return torch.cat(out, 0) if out else Z.new_zeros(0)

    def visual_cache(self, Z: torch.Tensor, frame_batch: Optional[int] = None,
                     router_pool: Optional[int] = None, grid=(16, 16)) -> "VisualCache":
        """The question-independent part of the Image Router for one video.

        The shadow stack is causal and Z_t comes before the question, so E_1:k's hidden states
        and KV cache over Z_t do not depend on the question: computed once here, a new question
        then costs only its Lq tokens per frame (:meth:`frame_logits_cached`). Exact up to
        floating-point reordering (tests compare it with :meth:`frame_logits`)."""
        pool = self.config.router_pool if router_pool is None else router_pool
        if pool > 1:
            Z = pool_frames(Z, pool, grid)
        T, N, _ = Z.shape
        fb = frame_batch or max(1, MAX_ROUTER_TOKENS // (N + 64))
        tg = pooled_grid(grid, pool)
        chunks = []
        for i in range(0, T, fb):
            z = Z[i:i + fb]
            pos = self._positions(tg, 0, z.shape[0], z.device)
            chunks.append(self.shadow.prefix(z, position_ids=None if pos is None else pos[..., :N]))
        return VisualCache(chunks=chunks, num_frames=T, tokens=N, router_pool=pool, grid=tg)

    def frame_logits_cached(self, cache: "VisualCache", q_embeds: torch.Tensor) -> torch.Tensor:
        """Frame logits [T] for a question, reusing a :meth:`visual_cache` of the video."""
        out = []
        Lq = q_embeds.shape[0]
        for H_z, kv in cache.chunks:
            b, N, D = H_z.shape
            q = q_embeds.to(H_z.dtype).unsqueeze(0).expand(b, -1, D)
            pos = self._positions(cache.grid, Lq, b, H_z.device)
            H_q = self.shadow.extend(q, kv, position_ids=None if pos is None else pos[..., N:])
            out.append(self.image(torch.cat([H_z, H_q], 1)))
        return torch.cat(out, 0)

    def frame_probs(self, Z, q_embeds, frame_batch=None, router_pool=None, grid=(16, 16)) -> torch.Tensor:
        return torch.sigmoid(self.frame_logits(Z, q_embeds, frame_batch, router_pool, grid).float())

    # -- persistence
    def save(self, path) -> None:
        """safetensors with the RouterConfig (JSON) and ``trained`` in the metadata."""
        from safetensors.torch import save_file
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        meta = {"format": FORMAT, "router_config": self.config.to_json(),
                "trained": "true" if self.trained else "false"}
        if getattr(self, "backbone", None):
            meta["backbone"] = self.backbone
        pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
        save_file(state, str(path), metadata=meta)

    @classmethod
    def load(cls, path, bb, device=None) -> "Routers":
        """Routers saved by :meth:`save`, checked against backbone ``bb``; ``RouterWeightsError`` on
        anything unreadable or that does not fit (names the field, key or shape)."""
        from safetensors import safe_open
        path = pathlib.Path(path)
        if not path.is_file():
            raise RouterWeightsError(f"router weights {str(path)!r}: no such file")
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                keys = list(f.keys())
                state = {k: f.get_tensor(k) for k in keys}
        except Exception as e:  # safetensors raises its own error types on corrupt headers
            raise RouterWeightsError(f"router weights {str(path)!r}: not a readable safetensors "
                                     f"file ({e})") from None
        bad = nonfinite(state.items())
        if bad:
            raise RouterWeightsError(f"router weights {str(path)!r}: {bad}; they come from a "
                                     f"training that diverged: use an earlier checkpoint's")
        if meta.get("format") != FORMAT or "router_config" not in meta:
            raise RouterWeightsError(f"router weights {str(path)!r}: no VideoRouter router config "
                                     f"in the metadata (expected format {FORMAT!r})")
        try:
            cfg = RouterConfig.from_json(meta["router_config"])
        except (ValueError, TypeError) as e:
            raise RouterWeightsError(f"router weights {str(path)!r}: bad router config ({e})") from None
        family = meta.get("backbone")
        if family and family != bb.family:   # files from before this field name none
            raise RouterWeightsError(
                f"router weights {str(path)!r}: trained on a {family} backbone, but the model "
                f"{bb.name!r} is {bb.family}; use routers trained for this model")
        tcfg = bb.text_config
        D = int(tcfg.hidden_size)
        if cfg.hidden_size != D:
            raise RouterWeightsError(
                f"router weights {str(path)!r}: trained for hidden size {cfg.hidden_size}, but the "
                f"model's language model has hidden size {D}; use routers trained for this model")
        if cfg.num_layers > int(tcfg.num_hidden_layers):
            raise RouterWeightsError(
                f"router weights {str(path)!r}: shadow stack of {cfg.num_layers} layers, but the "
                f"model has {tcfg.num_hidden_layers}")
        routers = cls.from_backbone(bb, cfg)
        misfit = copy_state_strict(routers, state, limit=4)
        if misfit:
            raise RouterWeightsError(f"router weights {str(path)!r} do not fit the model: {misfit}")
        routers.trained = meta.get("trained", "true") == "true"
        if device is not None:
            routers.to(device)
        return routers.eval()


def check_router_file(path) -> None:
    """``--routers``, checked before the model loads: the file is there (one line); what is in
    it is checked when the routers load against the model."""
    if path is not None and not pathlib.Path(path).is_file():
        raise RouterWeightsError(f"--routers {str(path)!r}: no such file")


def embed_question(model, tokenizer, question: str) -> torch.Tensor:
    """Emb(q): the language model's token embeddings of the bare question text -> [Lq, D]."""
    ids = tokenizer(question, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    if ids.numel() == 0:
        raise ValueError("question: empty after tokenisation; ask a non-empty question")
    emb = model.get_input_embeddings()
    return emb(ids.to(emb.weight.device))


__all__ = ["RouterConfig", "VisualCache", "pool_frames", "pooled_grid", "MAX_ROUTER_TOKENS", "ShadowStack", "SemanticRouter", "ImageRouter", "Routers",
           "embed_question", "FORMAT"]
