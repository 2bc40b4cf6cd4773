"""The TTFT cost model: shapes from the shipped configs, stage arithmetic, monotonicity."""
import dataclasses
import os

import pytest

from vr_runtime.planning.cost_model import DEVICES, DeviceSpec, load_shape, predict_ttft, stage_costs

CFG = os.path.join(os.path.dirname(__file__), "..", "..", "vr_runtime", "configs", "internvl3_8b.json")


def test_shape_of_the_8b_config():
    s = load_shape(CFG)
    assert (s.d, s.layers, s.heads, s.kv_heads, s.ff) == (3584, 28, 28, 4, 18944)
    assert (s.d_vis, s.vis_layers, s.vis_tokens, s.tokens_per_frame) == (1024, 24, 1025, 256)


def test_shape_of_the_qwen_7b_config():
    # Qwen2.5-VL-7B's public config (flat layout): the backbone reads its own dimensions.
    s = load_shape(os.path.join(os.path.dirname(CFG), "qwen2_5_vl_7b.json"))
    assert (s.d, s.layers, s.heads, s.kv_heads, s.ff, s.vocab) == (3584, 28, 28, 4, 18944, 152064)
    assert (s.d_vis, s.vis_heads, s.vis_layers, s.vis_ff) == (1280, 16, 32, 3420)
    assert (s.vis_tokens, s.tokens_per_frame, s.patch_dim) == (1024, 256, 3 * 2 * 14 * 14)
    assert (s.vis_gated_mlp, s.vis_window_tokens, s.vis_full_layers, s.merge_hidden) == \
        (True, 64, 4, 4 * 1280)
    # window attention: the tower's attention FLOPs are those of 4 full + 28 windowed layers
    dev = DeviceSpec("unit", 1e15, 1e15)
    full = stage_costs(dataclasses.replace(s, vis_window_tokens=0), 256, 10, 1, dev, routers=False)
    win = stage_costs(s, 256, 10, 1, dev, routers=False)
    hd, n = s.d_vis // s.vis_heads, s.vis_tokens
    per_layer_full = 2 * 2 * n * n * hd * s.vis_heads
    per_layer_win = 2 * 2 * n * 64 * hd * s.vis_heads
    assert full["vision"]["flops"] - win["vision"]["flops"] == pytest.approx(
        28 * (per_layer_full - per_layer_win), rel=1e-9)


def test_prefill_flops_match_the_closed_form():
    s = load_shape(CFG)
    dev = DeviceSpec("unit", 1e15, 1e15)
    L = 1000
    st = stage_costs(s, visual_tokens=L - 100, text_tokens=100, num_frames=4, device=dev, routers=False)
    hd = s.d // s.heads
    per_layer = 2 * L * (s.d * (s.d + 2 * s.kv_heads * hd) + s.d * s.d + 3 * s.d * s.ff) + 2 * L * L * s.d
    assert st["prefill"]["flops"] == pytest.approx(s.layers * per_layer + 2 * s.d * s.vocab, rel=1e-9)
    assert st["router"]["flops"] == 0


def test_predictions_grow_with_tokens_and_frames():
    a = predict_ttft(CFG, 4000, 180, 64, "h100")
    b = predict_ttft(CFG, 8000, 180, 64, "h100")
    c = predict_ttft(CFG, 8000, 180, 32, "h100")
    assert a["stages_s"]["prefill"] < b["stages_s"]["prefill"]
    assert c["stages_s"]["vision"] < b["stages_s"]["vision"]
    assert b["ttft_s"] == pytest.approx(sum(b["stages_s"].values()))
    assert predict_ttft(CFG, 8000, 180, 64, "h200")["ttft_s"] <= b["ttft_s"]
    assert set(DEVICES) >= {"h100", "h200"} and b["label"] == "model"


# ------------------------------------------------------------ what the CPU paths really issue

import collections  # noqa: E402
import random  # noqa: E402

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from vr_runtime.planning import cost_model as cm  # noqa: E402


def _causal_work_loop(q_len, k_len, kv_block):
    """Plain reference: walk the CPU flash kernel's loops (query blocks, then every key block
    that starts before the query block's last visible key), counting score entries computed."""
    q_block = 256 if q_len >= 768 else 64 if q_len >= 192 else 32
    work = 0
    for m in range(0, q_len, q_block):
        rows = min(q_block, q_len - m)
        last = m + rows + (k_len - q_len)        # keys visible to the block's last query
        for n in range(0, k_len, kv_block):
            if n < last:
                work += rows * min(kv_block, k_len - n)
    return work / (q_len * k_len)


