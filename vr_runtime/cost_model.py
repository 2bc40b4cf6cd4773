"""A cost model of VideoRouter's time to first token: per-stage FLOPs, bytes and a time floor.

    from vr_runtime.cost_model import predict_ttft, DEVICES, cpu_device
    pred = predict_ttft("vr_runtime/configs/internvl3_8b.json", visual_tokens=6000, text_tokens=180,
                        num_frames=64, device=DEVICES["h100"])
    pred["stages_s"]  # {"vision": ..., "router": ..., "compress": ..., "prefill": ...}; pred["ttft_s"]

Stages, as the runtime times them (SPEC 3: TTFT = vision + router + compress + prefill):

* ``vision``   the InternViT tower over every sampled frame (``image_size/patch`` squared patches
               plus CLS, full attention) and the projector (pixel shuffle 0.5, LayerNorm, two
               linears) -> 256 tokens of width D per frame;
* ``router``   the Shadow Stack (the first ``k`` decoder layers of the LLM) over each frame's
               ``[Z_t; question]`` (frames pooled by ``router_pool`` first) and over the question,
               plus the two small router heads; 0 for the baselines that route nothing;
* ``compress`` ``pool_pack``: reads the kept frames' tokens, writes the visual tokens;
* ``prefill``  the LLM over ``text + visual`` tokens (causal attention) and the LM head for the
               last position.

Attention is counted as its two matmuls (scores, values; half of each when causal); the score
matrix is assumed never materialised (fused attention: flash / SDPA kernels on GPU and CPU).

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
    # Optional ((head_dim, FLOP/s), ...): the fused attention kernel's rate by head dim (on a CPU
    # it is far below the matmul rate); None: attention runs at ``flops``.
    attention_rates: Optional[tuple] = None
    # Optional: bandwidth of data that fits in the last-level cache (an op touching at most
    # ``cache_bytes``); None: every op streams from memory at ``bandwidth``.
    cache_bandwidth: Optional[float] = None
    cache_bytes: float = 0.0
    # Fixed host cost of one pool_pack call (argument checks, the tile-table cache, dispatch):
    # measured on a CPU by cpu_device(); 0 in the nominal GPU specs (not measured here).
    pack_call_s: float = 0.0

    def memory_bandwidth(self, nbytes: float) -> float:
        if self.cache_bandwidth and nbytes <= self.cache_bytes:
            return self.cache_bandwidth
        return self.bandwidth

    def attention_rate(self, head_dim: float) -> float:
        if not self.attention_rates:
            return self.flops
        return _interp(self.attention_rates, head_dim)

    def matmul_rate(self, m: float, k: float, n: float) -> float:
        if not self.matmul_rates:
            return self.flops
        return _interp(self.matmul_rates, max(1.0, min(m, k, n)))

    def to_dict(self) -> dict:
        return asdict(self)


def _interp(pts: tuple, w: float) -> float:
    """Piecewise linear in log(w) through ``pts`` ((w, rate), ...); proportional below the first."""
    if w <= pts[0][0]:
        return pts[0][1] * w / pts[0][0]
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


def cpu_device(threads: int = 1, dtype_bytes: int = 4, reps: int = 7) -> DeviceSpec:
    """This CPU, calibrated: fp32 matmul rates by width ([1024, w] @ [w, w] for w = 16 .. 1024),
    elementwise bandwidth (an add over 64 MB) and the fixed cost of a small operator, each the
    median of ``reps`` (medians, as the stage times it is compared with: on a shared machine the
    best of a few runs is a quiet moment the stages never see)."""
    import torch
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rates = []
        for w in (16, 32, 64, 128, 256, 512, 1024):
            a, b = torch.randn(1024, w), torch.randn(w, w)
            best = _median(lambda: a @ b, reps)
            rates.append((w, 2 * 1024 * w * w / best))
        flops = max(r for _, r in rates)
        x = torch.randn(8 * 2**20)
        y = torch.empty_like(x)
        best = _median(lambda: torch.add(x, 1.0, out=y), reps)
        bw = 2 * x.numel() * 4 / best
        xs = torch.randn(256 * 1024)       # 1 MB: stays in cache
        ys = torch.empty_like(xs)
        cbw = 2 * xs.numel() * 4 / _median(lambda: torch.add(xs, 1.0, out=ys), reps * 3)
        att = []
        for hd in (16, 32, 64, 128):
            qkv = torch.randn(3, 1, 4, 1024, hd)
            best = _median(lambda: torch.nn.functional.scaled_dot_product_attention(*qkv), reps)
            att.append((hd, 4 * 4 * 1024 * 1024 * hd / best))
        s = torch.randn(8, 8)
        best = _median(lambda: [s.add(1.0) for _ in range(100)], reps) / 100
        from vr_kernels import pool_pack
        z = torch.randn(4, 256, 8)      # a call with next to no data: its fixed cost
        pack = _median(lambda: pool_pack(z, [1, 2, 4, 0], (16, 16), backend="torch"), reps * 3)
    finally:
        torch.set_num_threads(prev)
    return DeviceSpec(f"CPU ({threads} thread{'s' if threads > 1 else ''}, calibrated)", flops, bw, best,
                      dtype_bytes, "CPU calibrated", tuple(rates), tuple(att), cbw, 4 * 2**20, pack)


def _median(fn, reps: int) -> float:
    fn()
    ts = sorted(_timed(fn) for _ in range(reps))
    return ts[len(ts) // 2]


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ------------------------------------------------------------------------- shapes

@dataclass(frozen=True)
class Shape:
    """The dimensions the model needs, read from an InternVL (HF) config."""
    d_vis: int
    vis_heads: int
    vis_layers: int
    vis_ff: int
    vis_tokens: int         # patches + CLS per frame
    tokens_per_frame: int   # after pixel shuffle (256 for 448 / 14 / 2)
    d: int
    layers: int
    heads: int
    kv_heads: int
    ff: int
    vocab: int


def load_shape(config: Union[str, dict]) -> Shape:
    """``config``: a path to an HF ``config.json`` (or a directory holding one), or its dict."""
    if isinstance(config, (str, os.PathLike)):
        path = os.path.join(config, "config.json") if os.path.isdir(config) else config
        with open(path) as f:
            config = json.load(f)
    v, t = config["vision_config"], config["text_config"]
    img = v.get("image_size", 448)
    patch = v.get("patch_size", 14)
    img = img[0] if isinstance(img, (list, tuple)) else img
    patch = patch[0] if isinstance(patch, (list, tuple)) else patch
    side = img // patch
    ratio = config.get("downsample_ratio", 0.5)
    return Shape(d_vis=v["hidden_size"], vis_heads=v.get("num_attention_heads", 16), vis_layers=v["num_hidden_layers"], vis_ff=v["intermediate_size"],
                 vis_tokens=side * side + 1, tokens_per_frame=int(side * ratio) ** 2,
                 d=t["hidden_size"], layers=t["num_hidden_layers"], heads=t["num_attention_heads"],
                 kv_heads=t.get("num_key_value_heads", t["num_attention_heads"]), ff=t["intermediate_size"],
                 vocab=t["vocab_size"])


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
        """Fused attention (scores and values, never materialised); half the work when causal."""
        f = 4.0 * q_len * k_len * head_dim * heads_x_seqs * (0.5 if causal else 1.0)
        b = 4 * q_len * head_dim * heads_x_seqs * self.dev.dtype_bytes
        self.flops += f
        self.bytes += b
        self.seconds += max(f / self.dev.attention_rate(head_dim), b / self.dev.bandwidth) + self.dev.op_overhead_s
        self.ops += 1

    def _add(self, f: float, b: float, compute: bool):
        self.flops += f
        self.bytes += b
        bw = self.dev.memory_bandwidth(b)
        t = max(f / self._rate, b / bw) if compute else b / bw
        self.seconds += t + self.dev.op_overhead_s
        self.ops += 1


def _decoder_layers(st: _Stage, s: Shape, tokens: float, seqs: float, layers: int):
    """``layers`` Qwen2 decoder layers over ``seqs`` causal sequences of ``tokens`` each."""
    if layers <= 0 or tokens <= 0 or seqs <= 0:
        return
    L = tokens * seqs
    hd = s.d // s.heads
    kv = s.kv_heads * hd
    for _ in range(layers):
        st.memory(L * s.d)                        # input RMSNorm
        st.matmul(L, s.d, s.d + 2 * kv)           # q, k, v
        st.memory(L * (s.d + kv))                 # rotary on q, k
        st.attention(tokens, tokens, hd, seqs * s.heads, causal=True)
        st.matmul(L, s.d, s.d)                    # o
        st.memory(L * s.d, passes=3.0)            # residual add
        st.memory(L * s.d)                        # post-attention RMSNorm
        st.matmul(L, s.d, 2 * s.ff)               # gate, up
        st.memory(L * s.ff, passes=3.0)           # SiLU(gate) * up
        st.matmul(L, s.ff, s.d)                   # down
        st.memory(L * s.d, passes=3.0)            # residual add


def stage_costs(shape: Shape, visual_tokens: int, text_tokens: int, num_frames: int, device: DeviceSpec,
                kept_frames: Optional[int] = None, router_layers: int = 4, router_pool: int = 1,
                question_tokens: Optional[int] = None, routers: bool = True) -> Dict[str, dict]:
    """Per stage ``{"flops", "bytes", "seconds", "ops"}`` for one request."""
    s = shape
    kept = num_frames if kept_frames is None else kept_frames
    q = question_tokens if question_tokens is not None else max(1, min(text_tokens, 64))
    out: Dict[str, dict] = {}

    vis = _Stage(device)
    n, T = s.vis_tokens, num_frames
    vis.matmul(n * T, 3 * 14 * 14, s.d_vis)             # patch embedding
    heads = s.vis_heads
    hd = s.d_vis // heads
    for _ in range(s.vis_layers):
        vis.memory(n * T * s.d_vis)                     # LayerNorm
        vis.matmul(n * T, s.d_vis, 3 * s.d_vis)         # qkv
        vis.attention(n, n, hd, T * heads, causal=False)
        vis.matmul(n * T, s.d_vis, s.d_vis)             # proj
        vis.memory(n * T * s.d_vis, passes=3.0)         # layer scale + residual
        vis.memory(n * T * s.d_vis)                     # LayerNorm
        vis.matmul(n * T, s.d_vis, s.vis_ff)            # fc1
        vis.memory(n * T * s.vis_ff)                    # GELU
        vis.matmul(n * T, s.vis_ff, s.d_vis)            # fc2
        vis.memory(n * T * s.d_vis, passes=3.0)         # residual
    m = s.tokens_per_frame * T
    vis.memory(m * 4 * s.d_vis)                         # pixel shuffle + LayerNorm
    vis.matmul(m, 4 * s.d_vis, s.d)                     # projector fc1
    vis.memory(m * s.d)                                 # GELU
    vis.matmul(m, s.d, s.d)                             # projector fc2
    out["vision"] = vis

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
    out["router"] = rt

    cp = _Stage(device)
    cp.memory(kept * s.tokens_per_frame * s.d + visual_tokens * s.d, passes=1.0)
    cp.seconds += device.pack_call_s
    out["compress"] = cp

    pf = _Stage(device)
    L = visual_tokens + text_tokens
    pf.memory(L * s.d)                                  # embedding gather
    _decoder_layers(pf, s, L, 1, s.layers)
    pf.memory(L * s.d)                                  # final norm
    pf.matmul(1, s.d, s.vocab)                          # LM head, last position
    out["prefill"] = pf
    return {k: dict(flops=v.flops, bytes=v.bytes, seconds=v.seconds, ops=v.ops) for k, v in out.items()}


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


__all__ = ["DeviceSpec", "DEVICES", "cpu_device", "Shape", "load_shape", "stage_costs", "predict_ttft"]
