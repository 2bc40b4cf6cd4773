"""A cost model of VideoRouter's time to first token: per-stage FLOPs, bytes and a time floor.

    from vr_runtime.planning.cost_model import predict_ttft, DEVICES, cpu_device
    pred = predict_ttft("vr_runtime/configs/internvl3_8b.json", visual_tokens=6000, text_tokens=180,
                        num_frames=64, device=DEVICES["h100"])
    pred["stages_s"]  # {"vision": ..., "router": ..., "compress": ..., "prefill": ...}; pred["ttft_s"]

Stages, as the runtime times them (docs/CONTRACT.md section 3: TTFT = vision + router + compress + prefill):

* ``vision``   the vision tower over every sampled frame and the projector -> 256 tokens of width
               D per frame: InternViT (``image_size/patch`` squared patches plus CLS, full
               attention; pixel shuffle 0.5, LayerNorm, two linears) or Qwen2.5-VL's tower
               (32x32 patches, window attention but in a few full layers, SwiGLU; the 2x2
               merger), as the backbone's :class:`~.backbones.base.CostShape` describes;
* ``router``   the Shadow Stack (the first ``k`` decoder layers of the LLM) over each frame's
               ``[Z_t; question]`` (frames pooled by ``router_pool`` first) and over the question,
               plus the two small router heads; 0 for the baselines that route nothing;
* ``compress`` ``pool_pack``: reads the kept frames' tokens, writes the visual tokens into the
               prompt's embeddings; on a CPU its PyTorch path (one ``embedding_bag``, one
               ``index_copy_``: :data:`POOL_PACK_TORCH_OPS`) whose input streams from memory,
               plus the call's measured host cost;
* ``prefill``  the LLM over ``text + visual`` tokens (causal attention) and the LM head for the
               last position.

Attention is counted as its two matmuls (scores, values; half of each when causal); the score
matrix is assumed never materialised (fused attention: flash / SDPA kernels on GPU and CPU). Its
time counts the work the kernel really does: PyTorch's CPU flash kernel computes whole 512-key
blocks, so short causal sequences cost as much as non-causal ones (:func:`causal_key_fraction`).
The decoder layers issue the operators of the eager (HF) Qwen2 layer: RMSNorm as six operators,
rotary as five per tensor, separate q / k / v / gate / up projections.

Each stage's time is a floor: ``max(FLOPs / device.flops, bytes / device.bandwidth)`` summed
over its operations (matmuls are compute-bound, the rest memory-bound), plus, where a device
spec says so, a fixed cost per operator (host dispatch: it matters on a CPU with small shapes,
not on a GPU). FLOPs count a multiply-add as 2.

Device specs: H100 / H200 are nominal (dense bf16 tensor-core rate at an assumed 70% efficiency,
HBM bandwidth at 90%): predictions there are a MODEL, not a measurement. ``cpu_device()``
calibrates this machine: a measured matmul rate, copy bandwidth, per-operator overhead and the
fixed host cost of one ``pool_pack`` call.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Dict, Optional, Union

from ..backbones.base import CostShape


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    flops: float            # sustained matmul FLOP/s in the working dtype
    bandwidth: float        # sustained memory bytes/s
    op_overhead_s: float = 0.0   # fixed cost per operator (host dispatch)
    dtype_bytes: int = 2
    label: str = "model"
    # Optional ((width, FLOP/s), ...): the matmul rate when the smallest of its three dims is
    # ``width`` (narrow matmuls run far below peak on a CPU); interpolated in log(width).
    matmul_rates: Optional[tuple] = None
    # Optional ((head_dim, key_len, FLOP/s), ...): the fused attention kernel's rate (non-causal
    # FLOPs over time) by head dim and key length (on a CPU it is below the matmul rate, and lower
    # still for short sequences); interpolated in log(key_len) then log(head_dim), clamped at the
    # grid's edges. None: attention runs at ``flops``.
    attention_rates: Optional[tuple] = None
    # Causal attention's work: 0 counts the ideal half (a GPU flash kernel skips the masked tiles
    # at a fine grain); > 0 is the key-block size of PyTorch's CPU flash kernel, which computes
    # every key block that reaches the diagonal in full (see :func:`causal_key_fraction`).
    flash_kv_block: int = 0
    # Optional: bandwidth of data that fits in the last-level cache (an op touching at most
    # ``cache_bytes``); None: every op streams from memory at ``bandwidth``.
    cache_bandwidth: Optional[float] = None
    cache_bytes: float = 0.0
    # Fixed host cost of one pool_pack call (argument checks, the tile-table cache, dispatch):
    # measured on a CPU by cpu_device(); 0 in the nominal GPU specs (not measured here).
    pack_call_s: float = 0.0
    # CPU ``index_copy_`` (pool_pack's write into ``out``) runs far below the copy bandwidth, at
    # a cost per row plus a cost per element: measured by cpu_device(); 0: bandwidth-bound.
    index_copy_row_s: float = 0.0
    index_copy_element_s: float = 0.0

    def memory_bandwidth(self, nbytes: float) -> float:
        if self.cache_bandwidth and nbytes <= self.cache_bytes:
            return self.cache_bandwidth
        return self.bandwidth

    def attention_rate(self, head_dim: float, key_len: float) -> float:
        if not self.attention_rates:
            return self.flops
        by_hd: Dict[float, list] = {}
        for hd, n, r in self.attention_rates:
            by_hd.setdefault(hd, []).append((n, r))
        rows = tuple((hd, _interp(tuple(sorted(pts)), key_len, clamp=True)) for hd, pts in sorted(by_hd.items()))
        return _interp(rows, head_dim, clamp=True)

    def matmul_rate(self, m: float, k: float, n: float) -> float:
        if not self.matmul_rates:
            return self.flops
        return _interp(self.matmul_rates, max(1.0, min(m, k, n)))

    def to_dict(self) -> dict:
        return asdict(self)


def _interp(pts: tuple, w: float, clamp: bool = False) -> float:
    """Piecewise linear in log(w) through ``pts`` ((w, rate), ...); below the first point
    proportional to ``w`` (or, with ``clamp``, the first rate); above the last, the last rate."""
    if w <= pts[0][0]:
        return pts[0][1] if clamp else pts[0][1] * w / pts[0][0]
    for (w0, r0), (w1, r1) in zip(pts, pts[1:]):
        if w <= w1:
            a = (math.log(w) - math.log(w0)) / (math.log(w1) - math.log(w0))
            return r0 + a * (r1 - r0)
    return pts[-1][1]


DEVICES: Dict[str, DeviceSpec] = {
    # 989 TFLOP/s dense bf16 (SXM) x 0.7; 3.35 TB/s HBM3 x 0.9.
    "h100": DeviceSpec("NVIDIA H100 SXM (nominal)", 989e12 * 0.7, 3.35e12 * 0.9, 0.0, 2, "model"),
    # Same tensor cores, 4.8 TB/s HBM3e.
    "h200": DeviceSpec("NVIDIA H200 (nominal)", 989e12 * 0.7, 4.8e12 * 0.9, 0.0, 2, "model"),
}


def causal_key_fraction(q_len: int, k_len: int, kv_block: int) -> float:
    """Fraction of the full ``q_len x k_len`` score work a causal flash kernel does.

    ``kv_block`` 0: the ideal half. Otherwise PyTorch's CPU flash attention (aten
    ``FlashAttentionKernel.cpp``): queries in blocks of 32 / 64 / 256 rows (query length below
    192 / below 768 / from 768), and for each query block every ``kv_block``-key block up to the
    block's last row in full, masked or not. So up to ``kv_block`` keys causal attention costs as
    much as non-causal, and the saving tends to one half only for long sequences (0.75 at 1,024
    keys, 0.63 at 2,048; ``bench/scripts/bench_cost_model.py`` times causal against non-causal
    to check it)."""
    if kv_block <= 0:
        return 0.5
    q_block = 256 if q_len >= 768 else 64 if q_len >= 192 else 32
    off = k_len - q_len                     # queries see keys up to their own position + off
    work = 0
    for m in range(0, q_len, q_block):
        rows = min(q_block, q_len - m)
        keys = min(k_len, -(-(m + rows + off) // kv_block) * kv_block)
        work += rows * keys
    return work / float(q_len * k_len)


# The key-block size of PyTorch's CPU flash attention (aten FlashAttentionKernel.cpp).
CPU_FLASH_KV_BLOCK = 512


def cpu_device(threads: int = 1, dtype_bytes: int = 4, reps: int = 7) -> DeviceSpec:
    """This CPU, calibrated by microbenchmarks, each the median of ``reps`` (medians, as the stage
    times it is compared with: on a shared machine the best of a few runs is a quiet moment the
    stages never see).

    * fp32 matmul rates by width ([1024, w] @ [w, w] for w = 16 .. 1024);
    * bandwidth from memory (an add over 32 MB) and within the last-level cache (an add over 1 MB);
    * non-causal ``scaled_dot_product_attention`` rates by head dim (16 .. 128) and length
      (128, 512, 1,024 keys): short sequences run well below the long-sequence rate;
    * ``index_copy_``'s cost per row and per element (two shapes: 2,048 x 16, 256 x 1,024);
    * the fixed cost of a small operator (host dispatch);
    * the fixed host cost of one ``pool_pack`` call on the PyTorch path (argument checks, the
      cached index tables, one ``embedding_bag`` over next to no data).
    """
    import torch
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        # Each benchmark's tensors are made right before it runs: a small one run after others
        # have swept the cache takes several calls to run at its warm speed again.
        mm = []
        for w in (16, 32, 64, 128, 256, 512, 1024):
            a, b = torch.randn(1024, w), torch.randn(w, w)
            # (the narrow ones take microseconds: more runs for a steady median)
            mm.append((w, 2 * 1024 * w * w / _median(lambda: a @ b, reps * 3 if w <= 64 else reps)))
        x = torch.randn(8 * 2**20)
        y = torch.empty_like(x)
        bw = 2 * x.numel() * 4 / _median(lambda: torch.add(x, 1.0, out=y), reps)
        xs = torch.randn(256 * 1024)       # 1 MB: stays in cache
        ys = torch.empty_like(xs)
        cbw = 2 * xs.numel() * 4 / _median(lambda: torch.add(xs, 1.0, out=ys), reps * 3)
        att = []
        for hd in (16, 32, 64, 128):
            for n in (128, 512, 1024):                 # the rate is flat from about 1,024 keys
                seqs = 2**20 // (n * n)                # the same work at every length
                qkv = torch.randn(3, 1, seqs, n, hd)
                t = _median(lambda: torch.nn.functional.scaled_dot_product_attention(*qkv), reps)
                att.append((hd, n, 4 * seqs * n * n * hd / t))
        # index_copy_ (sorted rows, as pool_pack's out path): many narrow rows, then few wide
        # ones; solve t = rows * per_row + elements * per_element.
        ic = []
        for n, w in ((2048, 16), (256, 1024)):
            src, dst, idx = torch.randn(n, w), torch.zeros(n + 64, w), torch.arange(n) + 32
            ic.append((n, w, _median(lambda: dst.index_copy_(0, idx, src), reps)))
        (n1, w1, t1), (n2, w2, t2) = ic
        ic_el = max(0.0, (t2 / n2 - t1 / n1) / (w2 - w1))
        ic_row = max(0.0, t1 / n1 - w1 * ic_el)
        s = torch.randn(8, 8)
        op = _median(lambda: [s.add(1.0) for _ in range(100)], reps) / 100
        from vr_kernels import pool_pack
        z = torch.randn(4, 256, 8)      # a call with next to no data: its fixed cost
        pack = _median(lambda: pool_pack(z, [1, 2, 4, 0], (16, 16), backend="torch"), reps * 3)
    finally:
        torch.set_num_threads(prev)
    return DeviceSpec(f"CPU ({threads} thread{'s' if threads > 1 else ''}, calibrated)", max(r for _, r in mm),
                      bw, op_overhead_s=op, dtype_bytes=dtype_bytes, label="CPU calibrated",
                      matmul_rates=tuple(mm), attention_rates=tuple(att), flash_kv_block=CPU_FLASH_KV_BLOCK,
                      cache_bandwidth=cbw, cache_bytes=4 * 2**20, pack_call_s=pack,
                      index_copy_row_s=ic_row, index_copy_element_s=ic_el)


def _median(fn, reps: int) -> float:
    fn()
    ts = sorted(_timed(fn) for _ in range(reps))
    return ts[len(ts) // 2]


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ------------------------------------------------------------------------- shapes

# The dimensions come from the backbone (``Backbone.cost_shape``): each family reads its own
# config.json, so the model covers every registered backbone.
Shape = CostShape


def load_shape(config: Union[str, dict]) -> Shape:
    """``config``: a path to an HF ``config.json`` (or a directory holding one), or its dict;
    its ``model_type`` picks the backbone that reads it (InternVL3, Qwen2.5-VL, ...)."""
    from ..backbones import backbone_class
    if isinstance(config, (str, os.PathLike)):
        path = os.path.join(config, "config.json") if os.path.isdir(config) else config
        with open(path) as f:
            config = json.load(f)
    return backbone_class(config.get("model_type", "internvl")).cost_shape(config)


# ------------------------------------------------------------------------- costs

class _Stage:
    """Accumulates operators: FLOPs, bytes and the time floor of each."""

    def __init__(self, dev: DeviceSpec):
        self.dev = dev
        self.flops = 0.0
        self.bytes = 0.0
        self.seconds = 0.0
        self.ops = 0

    def matmul(self, m: float, k: float, n: float, batch: float = 1.0):
        f = 2.0 * m * k * n * batch
        b = (m * k + k * n + m * n) * batch * self.dev.dtype_bytes
        self._rate = self.dev.matmul_rate(m, k, n)
        self._add(f, b, compute=True)

    def memory(self, elements: float, passes: float = 2.0):
        """An elementwise / normalisation op over ``elements`` (read + write = 2 passes)."""
        self._add(0.0, elements * passes * self.dev.dtype_bytes, compute=False)

    def attention(self, q_len: float, k_len: float, head_dim: float, heads_x_seqs: float, causal: bool):
        """Fused attention (scores and values, never materialised). FLOPs count the useful work
        (half the score matrix when causal); the time counts the work the kernel does (the
        device's causal block structure, :func:`causal_key_fraction`) at its rate for this head
        dim and key length."""
        full = 4.0 * q_len * k_len * head_dim * heads_x_seqs
        f = full * (0.5 if causal else 1.0)
        done = full * (causal_key_fraction(int(q_len), int(k_len), self.dev.flash_kv_block) if causal else 1.0)
        b = 4 * q_len * head_dim * heads_x_seqs * self.dev.dtype_bytes
        self.flops += f
        self.bytes += b
        self.seconds += max(done / self.dev.attention_rate(head_dim, k_len), b / self.dev.bandwidth) + self.dev.op_overhead_s
        self.ops += 1

    def stream(self, nbytes: float, ops: int = 1):
        """``ops`` memory-bound operators moving ``nbytes`` in all from memory, not the cache:
        for data the stages before evicted (their working sets exceed the last-level cache)."""
        self.bytes += nbytes
        self.seconds += nbytes / self.dev.bandwidth + ops * self.dev.op_overhead_s
        self.ops += ops

    def _add(self, f: float, b: float, compute: bool):
        self.flops += f
        self.bytes += b
        bw = self.dev.memory_bandwidth(b)
        t = max(f / self._rate, b / bw) if compute else b / bw
        self.seconds += t + self.dev.op_overhead_s
        self.ops += 1


def _rms_norm(st: _Stage, rows: float, width: float):
    """Qwen2 RMSNorm as eager PyTorch runs it: pow, mean, (+eps, rsqrt on one value a row),
    x * rsqrt, weight * x -- six operators, seven passes over ``rows x width``."""
    n = rows * width
    st.memory(n)                    # x.pow(2)
    st.memory(n, passes=1.0)        # .mean(-1)
    st.memory(rows)                 # + eps
    st.memory(rows)                 # rsqrt
    st.memory(n)                    # x * rsqrt(...)
    st.memory(n)                    # weight * x


def _rotary(st: _Stage, elements: float):
    """``x * cos + rotate_half(x) * sin`` on one of q / k: mul, neg (half), cat, mul, add."""
    st.memory(elements)             # x * cos
    st.memory(elements / 2)         # -x2
    st.memory(elements)             # cat(-x2, x1)
    st.memory(elements)             # * sin
    st.memory(elements, passes=3.0)  # +


def _linear(st: _Stage, rows: float, k: float, n: float, bias: bool = False):
    """``nn.Linear``; with a bias, CPU ``addmm`` first copies the broadcast bias into the output."""
    if bias:
        st.memory(rows * n, passes=1.0)
    st.matmul(rows, k, n)


def _decoder_layers(st: _Stage, s: Shape, tokens: float, seqs: float, layers: int, kv_cache: bool = False):
    """``layers`` Qwen2 decoder layers over ``seqs`` causal sequences of ``tokens`` each, with
    the operators the eager (HF) implementation issues: small layers are dominated by them.
    ``kv_cache``: the layers also write their keys and values into a KV cache (the prefill does,
    for decoding; the shadow stack does not)."""
    if layers <= 0 or tokens <= 0 or seqs <= 0:
        return
    L = tokens * seqs
    hd = s.hd
    q = s.heads * hd                              # = d, except where head_dim is set apart
    kv = s.kv_heads * hd
    for i in range(layers):
        _rms_norm(st, L, s.d)                     # input RMSNorm
        if i < len(s.layer_kinds) and s.layer_kinds[i] == "linear_attention":
            _gated_delta_net(st, s, L, tokens)    # a hybrid LLM's linear-attention layer
        else:
            _linear(st, L, s.d, q, bias=True)     # q
            _linear(st, L, s.d, kv, bias=True)    # k
            _linear(st, L, s.d, kv, bias=True)    # v
            _rotary(st, L * q)                    # rotary on q
            _rotary(st, L * kv)                   # rotary on k
            if kv_cache:
                st.memory(L * kv)                 # keys into the cache (cat)
                st.memory(L * kv)                 # values into the cache (cat)
            st.attention(tokens, tokens, hd, seqs * s.heads, causal=True)
            _linear(st, L, q, s.d)                # o
        st.memory(L * s.d, passes=3.0)            # residual add
        _rms_norm(st, L, s.d)                     # post-attention RMSNorm
        _linear(st, L, s.d, s.ff)                 # gate
        _linear(st, L, s.d, s.ff)                 # up
        st.memory(L * s.ff)                       # SiLU(gate)
        st.memory(L * s.ff, passes=3.0)           # * up
        _linear(st, L, s.ff, s.d)                 # down
        st.memory(L * s.d, passes=3.0)            # residual add


def _gated_delta_net(st: _Stage, s: Shape, L: float, tokens: float, chunk: int = 64):
    """One Gated DeltaNet layer (Qwen3.5's linear attention) over ``L`` rows: the q/k/v, gate and
    beta/decay projections, a depthwise causal convolution over q/k/v, then the chunked gated
    delta rule -- per head a [dk, dv] state updated and read once a token (three dk x dv
    products) plus the chunk's intra-block products (``chunk`` rows of dk + dv) -- and the gated
    RMSNorm and output projection. Linear in tokens: no attention over the sequence, no KV."""
    kd, vd = s.lin_k_heads * s.lin_dk, s.lin_v_heads * s.lin_dv
    conv = 2 * kd + vd
    _linear(st, L, s.d, conv)                     # in_proj_qkv
    _linear(st, L, s.d, vd)                       # in_proj_z (output gate)
    _linear(st, L, s.d, 2 * s.lin_v_heads)        # in_proj_b, in_proj_a (beta, decay)
    st.memory(L * conv, passes=float(s.lin_conv) + 1.0)   # causal conv1d + SiLU
    f = 2.0 * L * s.lin_v_heads * (3.0 * s.lin_dk * s.lin_dv
                                   + min(chunk, tokens) * (s.lin_dk + s.lin_dv))
    st.matmul(L * s.lin_v_heads, s.lin_dk, s.lin_dv)      # operator time at the matmul rate
    st.flops += max(f - 2.0 * L * s.lin_v_heads * s.lin_dk * s.lin_dv, 0.0)
    st.seconds += max(f - 2.0 * L * s.lin_v_heads * s.lin_dk * s.lin_dv, 0.0) / st._rate
    _rms_norm(st, L, vd)                          # gated RMSNorm
    st.memory(L * vd, passes=3.0)                 # * SiLU(z)
    _linear(st, L, vd, s.d)                       # out_proj


def pool_pack_bytes(kept_tokens: float, rows: float, width: float, dtype_bytes: int, into_out: bool) -> float:
    """Bytes ``pool_pack``'s PyTorch path moves: one ``embedding_bag`` reads every kept token's
    row, an int64 index and a weight for each, an int64 offset for every output row, and writes
    the rows; into ``out`` (the runtime's form) one ``index_copy_`` reads them again, an int64
    row index each, and writes them in place. (The Triton kernels move the token and row bytes
    and a small tile table: the index terms are < 1% at InternVL widths.)"""
    b = kept_tokens * (width * dtype_bytes + 8 + dtype_bytes) + rows * (width * dtype_bytes + 8)
    if into_out:
        b += rows * (2 * width * dtype_bytes + 8)
    return b


# Operators pool_pack's PyTorch path issues, whatever the plan: one embedding_bag over every kept
# token (the plan only changes its index tables, cached per plan), plus one index_copy_ into out.
POOL_PACK_TORCH_OPS = {False: ("aten::embedding_bag",), True: ("aten::embedding_bag", "aten::index_copy_")}


def stage_costs(shape: Shape, visual_tokens: int, text_tokens: int, num_frames: int, device: DeviceSpec,
                kept_frames: Optional[int] = None, router_layers: int = 4, router_pool: int = 1,
                question_tokens: Optional[int] = None, routers: bool = True) -> Dict[str, dict]:
    """Per stage ``{"flops", "bytes", "seconds", "ops"}`` for one request. Compress writes
    into the prompt's embeddings (``pool_pack(..., out=, dest=)``), as the runtime does."""
    kept = num_frames if kept_frames is None else kept_frames
    q = question_tokens if question_tokens is not None else max(1, min(text_tokens, 64))
    out: Dict[str, _Stage] = {
        "vision": _vision_stage(shape, num_frames, device),
        "router": _router_stage(shape, num_frames, q, router_layers, router_pool, device, routers),
        "compress": _compress_stage(shape, kept, visual_tokens, device),
        "prefill": _prefill_stage(shape, visual_tokens + text_tokens, device),
    }
    return {k: dict(flops=v.flops, bytes=v.bytes, seconds=v.seconds, ops=v.ops) for k, v in out.items()}


def _vision_stage(s: Shape, T: int, device: DeviceSpec) -> _Stage:
    """The vision tower over ``T`` frames, then the projector (pixel shuffle / 2x2 merge)."""
    vis = _Stage(device)
    n = s.vis_tokens
    vis.matmul(n * T, s.patch_dim, s.d_vis)             # patch embedding
    for i in range(s.vis_layers):
        _vision_layer(vis, s, n, T, i)
    m = s.tokens_per_frame * T
    mh = s.merge_hidden or s.d
    vis.memory(m * 4 * s.d_vis)                         # pixel shuffle / 2x2 merge + norm
    vis.matmul(m, 4 * s.d_vis, mh)                      # projector fc1
    vis.memory(m * mh)                                  # GELU
    vis.matmul(m, mh, s.d)                              # projector fc2
    return vis


def _vision_layer(vis: _Stage, s: Shape, n: int, T: int, i: int) -> None:
    """Vision layer ``i`` over ``T`` frames of ``n`` tokens: attention (full, or windowed past
    the tower's full layers), then the MLP (gated or not)."""
    heads = s.vis_heads
    hd = s.d_vis // heads
    vis.memory(n * T * s.d_vis)                         # LayerNorm / RMSNorm
    vis.matmul(n * T, s.d_vis, 3 * s.d_vis)             # qkv
    if s.vis_window_tokens and i >= s.vis_full_layers:   # window attention
        w = s.vis_window_tokens
        vis.attention(w, w, hd, T * heads * math.ceil(n / w), causal=False)
    else:
        vis.attention(n, n, hd, T * heads, causal=False)
    vis.matmul(n * T, s.d_vis, s.d_vis)                 # proj
    vis.memory(n * T * s.d_vis, passes=3.0)             # layer scale + residual
    vis.memory(n * T * s.d_vis)                         # LayerNorm / RMSNorm
    if s.vis_gated_mlp:
        vis.matmul(n * T, s.d_vis, s.vis_ff)            # gate
        vis.matmul(n * T, s.d_vis, s.vis_ff)            # up
        vis.memory(n * T * s.vis_ff)                    # SiLU(gate)
        vis.memory(n * T * s.vis_ff, passes=3.0)        # * up
    else:
        vis.matmul(n * T, s.d_vis, s.vis_ff)            # fc1
        vis.memory(n * T * s.vis_ff)                    # GELU
    vis.matmul(n * T, s.vis_ff, s.d_vis)                # fc2 / down
    vis.memory(n * T * s.d_vis, passes=3.0)             # residual


def _router_stage(s: Shape, T: int, q: int, router_layers: int, router_pool: int,
                  device: DeviceSpec, routers: bool) -> _Stage:
    """The Shadow Stack over each frame's ``[Z_t; question]`` and over the question, plus the
    Image Router's heads; nothing when the plan routes nothing."""
    rt = _Stage(device)
    if routers:
        per_frame = math.ceil(s.tokens_per_frame / (router_pool * router_pool)) + q
        _decoder_layers(rt, s, per_frame, T, router_layers)       # H_vq for every frame
        _decoder_layers(rt, s, q, 1, router_layers)               # H_q
        r = 256 if s.d <= 1024 else 1024                          # Image Router width
        rt.matmul(T * q, s.d, r)
        rt.matmul(T * q, r, 3 * r)
        rt.matmul(T * q, r, r)
        rt.matmul(T * q, r, 8 * r)
    return rt


def _compress_stage(s: Shape, kept: int, visual_tokens: int, device: DeviceSpec) -> _Stage:
    """``pool_pack`` over the ``kept`` frames' tokens into ``visual_tokens`` rows of the
    prompt's embeddings."""
    cp = _Stage(device)
    # The embedding_bag: its input was written by the vision stage and the router's working set
    # (layers, activations) has evicted it since, so it streams from memory. pack_call_s
    # (measured) holds the call's host cost, including the embedding_bag's dispatch.
    kept_tokens = kept * s.tokens_per_frame
    bag = pool_pack_bytes(kept_tokens, visual_tokens, s.d, device.dtype_bytes, into_out=False)
    cp.stream(bag, ops=1)
    cp.seconds += max(0.0, device.pack_call_s - device.op_overhead_s)   # its dispatch counted once
    # then index_copy_ into the prompt's embeddings
    nb = pool_pack_bytes(kept_tokens, visual_tokens, s.d, device.dtype_bytes, into_out=True) - bag
    cp.bytes += nb
    cp.seconds += max(nb / device.bandwidth, visual_tokens * device.index_copy_row_s
                      + visual_tokens * s.d * device.index_copy_element_s) + device.op_overhead_s
    cp.ops += 1
    return cp


def _prefill_stage(s: Shape, L: int, device: DeviceSpec) -> _Stage:
    """The LLM over ``L`` = text + visual tokens, and the LM head for the last position."""
    pf = _Stage(device)
    pf.memory(L * s.d)                                  # embedding gather
    _decoder_layers(pf, s, L, 1, s.layers, kv_cache=True)
    _rms_norm(pf, L, s.d)                               # final norm
    pf.matmul(1, s.d, s.vocab)                          # LM head, last position
    return pf


def predict_ttft(config: Union[str, dict, Shape], visual_tokens: int, text_tokens: int, num_frames: int,
                 device: Union[str, DeviceSpec] = "h100", **kw) -> dict:
    """Predicted TTFT and its stages for one request (see :func:`stage_costs` for ``kw``:
    ``kept_frames``, ``router_layers``, ``router_pool``, ``question_tokens``, ``routers``)."""
    shape = config if isinstance(config, Shape) else load_shape(config)
    dev = DEVICES[device] if isinstance(device, str) else device
    st = stage_costs(shape, visual_tokens, text_tokens, num_frames, dev, **kw)
    stages = {k: v["seconds"] for k, v in st.items()}
    return dict(device=dev.to_dict(), stages_s=stages, ttft_s=sum(stages.values()), detail=st,
                label=dev.label)


# ------------------------------------------------------------------------- weights, decode, memory

def decoder_layer_params(shape: Shape) -> int:
    """Parameters of one Qwen2 decoder layer (InternVL3's and Qwen2.5-VL's LLM): q / k / v with
    biases, o without, gate / up / down, two RMSNorm weights. The shadow stack is ``k`` of them."""
    s = shape
    q, kv = s.heads * s.hd, s.kv_heads * s.hd
    return (s.d * q + q) + 2 * (s.d * kv + kv) + q * s.d + 3 * s.d * s.ff + 2 * s.d


def shadow_stack_bytes(shape: Shape, layers: int = 4, dtype_bytes: int = 2) -> int:
    """Weights of the routers' shadow stack (a separate, Stage-1-trained copy of the first
    ``layers`` decoder layers): 1.86e9 bytes (1.74 GiB) in bf16 at InternVL3-8B's shape."""
    return layers * decoder_layer_params(shape) * dtype_bytes


def kv_cache_bytes(shape: Shape, tokens: int, dtype_bytes: int = 2, layers: Optional[int] = None) -> int:
    """Keys and values of ``tokens`` positions in ``layers`` (default: all) decoder layers."""
    s = shape
    kv = s.kv_heads * s.hd
    n = s.layers if layers is None else layers
    if s.layer_kinds:   # a hybrid LLM: only its full-attention layers keep keys and values
        n = sum(1 for k in s.layer_kinds[:n] if k != "linear_attention")
    return n * 2 * tokens * kv * dtype_bytes


def decode_step_costs(shape: Shape, context_tokens: int, device: Union[str, DeviceSpec] = "h100",
                      batch: int = 1) -> dict:
    """One greedy decode step of ``batch`` rows, each over ``context_tokens`` cached positions:
    every decoder weight and the LM head read once (the rows share them), each row's KV cache
    read and its new keys and values written, one embedding row gathered; FLOPs: 2 per weight
    per row (the matmuls) plus attention (2 x context x d for the scores and 2 x context x d
    for the values, per layer and row). -> {"flops", "bytes", "seconds"}: the floor
    max(FLOPs / rate, bytes / bandwidth), no per-operator cost (a graph-captured step)."""
    s = shape
    dev = DEVICES[device] if isinstance(device, str) else device
    db = dev.dtype_bytes
    weights = s.layers * decoder_layer_params(s) + s.d + s.vocab * s.d   # layers, norm, LM head
    kv = s.kv_heads * s.hd
    flops = batch * (2.0 * weights + s.layers * 4.0 * context_tokens * s.d)
    nbytes = db * (weights + batch * (kv_cache_bytes(s, context_tokens, 1) + s.layers * 2 * kv + s.d))
    return dict(flops=flops, bytes=nbytes, seconds=max(flops / dev.flops, nbytes / dev.bandwidth))


def prefill_activation_bytes(shape: Shape, tokens: int, dtype_bytes: int = 2,
                             kv_cache: bool = True, layers: Optional[int] = None) -> int:
    """A rough floor of a decoder pass's activation memory over ``tokens`` positions: its KV
    cache (all ``layers``) when it keeps one, plus the largest transient of one layer -- the
    residual stream, the layer input's norm and the MLP's gate, up and their product
    (3 x tokens x ff) -- with fused attention (no score matrix). A model, not a measurement."""
    s = shape
    transient = tokens * (3 * s.d + 3 * s.ff) * dtype_bytes
    return (kv_cache_bytes(s, tokens, dtype_bytes, layers) if kv_cache else 0) + transient


__all__ = ["DeviceSpec", "DEVICES", "cpu_device", "Shape", "load_shape", "stage_costs", "predict_ttft",
           "causal_key_fraction", "pool_pack_bytes", "POOL_PACK_TORCH_OPS", "CPU_FLASH_KV_BLOCK",
           "decoder_layer_params", "shadow_stack_bytes", "kv_cache_bytes", "decode_step_costs",
           "prefill_activation_bytes"]