def test_causal_key_fraction_matches_the_kernel_loops():
    rng = random.Random(5)
    sizes = [(1, 1), (17, 17), (272, 272), (512, 512), (513, 513), (1024, 1024), (1624, 1624), (2048, 2048),
             (7, 300)] + [(n, n) for n in (rng.randint(2, 3000) for _ in range(8))]
    for q, k in sizes:
        assert cm.causal_key_fraction(q, k, 512) == pytest.approx(_causal_work_loop(q, k, 512), rel=1e-12), (q, k)
    assert cm.causal_key_fraction(300, 300, 512) == 1.0        # one key block: no saving
    assert cm.causal_key_fraction(1024, 1024, 512) == pytest.approx(0.75)
    assert cm.causal_key_fraction(999, 999, 0) == 0.5           # ideal (GPU spec)
    assert 0.5 < cm.causal_key_fraction(20000, 20000, 512) < 0.52


_VIEWS = {"aten::reshape", "aten::view", "aten::_reshape_alias", "aten::as_strided", "aten::detach",
          "aten::alias", "aten::lift_fresh"}


def _top_level_ops(fn):
    with profile(activities=[ProfilerActivity.CPU]) as p:
        fn()
    return [e.name for e in p.events() if e.cpu_parent is None and e.name not in _VIEWS]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pool_pack_torch_ops_and_bytes_match_the_cpu_path(seed):
    """The compress stage's operators are what a profiler sees pool_pack's PyTorch path issue,
    whatever the plan (odd grids, pair windows, dropped frames), and its bytes are those of the
    index tables and rows that path builds."""
    from vr_kernels import pool_pack, pooled_counts
    from vr_kernels.checks import check_schedule
    from vr_kernels.torch_pool import bag_indices
    rng = random.Random(seed)
    H, W, D, T = rng.randint(3, 9), rng.randint(3, 9), rng.choice([5, 24, 33]), rng.randint(2, 6)
    scales = [rng.choice([0, 1, 2, 3, (1, 2), (3, 2)]) for _ in range(T)]
    scales[0] = 1                                    # at least one kept frame
    frames = torch.randn(T, H * W, D)
    counts = pooled_counts(scales, (H, W))
    rows = sum(counts)
    dest, r = [], 3
    for c in counts:
        dest.append(r)
        r += c
    embeds = torch.zeros(r + 2, D)
    with torch.inference_mode():
        for into in (False, True):
            kw = dict(out=embeds, dest=dest) if into else {}
            pool_pack(frames, scales, (H, W), backend="torch", **kw)      # builds the cached tables
            ops = _top_level_ops(lambda: pool_pack(frames, scales, (H, W), backend="torch", **kw))
            assert tuple(ops) == cm.POOL_PACK_TORCH_OPS[into], (scales, ops)
    idx, offsets = bag_indices(check_schedule(scales, T, (H, W)), H * W)
    kept = sum(H * W for s in scales if s != 0)
    assert (idx.size, offsets.size) == (kept, rows)
    real = idx.size * (D * 4 + 8 + 4) + offsets.size * 8 + rows * D * 4     # table rows, idx, weights, offsets, out
    assert cm.pool_pack_bytes(kept, rows, D, 4, into_out=False) == real
    assert cm.pool_pack_bytes(kept, rows, D, 4, into_out=True) == real + rows * (2 * D * 4 + 8)


def _layer_ops_seen(layers, use_cache):
    from transformers import Qwen2Config, Qwen2Model
    torch.manual_seed(0)
    m = Qwen2Model(Qwen2Config(hidden_size=48, intermediate_size=80, num_hidden_layers=layers,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=32)).eval()
    x = torch.randn(2, 13, 48)
    counted = {"aten::mm", "aten::addmm", "aten::add", "aten::mul", "aten::cat", "aten::pow", "aten::mean",
               "aten::rsqrt", "aten::neg", "aten::silu", "aten::_scaled_dot_product_flash_attention_for_cpu"}
    with torch.inference_mode():
        m(inputs_embeds=x, use_cache=use_cache)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
            m(inputs_embeds=x, use_cache=use_cache)
    c = collections.Counter()
    for e in p.events():
        # data-moving copies only (addmm's bias broadcast), not scalar bookkeeping
        if e.name in counted or (e.name == "aten::copy_" and e.input_shapes and len(e.input_shapes[0]) > 0):
            c[e.name] += 1
    return c


@pytest.mark.parametrize("use_cache", [False, True])
def test_decoder_layer_operators_match_the_eager_qwen2_layer(use_cache):
    """Operators per decoder layer (layers 2 minus layers 1, so per-forward work cancels) as
    the profiler counts them in transformers' eager Qwen2, against the model's count."""
    a, b = _layer_ops_seen(1, use_cache), _layer_ops_seen(2, use_cache)
    seen = sum(b.values()) - sum(a.values())
    shape = cm.Shape(d_vis=8, vis_heads=1, vis_layers=1, vis_ff=8, vis_tokens=5, tokens_per_frame=4, d=48,
                     layers=2, heads=4, kv_heads=2, ff=80, vocab=32)
    per = []
    for layers in (1, 2):
        st = cm._Stage(DeviceSpec("unit", 1e12, 1e12))
        cm._decoder_layers(st, shape, 13, 2, layers, kv_cache=use_cache)
        per.append(st.ops)
    assert per[1] - per[0] == seen, (dict(b - a), per)
